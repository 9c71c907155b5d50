"""The one home of jobwheel's Kafka plumbing, shared by every part (it is kernel: schemas and
the kernel only below it).

- :mod:`~jobwheel.kafka.errors`: ``KafkaError`` / ``KafkaException`` -> :mod:`jobwheel.errors`
  (one translation, the librdkafka error name as ``.code``), client error and log callbacks;
- :mod:`~jobwheel.kafka.producer`: producer config (defaults, the ``JOBWHEEL_KAFKA_CONFIG``
  pass-through, overrides) and the producer with its delivery-callback bridge;
- :mod:`~jobwheel.kafka.consumer`: messages as records, cached lag, the config of a consumer
  that commits finished work only, the group consumer of the worker and the status sink;
- :mod:`~jobwheel.kafka.reader`: reading chosen partitions from an offset or a time (the SDK's
  ``wait``, the dead-letter listing);
- :mod:`~jobwheel.kafka.admin`: topic provisioning, group configs and positions, the
  scheduler's progress, SCRAM users and ACLs, the admin client of every command.

Besides this package, only the scheduler's transactional clients (``streams/kafka.py``, built
on these pieces) import ``confluent_kafka``. tests/unit/test_layering.py checks it.
"""
