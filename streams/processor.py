"""The scheduler's decisions for one partition, as a pure processor.

No Kafka, no clock: the engine (:mod:`jobwheel.streams.engine`) hands it decoded records and the
current time, and it returns what to produce. State lives in the injected :class:`PartitionState`,
whose job records also derive the timing wheels. This is where every rule of the scheduler is, so it
is unit-tested record by record with a manual clock.

Rules, in the words of Kubernetes CronJob and SQS:

- A fire at scheduled time ``T`` handled at ``now``: all scheduled instants in ``[T, now]`` are
  due. Only the latest runs; each earlier one leaves a MISSED event (at most
  ``MAX_MISSED_EVENTS``, then one summary). If ``startingDeadline`` is set and the latest is
  later than that after its time, it is MISSED too.
- ``concurrencyPolicy``: ALLOW runs regardless; FORBID leaves a SKIPPED event while a run of the
  job is active; REPLACE cancels the active runs (CANCELLED events with their run ids) and runs.
- A dispatched attempt not SUCCEEDED/FAILED by its visibility deadline is dispatched again
  (attempt + 1) until ``max_attempts``; STARTED and HEARTBEAT move the deadline. The deadline
  is the scheduler's: dispatch time (or the broker append time of the run's latest sign of life)
  plus the visibility timeout, and it only expires once the acknowledgements up to it have been
  read (``deadline_watermark`` of :meth:`SchedulerProcessor.punctuate`): a scheduler that lags
  never re-dispatches a run whose verdict is already on the acks topic, and while the worker
  side of the partition is silent nothing is re-dispatched into a queue nobody reads. FAILED
  with a ``retry_delay_ms`` from the worker is retried after that delay; without one, or out
  of attempts, the run is DEAD (status event, and the run on the dead-letter topic).
- Paused jobs do not fire; on resume the pending fire is due again, so what was missed while
  paused follows the missed-run rule above (as with ``suspend`` on a CronJob).
- Manual triggers always run (as ``kubectl create job --from=cronjob``), whatever the policy,
  and change nothing about the job: a paused job stays PAUSED, a finished one stays finished
  until the triggered run ends (then its outcome decides COMPLETED or DEAD again). The run is
  named by the trigger's issue time (``<job id>@trigger-<ms>``, the name the API and the CLI
  give back): a second trigger issued in the same millisecond is REJECTED, not run under a
  name taken (the job record keeps its latest triggers' issue times).
- A dead-letter replay (``ReplayRun``) dispatches a DEAD run again like a manual trigger, but
  as the same run: same run id and scheduled time, the next attempt, and ``max_attempts``
  attempts of its own. Its DISPATCHED event says it is a replay (event id
  ``<command id>:DISPATCHED``, the command's verdict). It runs the job's current definition; a
  job the scheduler has forgotten (finished longer ago than the retention) is recreated, DEAD,
  from the dead run's own task and arguments, with its sequence numbers continued from the
  command's issue time so its new events sort after the old ones. Refused for a CANCELLED job
  and for a run that is in flight.

The job's own state is separate from its runs' states and from the outcome of a command
(the table is in the README, "Job states"). Only job-level events (no ``run_id``) change it:
SCHEDULED, PAUSED, RESUMED (back to SCHEDULED), CANCELLED, and at the end COMPLETED, or DEAD
when the job's last run ended DEAD. A command that cannot be applied (unknown job, a job in
the wrong state, an invalid spec) is a REJECTED event: about the job, never its new state.
Events a command causes directly carry its id (``<command id>:<STATE>``), so whoever sent it
can find the scheduler's verdict.
"""

from __future__ import annotations

from jobwheel.streams.rules.acks import AckRules
from jobwheel.streams.rules.commands import CommandRules
from jobwheel.streams.rules.core import (
    DAY_MS,
    MAX_ARGS_BYTES,
    MAX_HANDBACKS,
    MAX_MISSED_EVENTS,
    QUEUE_PATIENCE,
    SOURCE,
    TIMER_FAILED,
    TOO_LARGE,
    Output,
    clip_id,
)
from jobwheel.streams.rules.punctuation import Punctuation

__all__ = [
    "DAY_MS",
    "MAX_ARGS_BYTES",
    "MAX_HANDBACKS",
    "MAX_MISSED_EVENTS",
    "QUEUE_PATIENCE",
    "SOURCE",
    "TIMER_FAILED",
    "TOO_LARGE",
    "Output",
    "SchedulerProcessor",
    "clip_id",
]


class SchedulerProcessor(CommandRules, Punctuation, AckRules):
    """Decisions for ONE partition. ``fencing_token`` is this owner's epoch for the partition.
    The rules are in :mod:`jobwheel.streams.rules`: commands, punctuation (time) and acks, on
    a shared core (output, records, events, a run's life)."""
