"""A partition's state: the wheels are an index derived from the job records, a transaction's
changes are all-or-nothing, and a restore from the changelog rebuilds exactly what the live path
built (memory and real RocksDB)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwheel.clock import ManualClock
from jobwheel.schemas.models import At, Every, JobCommand, Now, ScheduleJob, State, StatusEvent
from jobwheel.streams.jobstate import decode_job, encode_job, peek_timers, timers_of
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import (
    MemoryBackend,
    PartitionState,
    RocksDBBackend,
    StateBackend,
)
from jobwheel.streams.state.recovery import (
    MAX_CHECKPOINT_AGE_MS,
    apply_batch,
    plan_restore,
    rebuild_index,
)
from jobwheel.streams.state.rocksdb import RocksDBLimits

T0 = 1_800_000_000_000  # fixed date: the processor and the checkpoints get it passed in
LIMITS = RocksDBLimits(
    block_cache_bytes=1 << 20, write_buffer_bytes=1 << 20, total_write_buffer_bytes=4 << 20
)


def make_backend(kind: str, path: Path) -> StateBackend:
    """A backend whose checkpoints are stamped T0 (``plan_restore(..., now_ms=T0)``)."""
    if kind == "memory":
        return MemoryBackend(ManualClock(T0))
    return RocksDBBackend(path, LIMITS.resources(), ManualClock(T0))


@pytest.fixture(params=["memory", "rocksdb"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def backend(kind: str, tmp_path: Path) -> Iterator[StateBackend]:
    b = make_backend(kind, tmp_path / "p0")
    yield b
    b.close()


def wheel_keys(state: PartitionState) -> tuple[list[bytes], list[bytes]]:
    far = 2**62
    return (
        [e.key for e in state.timers.due(far, 10_000)],
        [e.key for e in state.deadlines.due(far, 10_000)],
    )


def cmd(job_id: str, trigger, n: int = 0) -> JobCommand:
    return JobCommand(f"c-{job_id}-{n}", job_id, T0, ScheduleJob("demo.echo", trigger))


def test_record_header_carries_its_timers_and_decodes_back() -> None:
    from jobwheel.streams.jobstate import JobRecord

    job = JobRecord("j", ScheduleJob("demo.echo", Every(1000)), T0, next_fire_ms=T0 + 1000)
    data = encode_job(job)
    assert peek_timers(data) == [(w, d, t.encode()) for w, d, t in timers_of(job)]
    assert decode_job(data) == job
    assert peek_timers(b"not a record") == []


def test_wheels_follow_the_records(backend: StateBackend) -> None:
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("a", At(T0 + 100)), T0)
    proc.on_command(cmd("b", Every(1000)), T0)
    assert [e.job_id for e in state.timers.due(T0 + 10_000, 10)] == ["a", "b"]
    [run] = proc.punctuate(T0 + 100, 10)[0].runs
    # a's fire became a's visibility deadline; b still waits for its first fire.
    assert [(e.job_id, e.tag) for e in state.timers.due(T0 + 10_000, 10)] == [("b", "fire")]
    assert [(e.job_id, e.due_ms) for e in state.deadlines.due(2**62, 10)] == [
        ("a", run.deadline_ms)
    ]
    ack = StatusEvent("e", "a", State.SUCCEEDED, T0 + 200, "worker", run.run_id, attempt=1)
    proc.on_ack(ack, T0 + 200)
    assert state.deadlines.due(2**62, 10) == []
    assert [e.tag for e in state.timers.due(2**62, 10) if e.job_id == "a"] == ["expire"]


def test_discard_forgets_and_commit_keeps_a_transaction(backend: StateBackend) -> None:
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("a", Now()), T0)
    assert state.dirty and list(state.changes()) == [b"a"]
    state.discard()
    assert not state.dirty
    assert proc.load("a") is None and wheel_keys(state) == ([], [])
    proc.on_command(cmd("a", Now(), 1), T0)
    state.commit(checkpoint=7)
    assert not state.dirty and backend.checkpoint() == 7
    fresh = PartitionState(backend)  # what a new transaction sees: the committed state
    assert SchedulerProcessor(0, fresh).load("a") is not None
    assert wheel_keys(fresh) == wheel_keys(state) != ([], [])


def test_a_loaded_record_is_the_callers_until_it_is_saved(backend: StateBackend) -> None:
    """The record cache hands a record out: changes that were never saved are not seen by
    the next load (which reads the bytes, as without the cache), saved ones are, and every
    load equals what the stored bytes decode to."""
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("a", At(T0 + 100)), T0)
    job = proc.load("a")
    assert job is not None and job == decode_job(state.get(b"a") or b"")
    job.seq += 100  # changed, never saved
    again = proc.load("a")
    assert again is not None and again is not job and again.seq == job.seq - 100
    again.last_error = "saved"
    proc.save(again)
    third = proc.load("a")
    assert third is again  # from the cache, no decoding
    assert third == decode_job(state.get(b"a") or b"") and third.last_error == "saved"
    proc.save(third)
    state.commit(checkpoint=1)
    assert proc.load("a") is third  # a commit keeps the cache: it holds what was committed


def test_a_discarded_transaction_empties_the_record_cache(backend: StateBackend) -> None:
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("a", At(T0 + 100)), T0)
    state.commit(checkpoint=1)
    job = proc.load("a")
    assert job is not None
    job.last_error = "aborted"
    proc.save(job)
    state.discard()  # the transaction aborted: its save is gone, and so is the cached record
    committed = proc.load("a")
    assert committed is not None and committed is not job and committed.last_error is None


def test_the_record_cache_is_bounded_and_lets_the_furthest_fire_go_first(
    backend: StateBackend,
) -> None:
    state = PartitionState(backend, cache_size=3)
    proc = SchedulerProcessor(0, state)
    for i in range(5):  # saved soonest last: an order of saving says nothing
        proc.on_command(cmd(f"j{i}", At(T0 + 500 - 100 * i)), T0)
    saved = {f"j{i}": proc.load(f"j{i}") for i in range(5)}
    for job in saved.values():
        assert job is not None
        proc.save(job)
    # The three due soonest stay cached; the two due last leave it and are decoded again.
    assert [proc.load(f"j{i}") is saved[f"j{i}"] for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bytes of every record the state decodes from now on (a cache miss each)."""
    from jobwheel.streams.state import partition

    decoded: list[bytes] = []

    def decode(data: bytes):  # type: ignore[no-untyped-def]
        decoded.append(data)
        return decode_job(data)

    monkeypatch.setattr(partition, "decode_job", decode)
    return decoded


