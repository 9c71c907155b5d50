"""Queues added at run time, and one worker process serving several queues, on the real broker.

``jobwheel queues add NAME`` creates the queue's runs topic while a scheduler runs: the
scheduler, which rejected a job naming the queue before, takes its jobs after it without a
restart or a new ``JOBWHEEL_QUEUES``, a client with the old settings stops refusing it, and
``jobwheel worker --queue alpha --queue beta`` runs both queues' jobs in one process, one
group member per queue, with the worker's metrics by queue.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from jobwheel.consumers.status.pools import read_pools
from jobwheel.deploy.broker import free_port
from jobwheel.errors import ValidationError
from jobwheel.kafka.replication import replication_report
from jobwheel.producers.client import JobClient
from jobwheel.schemas.models import State
from tests.conftest import settings_env, settings_on
from tests.integration.scheduler_support import TopicTail, start_scheduler, two_pool_jobs
from tests.support import (
    file_lines,
    jobwheel_argv,
    log_tail,
    metric,
    scaled,
    start_worker,
    wait_for_group,
    wait_until,
)


def _jobwheel(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobwheel_argv(["jobwheel", *argv]),
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(420)  # the sum of its waits
def test_a_queue_added_at_run_time_is_served_by_one_worker_with_another_queue(
    kafka_bootstrap: str, procs: Any, tmp_path: Path
) -> None:
    settings = settings_on(kafka_bootstrap, tmp_path, queues="alpha")  # beta: not declared
    env = settings_env(settings)
    start_scheduler(procs, env, tmp_path / "s1")
    topics = settings.topics
    tail = TopicTail(settings)
    try:
        # Before: a client with the settings refuses beta up front; one that believes in it
        # sends, and the scheduler rejects the job naming the queue and the command to add it.
        with JobClient(settings, task_check="off") as client, pytest.raises(ValidationError) as no:
            client.schedule("refused", task="b.work", queue="beta", now=True)
        assert "'beta' is not a queue" in str(no.value)
        assert "jobwheel queues add" in str(no.value)
        believer = settings.model_copy(update={"queues": "alpha,beta"})
        with JobClient(believer, task_check="off") as client:
            early = client.schedule("early", task="b.work", queue="beta", now=True)
        [rejected] = tail.settled(
            lambda: tail.events(early, State.REJECTED) or None, "the early job's REJECTED"
        )
        assert "unknown queue 'beta'" in (rejected.reason or "")
        assert "jobwheel queues add beta" in (rejected.reason or "")

        # The queue is added: its topic, co-partitioned; a second add changes nothing.
        added = _jobwheel(env, "queues", "add", "beta")
        assert added.returncode == 0, added.stderr
        assert f"added queue beta: runs topic {topics.runs_for('beta')} (4 partitions)" in (
            added.stdout
        )
        again = _jobwheel(env, "queues", "add", "beta")
        assert again.returncode == 0 and "already there: queue beta" in again.stdout, again
        listed = _jobwheel(env, "queues", "list")
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
        assert set(rows) == {"default", "alpha", "beta"}, listed.stdout
        assert "declared" in rows["alpha"] and "added" in rows["beta"], listed.stdout
        # `jobwheel health`'s replication check watches the added topic too.
        watched = Counter(p.topic for p in replication_report(settings, scaled(10)).partitions)
        assert watched[topics.runs_for("beta")] == 4, watched
        bad = _jobwheel(env, "queues", "add", "no good")
        assert bad.returncode == 2 and "is not a queue name" in bad.stderr, bad
        # A reader of the new topic too (beta only in this reader's settings).
        tail.close()
        tail = TopicTail(settings.model_copy(update={"queues": "alpha,beta"}))

        # One worker process, both queues: one group member each.
        port = free_port()
        log_path = tmp_path / "worker.log"
        worker = start_worker(
            procs,
            {**env, "JOBWHEEL_METRICS_PORT": str(port)},
            log_path,
            "--queue",
            "alpha",
            "--queue",
            "beta",
            tasks="tests.pool_tasks_a,tests.pool_tasks_b",
        )
        for queue in ("alpha", "beta"):
            try:
                wait_for_group(settings, settings.worker_group_for(queue), topics.runs_for(queue))
            except Exception:
                raise AssertionError(f"{queue} never got ready:\n{log_tail(log_path)}") from None

        # After: the same settings (no beta in them) schedule on beta; nothing restarted.
        n = 100
        log_a, log_b = tmp_path / "a.lines", tmp_path / "b.lines"
        jobs = two_pool_jobs(n, log_a, log_b)
        with JobClient(settings, task_check="off") as client:
            client.schedule_many(jobs)
        try:
            wait_until(lambda: len(file_lines(log_a)) >= n and len(file_lines(log_b)) >= n, 120)
        except AssertionError:
            raise AssertionError(
                f"not every run executed: {len(file_lines(log_a))} of {n} alpha, "
                f"{len(file_lines(log_b))} of {n} beta; rejected: "
                f"{len(tail.events(state=State.REJECTED))}\n{log_tail(log_path)}"
            ) from None
        tail.settled(
            lambda: len({e.job_id for e in tail.events(state=State.SUCCEEDED)}) >= 2 * n or None,
            "every run's SUCCEEDED",
            timeout_s=60,
        )
        # Each run executed once, in the one worker process, dispatched on its queue's topic.
        for log, prefix in ((log_a, "a-"), (log_b, "b-")):
            ran = [line.rsplit(" ", 1) for line in file_lines(log)]
            assert len(ran) == n, f"{n - len({run for run, _ in ran})} executed twice"
            assert {run.split("@")[0] for run, _ in ran} == {f"{prefix}{i}" for i in range(n)}
            assert {int(pid) for _, pid in ran} == {worker.pid}
        assert tail.duplicate_dispatches() == {}
        on_beta = Counter(r.job_id for r in tail.runs_on[topics.runs_for("beta")])
        assert on_beta == Counter({f"b-{i}": 1 for i in range(n)})
        assert tail.runs_of(early) == []
        assert tail.events(state=State.FAILED) == []
        assert [e.job_id for e in tail.events(state=State.REJECTED)] == [early]
        # The worker's metrics, by queue; the pools' signals know the added queue.
        base = f"http://127.0.0.1:{port}"
        for queue, task in (("alpha", "a.work"), ("beta", "b.work")):
            done = metric(base, "jobwheel_worker_runs_total", queue=queue, task=task,
                          state="SUCCEEDED")  # fmt: skip
            assert done == n
            assert metric(base, "jobwheel_worker_partitions", queue=queue) == 4
        signals = {p.queue: p for p in read_pools(settings)}
        assert set(signals) == {"default", "alpha", "beta"}
        assert signals["beta"].group == settings.worker_group_for("beta")

        # One stop signal stops both pools; a clean exit.
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(scaled(60)) == 0, log_tail(log_path)
    finally:
        tail.close()


def readme_second_pool() -> str:
    """The README's "Second pool in three lines", as written."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    after = text.split("Second pool in three lines", 1)[1]
    block = after.split("```sh\n", 1)[1].split("```", 1)[0]
    return "\n".join(line.strip() for line in block.splitlines() if line.strip())


