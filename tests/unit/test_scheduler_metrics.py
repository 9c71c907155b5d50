"""What the scheduler's metrics and readiness say about an engine's partitions, driven
without Kafka: a ready partition on in-memory state, records as the consumer wrapper hands
them over, a collector reading the engine as the metrics server's thread does. (The same
engine over a real broker, scraped over HTTP, is tests/integration/test_operations.py.)"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import After, JobCommand, Now, ScheduleJob
from jobwheel.schemas.partitioning import partition_for
from jobwheel.schemas.progress import Progress
from jobwheel.settings import Settings
from jobwheel.streams.engine import PartitionTask, Phase, SchedulerEngine, StandbyTask
from jobwheel.streams.kafka import Record
from jobwheel.streams.metrics import SchedulerCollector
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState

T0 = 1_800_000_000_000
SETTINGS = Settings(_env_file=None, topic_prefix="p", partitions=2)  # type: ignore[call-arg]
TOPICS = SETTINGS.topics
CODEC = default_codec()


def engine_with(*phases: Phase) -> SchedulerEngine:
    engine = SchedulerEngine(SETTINGS)
    for p, phase in enumerate(phases):
        state = PartitionState(MemoryBackend())
        standby = StandbyTask(p, state.backend, state)  # type: ignore[arg-type]
        if phase is Phase.STANDBY:
            engine.tasks[p] = standby
            continue
        task = PartitionTask.claim(standby)
        task.phase = phase
        if phase is Phase.READY:
            task.processor = SchedulerProcessor(p, state, fencing_token=1)
        engine.tasks[p] = task
    return engine


def command(job_id: str, trigger: object, task: str = "demo.echo") -> bytes:
    return CODEC.encode(JobCommand(f"c-{job_id}", job_id, T0, ScheduleJob(task, trigger)))  # type: ignore[arg-type]


def jobs_of(partition: int, n: int) -> list[str]:
    """``n`` job ids that live in ``partition`` (the engine rejects a job in the wrong one)."""
    ids = (f"job-{i}" for i in range(10_000))
    return [j for j in ids if partition_for(j, SETTINGS.partitions) == partition][:n]


def schedule(engine: SchedulerEngine, jobs: list[str], trigger: object) -> list:
    """Feed a schedule command per job to partition 0, then let its timers fire."""
    out: list = []
    for i, job in enumerate(jobs):
        record = Record(TOPICS.requests, 0, i, job.encode(), command(job, trigger), None, T0)
        engine._on_request(record, T0, out, set())
    engine._punctuate(engine.tasks[0], T0 + 30, out, set())
    return out


def samples(collector: SchedulerCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    families: list[Metric] = list(registry.collect())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_commands_fires_and_lateness_are_counted_when_their_transaction_commits():
    engine = engine_with(Phase.READY)
    schedule(engine, jobs_of(0, 2), Now())
    collector = SchedulerCollector(engine)
    before = samples(collector)
    # counted as decided ...
    assert before[("jobwheel_scheduler_job_events_total", (("state", "SCHEDULED"),))] == 2
    # ... but a run counts as fired, with its lateness, only once it is committed
    assert before[("jobwheel_scheduler_fires_total", ())] == 0
    assert before[("jobwheel_scheduler_fire_lateness_seconds_count", ())] == 0
    dispatched = before.get(
        ("jobwheel_scheduler_runs_total", (("state", "DISPATCHED"), ("task", "demo.echo"))), 0
    )
    assert dispatched == len(engine.meters.pending) == 2
    engine.meters.committed(T0 + 40, 0.003)
    after = samples(collector)
    assert after[("jobwheel_scheduler_fires_total", ())] == dispatched
    assert after[("jobwheel_scheduler_fire_lateness_seconds_count", ())] == dispatched
    assert after[("jobwheel_scheduler_fire_lateness_seconds_bucket", (("le", "0.05"),))] == (
        dispatched
    )
    assert after[("jobwheel_scheduler_fire_lateness_seconds_bucket", (("le", "0.025"),))] == 0
    assert after[("jobwheel_scheduler_commit_seconds_count", ())] == 1


def test_an_aborted_transaction_fires_nothing():
    engine = engine_with(Phase.READY)
    schedule(engine, jobs_of(0, 1), Now())
    assert engine.meters.pending
    engine.meters.discard()
    engine.meters.committed(T0 + 5, 0.001)
    assert samples(SchedulerCollector(engine))[("jobwheel_scheduler_fires_total", ())] == 0


def test_a_rejected_command_is_a_dead_letter_of_kind_request():
    engine = engine_with(Phase.READY)
    bad = Record(TOPICS.requests, 0, 0, b"k", b"\x00 not a command", None, T0)
    engine._on_request(bad, T0, [], set())
    got = samples(SchedulerCollector(engine))
    assert got[("jobwheel_scheduler_dead_letters_total", (("kind", "request"),))] == 1
    assert got[("jobwheel_scheduler_rejected_total", ())] == 1


def test_readiness_names_a_restoring_partition_and_what_is_left():
    engine = engine_with(Phase.READY, Phase.RESTORING)
    engine.input = engine.acks = object()  # type: ignore[assignment]  # connected
    engine.joined = True
    collector = SchedulerCollector(engine)
    ok, detail = collector._ready_parts()
    assert not ok and detail == "restoring partitions [1] (changelog not measured yet)"
    progress = engine.tasks[1].restore
    progress.end, progress.next, progress.reading = 500, 120, True
    ok, detail = collector._ready_parts()
    assert not ok and detail == "restoring partitions [1] (380 records left)"
    got = samples(collector)
    assert got[("jobwheel_scheduler_restore_remaining_records", (("partition", "1"),))] == 380
    assert got[("jobwheel_scheduler_partitions", (("phase", "restoring"),))] == 1
    engine.tasks[1].phase = Phase.READY
    engine.tasks[1].processor = SchedulerProcessor(1, engine.tasks[1].state, fencing_token=1)
    assert collector._ready_parts()[0]


def test_readiness_names_a_partition_with_input_waiting_and_no_recent_commit():
    engine = engine_with(Phase.READY, Phase.READY)
    now = int(__import__("time").time() * 1000)
    stale = Progress(now - 45_000, None, "i")
    fresh = Progress(now - 1_000, None, "i")
    engine.tasks[0].committed_note, engine.tasks[1].committed_note = stale, fresh
    engine.tasks[0].requests_committed = engine.tasks[1].requests_committed = 10
    engine.input_ends = {0: (10, None), 1: (12, None)}  # nothing unread on 0, 2 on 1
    collector = SchedulerCollector(engine)
    assert collector._ready_parts()[0]  # idle for 45 s is fine; a fresh commit with input too
    engine.input_ends = {0: (13, None), 1: (12, None)}
    ok, detail = collector._ready_parts()
    assert not ok
    assert detail == "partition 0: 3 unread input records and no commit for 45 s"
    got = samples(collector)
    assert got[("jobwheel_scheduler_stuck_partitions", ())] == 1
    lag = ("jobwheel_scheduler_lag_records", (("partition", "0"), ("topic", TOPICS.requests)))
    assert got[lag] == 3


def test_a_timer_overdue_without_commits_is_stuck_too():
    engine = engine_with(Phase.READY)
    now = int(__import__("time").time() * 1000)
    engine.tasks[0].committed_note = Progress(now - 60_000, now - 40_000, "i")
    ok, detail = SchedulerCollector(engine)._ready_parts()
    assert not ok and detail.startswith("partition 0: a timer due 40 s ago")


def test_partitions_are_counted_by_phase():
    engine = engine_with(Phase.READY, Phase.STANDBY)
    assert not schedule(engine, jobs_of(0, 1), After(60_000))[1:]  # SCHEDULED, nothing fired
    got = samples(SchedulerCollector(engine))
    assert got[("jobwheel_scheduler_partitions", (("phase", "ready"),))] == 1
    assert got[("jobwheel_scheduler_partitions", (("phase", "standby"),))] == 1
    assert got[("jobwheel_scheduler_partition_phase", (("partition", "1"), ("phase", "standby")))]
    assert got[("jobwheel_scheduler_commands_total", ())] == 1
    assert got[("jobwheel_scheduler_rejected_total", ())] == 0


def test_a_command_replayed_from_the_dead_letters_is_counted():
    from jobwheel.schemas.deadletter import REPLAYED_FROM_HEADER

    engine = engine_with(Phase.READY)
    [job, other] = jobs_of(0, 2)
    replayed = Record(
        TOPICS.requests, 0, 0, job.encode(), command(job, Now()),
        [(REPLAYED_FROM_HEADER, b"p.dead-letter:0:7")], T0,
    )  # fmt: skip
    plain = Record(TOPICS.requests, 0, 1, other.encode(), command(other, Now()), None, T0)
    for record in (replayed, plain):
        engine._on_request(record, T0, [], set())
    got = samples(SchedulerCollector(engine))
    assert got[("jobwheel_scheduler_replays_total", ())] == 1
    assert got[("jobwheel_scheduler_commands_total", ())] == 2


def test_transaction_phases_add_up_per_phase_over_the_commits():
    engine = engine_with(Phase.READY)
    collector = SchedulerCollector(engine)
    name = "jobwheel_scheduler_transaction_phase_seconds_total"
    phases = ("open", "produce", "offsets", "end", "state")
    assert {samples(collector)[(name, (("phase", p),))] for p in phases} == {0.0}
    engine.meters.phases(0.020, 0.001, 0.002, 0.015, 0.004)
    engine.meters.phases(0.010, 0.003, 0.002, 0.005, 0.001)
    got = samples(collector)
    spent = [round(got[(name, (("phase", p),))], 6) for p in phases]
    assert spent == [0.03, 0.004, 0.004, 0.02, 0.005]


def test_a_partition_revoked_since_the_input_ends_were_sampled_is_scraped_as_a_standby():
    """The loop samples its input ends twice a second; a partition revoked in between (a
    second scheduler joined) is a standby copy in the engine's tasks while the sample still
    names it. The scrape then reports the partitions it owns, not an error: a failed scrape
    closed the metrics connection without an answer (found in a takeover test)."""
    engine = engine_with(Phase.READY, Phase.READY)
    engine.tasks[0].requests_committed = engine.tasks[1].requests_committed = 10
    engine.input_ends = {0: (13, None), 1: (12, None)}
    lag = "jobwheel_scheduler_lag_records"
    owned = {((lag, (("partition", str(p)), ("topic", TOPICS.requests)))) for p in (0, 1)}
    assert owned <= samples(SchedulerCollector(engine)).keys()
    engine.tasks[1] = engine.tasks[1].standby()  # revoked: a warm copy again
    got = samples(SchedulerCollector(engine))
    assert got[(lag, (("partition", "0"), ("topic", TOPICS.requests)))] == 3
    assert (lag, (("partition", "1"), ("topic", TOPICS.requests))) not in got
    assert got[("jobwheel_scheduler_partitions", (("phase", "standby"),))] == 1


def test_a_scrape_reads_every_partition_family_from_one_snapshot_of_the_tasks():
    """The engine's thread replaces a partition's task object on a claim and a revoke while a
    scrape runs. A scrape that read the tasks twice could see a standby copy first and the
    ready task of its claim next, and ask the copy for a commit note it does not have."""
    engine = engine_with(Phase.READY, Phase.STANDBY)
    claimed = engine_with(Phase.READY, Phase.READY).tasks[1]
    claimed.committed_note = Progress(int(__import__("time").time() * 1000), None, "i")

    class ClaimedMidScrape(dict):
        """Partition 1 is claimed and ready once its first reader has read the tasks."""

        def items(self):  # type: ignore[override]
            got = list(super().items())
            self[1] = claimed
            return got

    engine.tasks = ClaimedMidScrape(engine.tasks)
    got = samples(SchedulerCollector(engine))
    assert got[("jobwheel_scheduler_partitions", (("phase", "standby"),))] == 1
    age = "jobwheel_scheduler_partition_commit_age_seconds"
    assert not [key for key in got if key[0] == age and key[1] == (("partition", "1"),)]