def test_a_burst_larger_than_the_cache_misses_it_only_beyond_the_bound(
    backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs scheduled in a burst fire in the order they were scheduled. With a cache that let
    the oldest saved go first, each miss's save pushed out the next job to fire, and every fire
    of the burst missed; ordered by next fire, only the jobs beyond the bound do."""
    state = PartitionState(backend, cache_size=40)
    proc = SchedulerProcessor(0, state)
    for i in range(50):
        proc.on_command(cmd(f"j{i:02}", At(T0 + 100 + i)), T0)
    state.commit(checkpoint=1)
    decoded = counting_decodes(monkeypatch)
    out, handled = proc.punctuate(T0 + 200, 1000)
    assert handled == len(out.runs) == 50
    assert sorted(decode_job(d).job_id for d in decoded) == [f"j{i}" for i in range(40, 50)]


def test_a_finished_record_is_not_kept_and_one_in_flight_is(
    backend: StateBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record with a run in flight is read again when its verdict comes; a finished one
    (kept on disk for the retention) only by a late command or its expiry, so it does not take
    a place in the cache."""
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state)
    for job_id in ("done", "running"):
        proc.on_command(cmd(job_id, Now()), T0)
    out, _ = proc.punctuate(T0, 100)
    run = {r.job_id: r for r in out.runs}["done"]
    verdict = StatusEvent(
        f"{run.run_id}:1:SUCCEEDED", "done", State.SUCCEEDED, T0 + 5, "worker", run.run_id,
        seq=run.seq + 1, attempt=1,
    )  # fmt: skip
    assert [e.state for e in proc.on_ack(verdict, T0 + 5).status] == [State.COMPLETED]
    decoded = counting_decodes(monkeypatch)
    running, done = proc.load("running"), proc.load("done")
    assert running is not None and running.active  # from the cache
    assert done is not None and not done.active and done.expires_at_ms is not None
    assert [decode_job(d).job_id for d in decoded] == ["done"]


