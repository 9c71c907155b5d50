"""The end-to-end load generator on the real pipeline (scheduler, worker and sink processes):
its counting must find a lost job and a duplicate execution that the test causes on purpose."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from load.e2e import Config, read_starts, report, run_once


def small_run(**sabotage: int) -> Config:
    """40 jobs over 2 s on 2 partitions, after 30 warm-up jobs that are never counted."""
    return Config(
        rate=20,
        window_s=2,
        lead_s=2,
        partitions=2,
        settle_s=0,
        timeout_s=60,
        warmup_jobs=30,
        warmup_rate=30,
        **sabotage,
    )


def test_the_generator_counts_a_lost_job_and_a_duplicate_execution(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    config = small_run(
        sabotage_lose=1,  # e2e-0 is expected but never submitted
        sabotage_duplicate=1,  # the first run seen is dispatched again as attempt 2
    )
    result = run_once(config, kafka_bootstrap, tmp_path)
    t = result.tally
    print(report(result))
    assert result.submitted == 39
    assert t["lost"] == ["e2e-0"]
    (doubled,) = t["sabotaged_duplicates"]
    assert t["duplicated_runs"] == [doubled]
    assert (t["started_jobs"], t["executions"], t["duplicates"]) == (39, 40, 1)
    assert t["fired_runs"] == 39
    assert t["start_lateness_ms"]["max"] is not None
    assert not result.passed  # a lost job fails the run whatever the lateness
    assert set(result.cpu_s_per_job) == {"scheduler", "worker", "sink"}
    # Each process's CPU by thread family: what its threads alive at the end used, so at
    # most the process's figure and most of it, give or take a clock tick per thread: /proc
    # counts each thread's time in whole ticks, the process's once for all (a CI run's
    # worker: 9 ticks in all, 4 by family, its Kafka client's threads each under a tick).
    # The scheduler's own Python and its Kafka client both work.
    for role, total in result.cpu_s_per_job.items():
        families = result.cpu_s_per_job_by_family[role]
        ticks = result.threads[role] / os.sysconf("SC_CLK_TCK") / result.config["jobs"]
        assert total is not None and result.threads[role] > 0
        assert 0.5 * total - ticks <= sum(families.values()) <= total + ticks, (
            role,
            total,
            families,
            result.threads[role],
        )
    scheduler = result.cpu_s_per_job_by_family["scheduler"]
    assert scheduler["python"] > 0 and scheduler["librdkafka"] > 0, scheduler
    # Where a due run waited in the scheduler, from its metrics from the first due time on: the
    # measured jobs' runs went out in transactions, each with time in every phase.
    transactions = result.transactions
    assert transactions is not None and transactions["count"] >= 1, transactions
    phases = transactions["ms_each"]
    assert set(phases) == {"open", "produce", "offsets", "end", "state"}, phases
    assert all(ms > 0 for ms in phases.values()), phases
    assert "scheduler transactions:" in report(result)
    assert (
        len({s.job_id for s in read_starts(tmp_path / result.config["topic_prefix"] / "warmup")})
        == 30
    )


def test_the_accounting_counts_each_topics_records_of_the_measured_jobs_only(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Records per job (issue 32's yardstick) must count what the measured jobs wrote, not the
    warm-up's, and put each topic on its writers and readers."""
    config = small_run(sabotage_duplicate=1)  # one run record more than jobs, by the generator
    result = run_once(config, kafka_bootstrap, tmp_path)
    print(report(result))
    acc = result.records
    n = acc["jobs"]
    assert n == 40
    kinds = {c["kind"]: c for c in acc["by_topic"].values()}
    # Exactly the 40 measured requests (the 30 warm-up ones came before the span began).
    assert round(kinds["requests"]["records"] * n) == 40
    assert round(kinds["runs"]["records"] * n) == 41
    # Every run gets its verdict (one ack at least; a quick run's STARTED rides with it).
    assert round(kinds["acks"]["records"] * n) >= 41
    assert kinds["changelog"]["records"] >= 1
    assert kinds["status"]["records"] >= 1
    # Transactions leave markers: the scheduler's topics use more offsets than they hold records.
    assert kinds["runs"]["offsets"] > kinds["runs"]["records"]
    assert kinds["__consumer_offsets"]["offsets"] > 0
    assert all(c["payload_bytes"] > 0 for k, c in kinds.items() if not k.startswith("__"))
    scheduler = acc["by_process"]["scheduler"]
    assert scheduler["read_records"] == pytest.approx(
        kinds["requests"]["records"] + kinds["acks"]["records"]
    )
    assert acc["by_process"]["sink"]["read_records"] == pytest.approx(
        kinds["status"]["records"] + kinds["acks"]["records"]
    )
    assert "records per job:" in report(result)
