"""The worker pool: consume runs, execute them with bounded concurrency, acknowledge with status
events on the acks topic, commit offsets of finished work only.

Offsets and at-least-once
-------------------------
A committed offset is a promise that every run before it is finished. The pool keeps that
promise with manual commits of a per-partition *contiguous watermark*
(:class:`~jobwheel.consumers.worker.tracking.OffsetTracker`): a run's offset counts as done only
when the run reached a terminal state **and its status event was acknowledged by the broker**
(SUCCEEDED, FAILED, STALE; a bad record counts as done once logged). The broker's acknowledgement
marks the offset done right in the producer's delivery report, so that rule costs no round trip
through the event loop. The watermark is the first offset still pending, so a long run holds back
commits of its partition while shorter runs behind it finish. Watermarks that moved are committed
every ``JOBWHEEL_WORKER_COMMIT_INTERVAL_MS`` (100 ms), asynchronously, and every watermark again
every ``COMMIT_REFRESH_S`` (5 s), moved or not: a commit the broker did not take is sent again.

Consequences:

* A crash (SIGKILL, OOM, lost node) loses nothing: every run without a delivered terminal
  event is re-delivered to the partition's next owner. Runs finished within the last commit
  interval are re-delivered too (at-least-once); event ids are deterministic
  (``run_id:attempt:STATE``) so readers dedupe.
* Why not commit on fetch (at-most-once) or after execution but before the event? The scheduler
  learns the outcome only from the event; an offset committed before the event is delivered can
  lose the run for good if the process dies in between.
* Runs done past the watermark (behind a longer one still running) go with every commit as
  its metadata, and the partition's next owner skips them: after a rebalance or a crash only
  the runs that were executing (and those finished within the last commit interval) are
  delivered again, not every run finished after the oldest one in flight.
* On revoke (a rebalance moves a partition away: a worker joins or leaves) no run of the
  partition starts any more; its runs executing get the grace period
  (``JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS``) to finish and have their verdicts acknowledged, and
  those still running then are handed back (FAILED, "worker shutdown": the scheduler dispatches
  the next attempt at once). Then the watermark and the runs done past it are committed, and
  the commit is confirmed (bounded) before the partition moves. Fetched runs never started are
  left to the new owner. So a deploy or a scale-out runs nothing twice under the same attempt.
* A partition holding ``TRACKED_LIMIT`` (10,000) offsets behind an unfinished run is paused
  until half of them are done: a long run bounds what the partition keeps, not the runs rate.
* The scheduler's visibility timeout is the second safety net: a run whose worker is gone
  stops heartbeating and is re-dispatched with attempt + 1, whether or not any offset moves.

Events of a run
---------------
A run that finishes within ``JOBWHEEL_WORKER_STARTED_EVENT_MS`` (100 ms) sends one record, its
SUCCEEDED or FAILED, carrying ``started_ms``; a longer one sends STARTED when that time has
passed (stamped with its real start), and one that starts in the second half of its visibility
timeout sends it at once (:func:`.execution._late`); then HEARTBEATs every third of its
visibility timeout, then its verdict. All of a run's records are produced from the event loop
in that order, so none overtakes another.

Duplicates and stale attempts
-----------------------------
* The same ``(run_id, attempt)`` delivered again while it is waiting, running, or finished but
  not yet acknowledged is not executed twice; its offset is completed with that execution.
* An attempt lower than the latest one seen for the run, or a fencing token lower than the
  highest seen for the run (bounded LRU), is dropped with a STALE event: the scheduler has
  moved on. Both checks are per run, so a forged or corrupt record cannot stop other jobs.

Concurrency and shutdown
------------------------
At most ``concurrency`` runs execute at once. Async tasks run as one asyncio task each on the
pool's event loop; sync tasks run in a thread pool of the same size and report back in batches
(one loop wake-up for however many finished meanwhile). When the local backlog is full the pool
pauses its partitions but keeps polling, so long runs never make it miss
``max.poll.interval.ms`` and drop out of the group. Scale out by starting more processes in the
same consumer group.

``stop()`` (SIGTERM/SIGINT) stops fetching, waits up to the grace period for running runs, then
hands the rest back with FAILED ``retry_delay_ms=0`` reason "worker shutdown" (the scheduler
re-dispatches at once instead of waiting out the visibility timeout). Then the broker gets
``CLOSE_TIMEOUT_S`` (10 s) in total to acknowledge the verdicts, take the final commit and let
the worker leave the group; with the broker unreachable librdkafka would block those for as long
as it is down, so the worker gives up, logs one line saying what the broker did not get, and
exits (``left_undone``: the CLI exits 1). The rule above still holds: whatever was not committed
is delivered again to another worker. A second ``stop()`` cuts the grace period short and the
wait for the broker to ``HURRIED_CLOSE_S`` (1 s).
"""

from __future__ import annotations

from jobwheel.consumers.worker.pooling.core import (
    CLOSE_TIMEOUT_S,
    FETCH_BATCH,
    FULL_WAIT_S,
    HAND_BACK_TIMEOUT_S,
    HURRIED_CLOSE_S,
    LAG_SAMPLE_S,
    POLL_TIMEOUT_S,
    SWEEP_INTERVAL_S,
    default_worker_id,
)
from jobwheel.consumers.worker.pooling.execution import Execution
from jobwheel.consumers.worker.pooling.intake import Intake
from jobwheel.consumers.worker.pooling.undecodable import Undecodable
from jobwheel.consumers.worker.pooling.verdicts import Verdicts

__all__ = [
    "CLOSE_TIMEOUT_S",
    "FETCH_BATCH",
    "FULL_WAIT_S",
    "HAND_BACK_TIMEOUT_S",
    "HURRIED_CLOSE_S",
    "LAG_SAMPLE_S",
    "POLL_TIMEOUT_S",
    "SWEEP_INTERVAL_S",
    "WorkerPool",
    "default_worker_id",
]


class WorkerPool(Intake, Undecodable, Execution, Verdicts):
    """Runs the tasks of the runs topic's assigned partitions; see the module docstring.
    Its parts: :mod:`jobwheel.consumers.worker.pooling` (intake, undecodable records,
    execution, verdicts) on a shared core."""
