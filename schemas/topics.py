"""The one definition of jobwheel's topics and record headers.

Requests, runs, acks and status are co-partitioned: the same partition count and the same key
(the job id as raw UTF-8 bytes, murmur2-partitioned) put everything about one job in the same
partition number of every topic. That is what lets the scheduler that owns requests partition
``p`` also read the worker acknowledgements for those jobs (acks partition ``p``), and write its
state to changelog partition ``p``. Change the count only by recreating the topics: ``topics
ensure`` refuses a mismatch rather than silently re-hashing jobs to other owners.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobwheel.schemas.models import Run

DEFAULT_PREFIX = "jobwheel"
#: The queue of a job that names none, and of every record written before queues existed:
#: its runs go to ``<prefix>.runs``, read by the group ``JOBWHEEL_WORKER_GROUP``. Always
#: declared, whatever ``JOBWHEEL_QUEUES`` says.
DEFAULT_QUEUE = "default"
DEFAULT_PARTITIONS = 12
#: None: ``topics ensure`` picks min(3, brokers) when it creates a topic, and
#: min.insync.replicas 2 when that is 3 (see :func:`jobwheel.kafka.admin.ensure_topics`).
DEFAULT_REPLICATION_FACTOR: int | None = None

DAY_MS = 24 * 3600 * 1000
#: How long the changelog keeps a deletion (tombstone) once compaction has reached it (Kafka's
#: default, declared so that the scheduler's bound on a stale local state follows it).
CHANGELOG_DELETE_RETENTION_MS = DAY_MS

#: The scheduler's state store: job id -> job state, backed by the compacted changelog topic
#: ``<scheduler app id>-jobs-changelog`` with the requests topic's partition count (partition
#: ``p`` of the changelog holds the jobs of requests partition ``p``). Created with the others.
JOBS_STORE = "jobs"

# --- record headers (part of the wire contract, see schemas/README.md) ----------------------

#: On acks records: the StatusEvent's state (``STARTED``, ``HEARTBEAT`` ...) as ASCII, so a
#: reader that needs only some states can skip the rest without decoding them.
STATE_HEADER = "jobwheel.state"
#: On acks records: the ``dispatched_at_ms`` of the run the event is about, as decimal ASCII.
#: Workers start a partition's runs in the order they were dispatched, so the scheduler learns
#: from it how far the partition's worker has got, and does not give up on runs that merely
#: wait behind a backlog.
DISPATCHED_HEADER = "jobwheel.dispatched"
#: On acks records: the queue whose runs topic the run came from (ASCII), written by the
#: worker; absent (a worker older than queues): ``default``. The scheduler keeps its acks
#: watermark and "how far the worker got" per queue, so one pool's acks never expire the
#: deadlines of another pool's runs.
QUEUE_HEADER = "jobwheel.queue"
#: On dead-letter records: why the record is there (UTF-8 text).
ERROR_HEADER = "jobwheel.error"
#: On dead-letter records: ``dead-run`` for a run out of attempts; absent for a bad request.
KIND_HEADER = "jobwheel.kind"
DEAD_RUN_KIND = b"dead-run"
#: On dead-letter records: ``undecodable-run`` for a runs record a worker could not decode
#: (the original bytes, with the source headers); never replayed, the scheduler's retry
#: policy already answered the worker's FAILED verdict of it.
UNDECODABLE_RUN_KIND = b"undecodable-run"
#: On a dead-letter record kept without its bytes (too large to copy): how many there were.
SIZE_HEADER = "jobwheel.size"
#: On runs records: the run the record dispatches, readable without decoding the value (see
#: :class:`RunRef`), so a worker that cannot decode a run (a newer schema, damaged bytes) can
#: still name it in a FAILED verdict instead of leaving the job to its deadline.
RUN_HEADER = "jobwheel.run"
#: On dead-letter copies of bad input: where the original record was.
SOURCE_TOPIC_HEADER = "jobwheel.source.topic"
SOURCE_PARTITION_HEADER = "jobwheel.source.partition"
SOURCE_OFFSET_HEADER = "jobwheel.source.offset"


@dataclass(frozen=True, slots=True)
class RunRef:
    """What a runs record's :data:`RUN_HEADER` says about its run: every field a worker's
    event about the run carries, besides the job id (the record's key).

    The header's value is ASCII ``<attempt> <seq> <fencing token> <scheduled ms> <dispatched
    ms> <task> <run id>``: numbers first, the task name (which has no spaces) and then the run
    id, which may hold anything a job id holds and so comes last, unsplit. Plain text rather
    than Avro on purpose: it must stay readable by a worker that cannot read the schema the
    value was written with."""

    job_id: str
    run_id: str
    attempt: int
    seq: int
    fencing_token: int
    scheduled_time_ms: int
    dispatched_at_ms: int
    task: str


def run_header(run: Run) -> bytes:
    """The :data:`RUN_HEADER` value of ``run``'s record."""
    return (
        f"{run.attempt} {run.seq} {run.fencing_token} {run.scheduled_time_ms} "
        f"{run.dispatched_at_ms} {run.task} {run.run_id}"
    ).encode()


def read_run_header(
    key: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None
) -> RunRef | None:
    """The run a runs record names in its :data:`RUN_HEADER`, or None when it names none
    (no such header, as from a scheduler older than the header, or one that does not parse):
    such a record cannot be answered, only dead-lettered."""
    if key is None:
        return None
    for name, value in headers or ():
        if name != RUN_HEADER or value is None:
            continue
        try:
            attempt, seq, token, scheduled, dispatched, task, run_id = value.decode().split(" ", 6)
            ref = RunRef(
                job_id=key.decode(),
                run_id=run_id,
                attempt=int(attempt),
                seq=int(seq),
                fencing_token=int(token),
                scheduled_time_ms=int(scheduled),
                dispatched_at_ms=int(dispatched),
                task=task,
            )
        except ValueError:  # UnicodeDecodeError is one
            return None
        # The scheduler names a job's runs <job id>@<suffix>, attempts from 1: anything else
        # is not a header it wrote.
        if ref.attempt < 1 or not ref.run_id.startswith(f"{ref.job_id}@") or not ref.task:
            return None
        return ref
    return None


def runs_topic(prefix: str, queue: str) -> str:
    """The runs topic of ``queue``: ``<prefix>.runs`` for the default queue (the topic every
    deployment had before queues, so an upgrade keeps its runs and its workers' offsets),
    ``<prefix>.runs.<queue>`` for any other. The one place a queue becomes a topic name."""
    if queue == DEFAULT_QUEUE:
        return f"{prefix}.runs"
    return f"{prefix}.runs.{queue}"


def queue_of_topic(prefix: str, topic: str) -> str | None:
    """The queue whose runs topic ``topic`` is (:func:`runs_topic`'s inverse), or None when it
    is no runs topic of ``prefix``: how a queue added at run time (``jobwheel queues add``)
    is found on the broker."""
    if topic == f"{prefix}.runs":
        return DEFAULT_QUEUE
    head = f"{prefix}.runs."
    if not topic.startswith(head):
        return None
    from jobwheel.schemas.validation import queue

    name = topic[len(head) :]
    try:
        return queue(name)
    except ValueError:  # ValidationError is one: a topic no queue could have made
        return None


@dataclass(frozen=True)
class TopicSpec:
    """What a topic must look like on the broker. ``replication_factor`` None: sized for the
    cluster when it is created (the broker count is known only then)."""

    name: str
    partitions: int
    replication_factor: int | None
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Topics:
    """The topic names and specs for one deployment (one prefix)."""

    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int | None = DEFAULT_REPLICATION_FACTOR
    #: The declared queues (``JOBWHEEL_QUEUES``): each has a runs topic.
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)

    @property
    def requests(self) -> str:
        """Job commands from producers (schedule, cancel, pause, resume, trigger)."""
        return f"{self.prefix}.requests"

    @property
    def runs(self) -> str:
        """The execution topic: one record per dispatched run attempt, consumed by workers."""
        return runs_topic(self.prefix, DEFAULT_QUEUE)

    def runs_for(self, queue: str) -> str:
        """The runs topic of ``queue`` (:func:`runs_topic`)."""
        return runs_topic(self.prefix, queue)

    @property
    def acks(self) -> str:
        """Every event a worker reports about a run (STARTED, HEARTBEAT, SUCCEEDED, FAILED,
        STALE); read by the scheduler that owns the partition and by the status sink. Broker
        append time stamps each record, so the scheduler can tell how far it has read in time."""
        return f"{self.prefix}.acks"

    @property
    def status(self) -> str:
        """The scheduler's own status events; read by the status sink."""
        return f"{self.prefix}.status"

    @property
    def dead_letter(self) -> str:
        """Undecodable or invalid commands, and runs that exhausted their attempts."""
        return f"{self.prefix}.dead-letter"

    @property
    def workers(self) -> str:
        """Each live worker's announcement (the tasks it serves), keyed by worker id; compacted
        (see :mod:`jobwheel.schemas.workers`). Not co-partitioned: one partition, read whole."""
        return f"{self.prefix}.workers"

    def changelog(self, app_id: str) -> str:
        """The changelog of the job state store of the scheduler group ``app_id``."""
        return f"{app_id}-{JOBS_STORE}-changelog"

    def changelog_specs(self, app_id: str) -> list[TopicSpec]:
        # Compacted: a restore reads each job's latest record, not its history. Segments roll
        # at 64 MiB so the history of busy partitions gets compacted away soon.
        # A tombstone is kept CHANGELOG_DELETE_RETENTION_MS after compaction reaches it; a local
        # state older than half of that is rebuilt rather than caught up (streams.state.recovery).
        config = {
            "cleanup.policy": "compact",
            "segment.bytes": str(64 * 1024 * 1024),
            "delete.retention.ms": str(CHANGELOG_DELETE_RETENTION_MS),
        }
        return [TopicSpec(self.changelog(app_id), self.partitions, self.replication_factor, config)]

    def runs_spec(self, queue: str) -> TopicSpec:
        """The runs topic of ``queue``, co-partitioned with requests like the rest: declared
        (``topics ensure``) or added at run time (``jobwheel queues add``), the same topic."""
        return TopicSpec(
            self.runs_for(queue),
            self.partitions,
            self.replication_factor,
            {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS)},
        )

    def specs(self) -> list[TopicSpec]:
        def spec(name: str, **config: str) -> TopicSpec:
            return TopicSpec(name, self.partitions, self.replication_factor, dict(config))

        return [
            spec(
                self.requests,
                **{
                    "cleanup.policy": "delete",
                    "retention.ms": str(7 * DAY_MS),
                    # The broker's time of each command: what its issue time is held to.
                    "message.timestamp.type": "LogAppendTime",
                },
            ),
            # One runs topic per declared queue, co-partitioned with requests like the rest.
            *(self.runs_spec(queue) for queue in dict.fromkeys((DEFAULT_QUEUE, *self.queues))),
            spec(
                self.acks,
                **{
                    "cleanup.policy": "delete",
                    "retention.ms": str(7 * DAY_MS),
                    "message.timestamp.type": "LogAppendTime",
                },
            ),
            spec(self.status, **{"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS)}),
            spec(
                self.dead_letter, **{"cleanup.policy": "delete", "retention.ms": str(30 * DAY_MS)}
            ),
            # Compacted: a reader from the beginning gets each worker's latest record. Also
            # deleted after a day: a worker killed without its tombstone (SIGKILL) leaves a
            # record that compaction alone would keep for ever; a live one rewrites its record
            # every few seconds, so its latest is always in a recent segment.
            TopicSpec(
                self.workers,
                1,
                self.replication_factor,
                {
                    "cleanup.policy": "compact,delete",
                    "retention.ms": str(DAY_MS),
                    "segment.ms": str(3600 * 1000),
                },
            ),
        ]