MY_REPORTS = """
from jobwheel.consumers.worker import task


@task("reports.build", queue="reports")
def build() -> str:
    return "built"
"""


@pytest.mark.timeout(300)
def test_the_readmes_second_pool_runs_as_written_beside_a_running_scheduler(
    settings: Any, procs: Any, tmp_path: Path
) -> None:
    lines = readme_second_pool()
    assert lines.count("\n") == 2 and "jobwheel queues add reports" in lines, lines
    env = settings_env(settings)
    start_scheduler(procs, env, tmp_path / "s1")
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_reports.py").write_text(MY_REPORTS, encoding="utf-8")
    shell_env = {
        **env,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(work),
    }
    log_path = tmp_path / "readme.log"
    # The lines run in one shell in the scratch folder; it waits on the worker it started.
    shell = procs.spawn(["bash", "-ec", f"cd {work}\n{lines}\nwait"], shell_env, log_path)
    job = wait_until(
        # `jobwheel submit` prints the job's id (a new one: 32 hex digits) on a line of its own
        lambda: next((w for w in file_lines(log_path) if re.fullmatch("[0-9a-f]{32}", w)), None),
        60,
        0.2,
    )
    tail = TopicTail(settings.model_copy(update={"queues": "reports"}))
    try:
        done = tail.settled(
            lambda: tail.events(job, State.SUCCEEDED) or None, "the README job's SUCCEEDED", 120
        )
        assert done[0].queue == "reports"
        assert [r.job_id for r in tail.runs_on[settings.topics.runs_for("reports")]] == [job]
        assert tail.runs_on[settings.topics.runs] == []
    finally:
        tail.close()
    assert shell.poll() is None, log_tail(log_path)  # the worker still serves
