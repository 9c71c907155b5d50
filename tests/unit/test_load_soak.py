"""The soak benchmark's pacing and counting (``load/soak.py``): jobs go out as they come, a
lost job and a duplicate execution are counted from one byte per job, and the flatness check
compares the right ends of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from load.e2e import Service
from load.soak import (
    FLAT_TOLERANCE,
    StartCounts,
    dirs_mib,
    due_ms,
    flatness,
    jobs_to_send,
    minute_line,
    minute_record,
    process_names,
)


def test_jobs_are_sent_as_their_time_comes_and_each_is_due_the_lead_after() -> None:
    rate, duration = 100.0, 10.0
    sent = [jobs_to_send(rate, duration, t / 10) for t in range(0, 120)]
    assert sent[0] == 1  # the first at once, not a burst of the first second
    assert sent[10] == 101  # one second in: a second's worth
    assert all(b - a <= 11 for a, b in zip(sent, sent[1:], strict=False))  # paced
    assert sent[-1] == 1000  # never more than the run's jobs
    assert due_ms(1_000_000, 5.0, rate, 0) == 1_005_000
    assert due_ms(1_000_000, 5.0, rate, 250) == 1_007_500  # sent 2.5 s in, due 5 s later


def test_lost_jobs_and_duplicate_executions_are_counted() -> None:
    counts = StartCounts(4)
    assert counts.add("soak-0") is True
    assert counts.add("soak-2") is True
    assert counts.add("soak-2") is False  # executed again
    assert counts.add("probe-1") is None  # not one of the measured jobs
    assert counts.add("soak-9") is None
    assert (counts.started, counts.executions, counts.duplicates) == (2, 3, 1)
    assert counts.not_started(4) == [1, 3]
    assert counts.not_started(2) == [1]  # only jobs sent are asked about


def sample(t: float, **rss: float) -> dict[str, Any]:
    return {"t": t, "rss_mib": rss}


def test_flatness_compares_the_start_and_the_end_of_the_last_half() -> None:
    # 20 minutes: the last half starts at 600 s; each end is a minute's mean.
    samples = [sample(t, sink=400 + t, worker=100) for t in range(0, 1201, 10)]
    flat = flatness(samples, 1200)
    # sink: mean of 600..660 (1,030) against mean of 1,140..1,200 (1,570): growing
    assert flat["sink"]["start_mib"] == 1030 and flat["sink"]["end_mib"] == 1570
    assert flat["sink"]["flat"] is False
    assert flat["worker"]["flat"] is True and flat["worker"]["change"] == 0
    # the warm-up (first half) does not count: a process that grew then held is flat
    held = [sample(t, sink=min(900, 300 + t)) for t in range(0, 1201, 10)]
    assert flatness(held, 1200)["sink"]["flat"] is True
    within, past = (100 * (1 + FLAT_TOLERANCE) + d for d in (-0.1, 0.1))
    assert flatness([sample(600, x=100), sample(1200, x=within)], 1200)["x"]["flat"] is True
    assert flatness([sample(600, x=100), sample(1200, x=past)], 1200)["x"]["flat"] is False
    # a short run sampled more coarsely than its window still compares its two ends
    short = flatness([sample(5, x=50), sample(15, x=100), sample(25, x=200), sample(31, x=1)], 30)
    assert (short["x"]["start_mib"], short["x"]["end_mib"], short["x"]["flat"]) == (100, 200, False)


def test_a_minute_has_the_lateness_of_its_starts_and_the_mean_rss() -> None:
    samples = [
        {"rss_mib": {"sink": 500.0}, "lag": {"sink": 3}, "sent": 10, "started": 8},
        {"rss_mib": {"sink": 700.0}, "lag": {"sink": 0}, "sent": 20, "started": 19},
    ]
    record = minute_record(3, [float(v) for v in range(1, 101)], samples)
    assert record["minute"] == 3
    assert record["lateness_ms"] == {"n": 100, "p50": 50.0, "p99": 99.0, "max": 100.0}
    assert record["rss_mib"] == {"sink": 600.0}
    assert (record["sent"], record["started"], record["lag"]) == (20, 19, {"sink": 0})


def test_each_process_has_a_name_of_its_own_in_the_timeline() -> None:
    services = [Service("scheduler", 10), Service("scheduler", 11), Service("worker", 12)]
    services += [Service("sink", 13), Service("broker", 14)]
    assert process_names(services) == {
        10: "scheduler-0",
        11: "scheduler-1",
        12: "worker",
        13: "sink",
        14: "broker",
    }


def test_a_minute_line_says_a_lag_the_broker_did_not_answer_as_a_gap() -> None:
    samples = [{"rss_mib": {"sink": None}, "lag": {"sink": None, "worker": 12_000}}]
    line = minute_line(minute_record(1, [], samples))
    assert "lag sink -, worker 12,000" in line and "RSS MiB sink -" in line


def test_disk_is_what_the_files_under_the_directories_take(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"x" * 2**20)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "g").write_bytes(b"y" * 2**20)
    assert 2 <= dirs_mib([tmp_path / "a", tmp_path / "c"]) < 2.1
    assert dirs_mib([tmp_path / "missing"]) is None