def test_rocksdb_state_survives_reopen(tmp_path: Path) -> None:
    backend = RocksDBBackend(tmp_path / "p3", LIMITS.resources())
    state = PartitionState(backend)
    SchedulerProcessor(3, state).on_command(cmd("a", At(T0 + 5)), T0)
    state.commit(checkpoint=42)
    before = wheel_keys(state)
    backend.close()
    reopened = RocksDBBackend(tmp_path / "p3", LIMITS.resources())
    try:
        assert reopened.checkpoint() == 42
        assert wheel_keys(PartitionState(reopened)) == before
    finally:
        reopened.close()


def run_killed(script: str, *args: object) -> None:
    """Run ``script`` in a process of its own, which must end SIGKILLed (by itself)."""
    writer = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert writer.returncode == -signal.SIGKILL, writer.stderr


#: A process that commits one job per transaction to a partition's RocksDB state, the way the
#: engine does (records, wheel entries and checkpoint in one batch), then is SIGKILLed.
_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from jobwheel.schemas.models import At, JobCommand, ScheduleJob
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import PartitionState, RocksDBBackend
from jobwheel.streams.state.rocksdb import RocksDBLimits

path, jobs, t0 = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
limits = RocksDBLimits(block_cache_bytes=1 << 20, write_buffer_bytes=64 << 10,
                       total_write_buffer_bytes=1 << 20)
state = PartitionState(RocksDBBackend(path, limits.resources()))
processor = SchedulerProcessor(0, state)
for i in range(jobs):
    job = f"job-{i:06d}"
    processor.on_command(JobCommand(f"c-{i}", job, t0, ScheduleJob("demo.echo", At(t0 + i))), t0)
    state.commit(checkpoint=i + 1)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_process_leaves_its_state_as_an_earlier_commit_left_it(tmp_path: Path) -> None:
    """The local state writes no log of its own (the changelog is its log): a SIGKILL loses
    the commits RocksDB had not flushed yet. What survives must be one earlier commit's state
    whole, its records, their wheel entries and its checkpoint together, for the claim to
    restore the rest from the checkpoint on."""
    path, jobs = tmp_path / "p0", 6000
    run_killed(_KILLED_WRITER, path, jobs, T0)
    backend = RocksDBBackend(path, LIMITS.resources())
    try:
        checkpoint = backend.checkpoint()
        assert checkpoint is not None, "no commit survived: the writer never flushed"
        records = {key: decode_job(value) for key, value in backend.job_items()}
        assert sorted(job.job_id for job in records.values()) == [
            f"job-{i:06d}" for i in range(checkpoint)
        ], f"the records are not those of the commits under checkpoint {checkpoint}"
        state = PartitionState(backend)
        expected = sorted(
            (due, job.job_id) for job in records.values() for _w, due, _t in timers_of(job)
        )
        found = sorted((entry.due_ms, entry.job_id) for entry in state.timers.due(2**62, jobs + 1))
        assert found == expected, "the wheel entries are not those of the surviving records"
        plan = plan_restore(backend, 0, jobs, now_ms=int(time.time() * 1000))
        assert (plan.start, plan.wiped, plan.fresh) == (checkpoint, False, False)
    finally:
        backend.close()


