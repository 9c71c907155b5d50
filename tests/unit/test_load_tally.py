"""The end-to-end load generator's counting (``load/e2e.py``): lost jobs, duplicate executions,
lateness and rates from the task's start notes and the runs a worker would see."""

from __future__ import annotations

import argparse

import pytest

from jobwheel.settings import Settings
from load.e2e import (
    Config,
    Fire,
    Start,
    StartsTail,
    _service_settings,
    family_cpu_s,
    jit_cpu_s,
    main,
    parse_starts,
    percentiles,
    read_starts,
    service_env,
    tally,
    thread_family,
    transactions_delta,
)


def test_a_lost_job_and_a_duplicate_execution_are_counted() -> None:
    expected = {"e2e-0": 1_000, "e2e-1": 2_000, "e2e-2": 3_000}
    fires = [
        Fire("e2e-0@1000", 1, 1_000, 1_010),
        Fire("e2e-1@2000", 1, 2_000, 2_020),
        Fire("e2e-1@2000", 2, 2_000, 9_000),  # re-dispatched: not a second first sight
        Fire("probe-0@5", 1, 5, 6),  # not one of ours
    ]
    starts = parse_starts(
        "e2e-0@1000 1 1000 1015000000 11\n"
        "e2e-1@2000 1 2000 2030000000 11\n"
        "e2e-1@2000 2 2000 9010000000 12\n"  # the same run executed again
        "probe-0@5 1 5 7000000 11\n"
        "e2e-2@3000 1 30"  # torn last line: ignored
    )
    t = tally(expected, fires, starts)
    assert t.lost == ["e2e-2"]
    assert (t.jobs, t.started_jobs, t.executions, t.duplicates) == (3, 2, 3, 1)
    assert t.duplicated_runs == ["e2e-1@2000"]
    assert t.fired_runs == 2
    assert t.start_lateness_ms["max"] == 30 and t.start_lateness_ms["p50"] == 15
    assert t.fire_lateness_ms["max"] == 20
    assert t.started_per_s == 2 / ((2_030 - 1_015) / 1000)


def test_nothing_lost_nothing_doubled() -> None:
    expected = {f"e2e-{i}": i for i in range(100)}
    starts = [Start(f"e2e-{i}@{i}", 1, i, i + 5.0, 1) for i in range(100)]
    t = tally(expected, [], starts)
    assert (t.lost, t.duplicates, t.started_jobs) == ([], 0, 100)
    assert t.fire_lateness_ms["p99"] is None and t.fired_per_s is None


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentiles(values) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    assert percentiles([7]) == {"p50": 7, "p90": 7, "p99": 7, "max": 7}


def test_service_settings_reach_every_service_and_nothing_else_does(tmp_path, monkeypatch) -> None:
    """``--set`` is how a benchmark compares settings: each service gets them; a JOBWHEEL_*
    variable of the caller's shell does not leak into the services."""
    parser = argparse.ArgumentParser()
    extra = _service_settings(parser, ["JOBWHEEL_SCHEDULER_COMMIT_INTERVAL_MS=50"])
    monkeypatch.setenv("JOBWHEEL_WORKER_CONCURRENCY", "99")
    env = service_env(Settings(_env_file=None), tmp_path, "INFO", extra)  # type: ignore[call-arg]
    assert env["JOBWHEEL_SCHEDULER_COMMIT_INTERVAL_MS"] == "50"
    assert "JOBWHEEL_WORKER_CONCURRENCY" not in env
    with pytest.raises(SystemExit):
        _service_settings(parser, ["COMMIT_INTERVAL=50"])


def test_the_watch_loop_reads_each_start_once_and_waits_for_a_torn_line(tmp_path) -> None:
    """The generator watches a run by reading only what was appended since its last look
    (reading every file whole each time took a third of a core from the pipeline it
    measures): every start is read once, a line still being written waits until it is whole,
    and at the end the tail holds what reading the files whole gives."""
    a, b = tmp_path / "starts-1.txt", tmp_path / "starts-2.txt"
    tail = StartsTail(tmp_path)
    assert tail.read() == []
    a.write_text("e2e-0@1 1 1 1000000 1\ne2e-1@2 1 2 20")  # the second line is torn
    assert [s.run_id for s in tail.read()] == ["e2e-0@1"]
    with a.open("a") as f:
        f.write("00000 1\n")  # ... and now whole
    b.write_text("e2e-2@3 1 3 3000000 2\n")
    new = tail.read()
    assert sorted(s.run_id for s in new) == ["e2e-1@2", "e2e-2@3"]
    assert next(s for s in new if s.run_id == "e2e-1@2").start_ms == 2.0
    assert tail.read() == []
    assert sorted(tail.starts, key=lambda s: s.run_id) == sorted(
        read_starts(tmp_path), key=lambda s: s.run_id
    )


