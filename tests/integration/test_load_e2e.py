"""The end-to-end load generator on the real pipeline (scheduler, worker and sink processes):
its counting must find a lost job and a duplicate execution that the test causes on purpose."""

from __future__ import annotations

from pathlib import Path

from load.e2e import Config, read_starts, report, run_once


def test_the_generator_counts_a_lost_job_and_a_duplicate_execution(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    config = Config(
        rate=20,
        window_s=2,
        lead_s=2,
        partitions=2,
        settle_s=0,
        timeout_s=60,
        sabotage_lose=1,  # e2e-0 is expected but never submitted
        sabotage_duplicate=1,  # the first run seen is dispatched again as attempt 2
        warmup_jobs=30,  # run before the measured jobs and never counted with them
        warmup_rate=30,
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
    assert (
        len({s.job_id for s in read_starts(tmp_path / result.config["topic_prefix"] / "warmup")})
        == 30
    )