_KILLED_MARKER = """
import os, signal, sys
from pathlib import Path
from jobwheel.streams.state.partition import RocksDBBackend
from jobwheel.streams.state.rocksdb import RocksDBLimits

backend = RocksDBBackend(Path(sys.argv[1]), RocksDBLimits().resources())
backend.set_index_pending(True)  # a restore from scratch begins: the mark, then the records
backend.write({b"job": b"record"}, {0: {}, 1: {}}, 7)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_index_mark_is_not_kept_without_what_it_marks(tmp_path: Path) -> None:
    """Writes outside a batch (the index mark of a restore from scratch, written on the meta
    column family directly) go without the log too: a mark that survived a kill through a log
    while the records after it did not would order the database's history differently from how
    it was written (a mark cleared through the log, the index it vouches for lost)."""
    run_killed(_KILLED_MARKER, tmp_path / "p0")
    backend = RocksDBBackend(tmp_path / "p0", LIMITS.resources())
    try:
        kept = (backend.index_pending(), backend.checkpoint(), list(backend.job_items()))
        assert kept in ((False, None, []), (True, 7, [(b"job", b"record")])), kept
    finally:
        backend.close()


def test_a_second_process_cannot_open_the_same_partition(tmp_path: Path) -> None:
    first = RocksDBBackend(tmp_path / "p1", LIMITS.resources())
    try:
        with pytest.raises(Exception, match="(?i)lock"):
            RocksDBBackend(tmp_path / "p1", LIMITS.resources())
    finally:
        first.close()


def test_restore_rebuilds_exactly_what_the_live_path_built(kind: str, tmp_path: Path) -> None:
    """Every committed change goes to the changelog; replaying it (updates, deletes, and the
    same key many times, as an uncompacted log has it) gives the same records and wheels."""
    live_backend = make_backend(kind, tmp_path / "live")
    live = PartitionState(live_backend)
    proc = SchedulerProcessor(0, live, retention_ms=1000)
    changelog: list[tuple[int, bytes, bytes | None]] = []

    def commit() -> None:
        for key, value in live.changes().items():
            changelog.append((len(changelog), key, value))
        live.commit(checkpoint=len(changelog))

    for i in range(30):
        proc.on_command(cmd(f"j{i}", Every(1000) if i % 3 else At(T0 + 10 * i)), T0)
    commit()
    for t in range(T0, T0 + 5000, 250):
        out, _ = proc.punctuate(t, 1000)
        for run in out.runs[::2]:  # half the runs succeed; their one-off jobs complete
            ack = StatusEvent("e", run.job_id, State.SUCCEEDED, t, "worker", run.run_id, attempt=1)
            proc.on_ack(ack, t)
        commit()
    assert any(v is None for _, _, v in changelog), "expired jobs were deleted (tombstones)"

    jobs = {f"j{i}".encode() for i in range(30)}
    # From scratch (a new owner's empty disk): records first, the index at the end.
    restored = make_backend(kind, tmp_path / "restored")
    plan = plan_restore(restored, 0, len(changelog), now_ms=T0)
    assert (plan.start, plan.end, plan.wiped, plan.fresh) == (0, len(changelog), False, True)
    for start in range(0, len(changelog), 7):  # in batches, as the engine reads them
        batch = changelog[start : start + 7]
        apply_batch(restored, batch, batch[-1][0] + 1, fresh=True)
    assert restored.index_pending()  # a crash now would start over, not trust a half index
    rebuild_index(restored)
    assert not restored.index_pending() and restored.checkpoint() == len(changelog)
    assert wheel_keys(PartitionState(restored)) == wheel_keys(live)
    assert {k: restored.jobs.get(k) for k in jobs} == {k: live_backend.jobs.get(k) for k in jobs}
    # Catching up a tail: each record re-indexed as it is applied.
    tail = make_backend(kind, tmp_path / "tail")
    half = len(changelog) // 2
    plan = plan_restore(tail, 0, half, now_ms=T0)
    apply_batch(tail, changelog[:half], half, fresh=True)
    rebuild_index(tail)
    plan = plan_restore(tail, 0, len(changelog), now_ms=T0)
    assert (plan.start, plan.fresh) == (half, False)
    for start in range(half, len(changelog), 5):
        batch = changelog[start : start + 5]
        apply_batch(tail, batch, batch[-1][0] + 1)
    assert wheel_keys(PartitionState(tail)) == wheel_keys(live)
    assert {k: tail.jobs.get(k) for k in jobs} == {k: live_backend.jobs.get(k) for k in jobs}
    for b in (live_backend, restored, tail):
        b.close()


def test_a_checkpoint_that_does_not_fit_the_changelog_is_wiped(backend: StateBackend) -> None:
    state = PartitionState(backend)
    SchedulerProcessor(0, state).on_command(cmd("a", Now()), T0)
    state.commit(checkpoint=500)
    assert plan_restore(backend, 0, 800, now_ms=T0).start == 500  # fits: only the tail is read
    plan = plan_restore(backend, 0, 100, now_ms=T0)  # the changelog is shorter: it was recreated
    assert plan.wiped and plan.fresh and plan.start == 0
    assert backend.checkpoint() is None and backend.jobs.get(b"a") is None


def test_a_checkpoint_older_than_the_changelog_keeps_deletions_is_rebuilt(
    backend: StateBackend, caplog: pytest.LogCaptureFixture
) -> None:
    """Compaction drops a deleted job's records at once and its tombstone a day later: a state
    older than that could replay neither and keep a finished job as it once was (due, to fire
    again). Past the bound with records to read it is rebuilt; up to date, it is kept."""
    state = PartitionState(backend)
    SchedulerProcessor(0, state).on_command(cmd("a", At(T0 + 1000)), T0)
    state.commit(checkpoint=500)
    old = T0 + MAX_CHECKPOINT_AGE_MS + 1
    assert plan_restore(backend, 0, 800, now_ms=T0 + MAX_CHECKPOINT_AGE_MS).start == 500
    assert plan_restore(backend, 0, 500, now_ms=old).start == 500  # nothing after it to miss
    plan = plan_restore(backend, 0, 800, now_ms=old)
    assert (plan.start, plan.wiped, plan.fresh) == (0, True, True)
    assert backend.checkpoint() is None and backend.jobs.get(b"a") is None
    assert "older than the changelog keeps deletions" in caplog.text


def test_a_checkpoint_written_without_its_time_is_rebuilt(tmp_path: Path) -> None:
    """A state written by a release that kept no time with its checkpoint: its age is not
    known, so it is rebuilt once (a new checkpoint carries its time)."""
    backend = RocksDBBackend(tmp_path / "p0", LIMITS.resources(), ManualClock(T0))
    try:
        state = PartitionState(backend)
        SchedulerProcessor(0, state).on_command(cmd("a", At(T0 + 1000)), T0)
        state.commit(checkpoint=500)
        assert backend.checkpoint_written_ms() == T0
        backend.db.get_column_family("meta").put(b"changelog.checkpoint", (500).to_bytes(8, "big"))
        assert (backend.checkpoint(), backend.checkpoint_written_ms()) == (500, None)
        assert plan_restore(backend, 0, 500, now_ms=T0).start == 500
        assert plan_restore(backend, 0, 800, now_ms=T0).wiped
    finally:
        backend.close()


def test_a_rollback_undoes_one_key_and_keeps_the_rest_of_the_transaction(backend) -> None:
    """A timer whose handling failed is undone alone: its key goes back to what the open
    transaction held (or to the committed record, and nothing for the changelog), its wheel
    entries with it; the other changes of the transaction stay."""
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state)
    proc.on_command(cmd("committed", Every(1000)), T0)
    state.commit(5)
    proc.on_command(cmd("pending", At(T0 + 50)), T0)
    wheels, changes = wheel_keys(state), dict(state.changes())
    assert list(changes) == [b"pending"]

    for key in (b"committed", b"pending"):
        point = state.savepoint(key)
        job = proc.load(key.decode())
        job.next_fire_ms = T0 + 999_999
        proc.save(job)
        assert wheel_keys(state) != wheels
        state.rollback(key, point)
        assert (wheel_keys(state), dict(state.changes())) == (wheels, changes)
    assert decode_job(state.get(b"committed")).next_fire_ms == T0 + 1000
    state.commit(6)
    assert wheel_keys(state) == wheels
