"""Which decoded job records a partition keeps: those read again soon, the furthest fire
leaving first, then the oldest run in flight; finished and paused records not at all."""

from __future__ import annotations

from jobwheel.schemas.models import At, ScheduleJob
from jobwheel.streams.jobstate import ActiveRun, JobRecord, JobStatus, RunPhase
from jobwheel.streams.state.cache import RecordCache

T0 = 1_800_000_000_000


def waiting(job_id: str, fire_ms: int) -> JobRecord:
    return JobRecord(job_id, ScheduleJob("t", At(fire_ms)), T0, next_fire_ms=fire_ms)


def in_flight(job_id: str) -> JobRecord:
    job = JobRecord(job_id, ScheduleJob("t", At(T0)), T0)
    run = ActiveRun(f"{job_id}@{T0}", T0, 1, 1, RunPhase.DISPATCHED, T0 + 30_000)
    job.active[run.run_id] = run
    return job


def kept(cache: RecordCache, *keys: str) -> list[str]:
    """Which of ``keys`` the cache holds (taking them out and back, as a load and save do)."""
    out = []
    for key in keys:
        found = cache.take(key.encode())
        if found is not None:
            out.append(key)
            cache.keep(key.encode(), found[0], found[1])
    return out


def test_runs_in_flight_stay_longest_and_the_oldest_of_them_leaves_first() -> None:
    cache = RecordCache(3)
    for key in ("f1", "f2"):
        cache.keep(key.encode(), in_flight(key), [])
    cache.keep(b"w", waiting("w", T0 + 10), [])
    cache.keep(b"f3", in_flight("f3"), [])  # over the bound: the waiting record goes first
    assert kept(cache, "f1", "f2", "f3", "w") == ["f1", "f2", "f3"]
    cache.keep(b"f4", in_flight("f4"), [])  # none waiting: the oldest in flight goes
    assert sorted(kept(cache, "f1", "f2", "f3", "f4")) == ["f2", "f3", "f4"]


def test_finished_and_paused_records_are_not_kept() -> None:
    cache = RecordCache(10)
    done = waiting("done", T0)
    done.next_fire_ms, done.status, done.expires_at_ms = None, JobStatus.COMPLETED, T0 + 1
    paused = waiting("paused", T0 + 10)
    paused.status = JobStatus.PAUSED
    for job in (done, paused):
        cache.keep(job.job_id.encode(), job, [])
    assert len(cache) == 0


def test_records_taken_and_kept_again_leave_no_growing_trail() -> None:
    """Each take leaves the record's place in the order behind; those are dropped as the
    cache goes, so a long run of fires that reschedule (an interval job) stays bounded."""
    cache = RecordCache(100)
    for i in range(100):
        cache.keep(f"j{i}".encode(), waiting(f"j{i}", T0 + i), [])
    for step in range(10_000):
        key = f"j{step % 100}".encode()
        found = cache.take(key)
        assert found is not None
        job = found[0]
        job.next_fire_ms = (job.next_fire_ms or 0) + 100
        cache.keep(key, job, [])
        assert len(cache._waiting) <= 2 * len(cache) + 64
    assert len(cache) == 100


def test_the_record_kept_as_the_order_is_rebuilt_can_still_leave() -> None:
    """The order is rebuilt from the records kept when its trail grows; the record being kept
    at that moment is in it too, so it can still be the one to leave."""
    cache = RecordCache(10)
    for i in range(10):
        cache.keep(f"j{i}".encode(), waiting(f"j{i}", T0 + i), [])
    while True:  # until keeping j0 rebuilds the order
        assert cache.take(b"j0") is not None
        before = len(cache._waiting)
        cache.keep(b"j0", waiting("j0", T0 + 1_000_000), [])  # now the furthest fire
        if len(cache._waiting) <= before:
            break
    cache.keep(b"new", waiting("new", T0 + 5), [])  # one over the bound: j0 goes
    assert cache.take(b"j0") is None and len(cache) == 10