def test_jit_cpu_counts_each_compiler_thread_so_one_that_ended_takes_nothing_back() -> None:
    # C2 thread 11 ran 4.0 s more, C1 thread 12 ended (its 3.0 s left /proc), 13 started.
    before = {"11": 10.0, "12": 3.0}
    after = {"11": 14.0, "13": 0.5}
    assert jit_cpu_s(before, after) == pytest.approx(4.5)
    assert jit_cpu_s(before, {}) == 0.0
    assert jit_cpu_s(None, after) is None
    assert jit_cpu_s(before, None) is None


def test_threads_are_put_in_families_by_their_names() -> None:
    """Names as /proc shows them in the run's processes (at most 15 characters)."""
    names = {
        "python": "python",  # a service's main thread, and every thread Python starts
        "python3.11": "python",
        "rdk:main": "librdkafka",
        "rdk:broker-1": "librdkafka",
        "rdk:broker1": "librdkafka",
        "rocksdb:low": "rocksdb",
        "rocksdb:high": "rocksdb",
        "MergeMutate": "native",  # the embedded ClickHouse engine's
        "BgSchPool": "native",
        "C2 CompilerThre": "jit",
        "C1 CompilerThre": "jit",
        "GC Thread#0": "gc",
        "G1 Refine#0": "gc",
        "VM Thread": "gc",
        "data-plane-kafk": "requests",
        "kafka-scheduler": "native",
        "java": "native",
    }
    assert {name: thread_family(name) for name in names} == names


def test_family_cpu_is_counted_thread_by_thread() -> None:
    before = {"1": ("python", 10.0), "2": ("librdkafka", 1.0), "3": ("rocksdb", 2.0)}
    after = {
        "1": ("python", 14.0),
        "2": ("librdkafka", 1.5),
        # "3" ended in between: it counts nothing (not minus what it had)
        "4": ("rocksdb", 0.25),  # started in between: from zero
        "5": ("python", 1.0),
    }
    assert family_cpu_s(before, after) == pytest.approx(
        {"python": 5.0, "librdkafka": 0.5, "rocksdb": 0.25}
    )
    assert family_cpu_s(None, after) is None
    assert family_cpu_s(before, None) is None


def test_pools_share_out_jobs_and_workers_and_every_pool_gets_a_worker() -> None:
    """``--queues N``: job i and worker i go to queue i mod N (so the jobs split evenly and
    each pool has a worker), and a pool without a worker is refused before anything starts."""
    config = Config(queues=2, workers=3)
    assert config.queue_names == ["default", "q2"]
    assert [config.queue_of(i) for i in range(4)] == ["default", "q2", "default", "q2"]
    assert Config().queue_names == ["default"]
    with pytest.raises(SystemExit):
        main(["--queues", "3", "--workers", "2"])


def test_transactions_of_several_schedulers_are_summed_and_a_missing_sample_says_so():
    a0 = {"count": 10.0, "open": 0.2, "end": 0.1}
    a1 = {"count": 30.0, "open": 0.6, "end": 0.5}
    b0 = {"count": 0.0, "open": 0.0, "end": 0.0}
    b1 = {"count": 20.0, "open": 0.6, "end": 0.2}
    got = transactions_delta([(a0, a1), (b0, b1)])
    assert got is not None and got["count"] == 40
    # (0.4 + 0.6) s over 40 transactions; (0.4 + 0.2) s over 40
    assert got["ms_each"] == pytest.approx({"open": 25.0, "end": 15.0})
    assert transactions_delta([(a0, a1), (b0, None)]) is None  # a scheduler not read
    assert transactions_delta([(a0, a0)]) is None  # none committed
