"""The status API's routes, one :class:`fastapi.APIRouter` per resource, each made by a function
of the pieces it needs (settings, the store, the JobClient holder, the SQL runner, the pools'
reader, the sink). :func:`jobwheel.consumers.status.api.create_app` builds those pieces and
includes the routers in this order, which is the order of matching:

- :mod:`.jobs`: ``POST /jobs``, the commands on a job, the job reads, ``GET /jobs``,
  ``/stats/states``
- :mod:`.runs`: ``GET /runs/{id}``
- :mod:`.deadletters`: ``GET /dead-letters``, ``POST /dead-letters/replay``
- :mod:`.sql`: ``POST /sql``
- :mod:`.pools`: ``GET /queues``, ``GET /workers``
- :mod:`.health`: ``GET /health``

The request and response bodies are in :mod:`.models`. The bearer-token check is the app's
middleware (:class:`jobwheel.consumers.status.api.BearerAuth`), in front of every router.
"""
