"""Workers announce the tasks they serve on the compacted workers topic, and what reads it
says so: ``submit`` warns about a task no live worker serves (or refuses it with
``--require-worker``), a worker that gets a run of a task it lacks says so once, and
``GET /workers`` lists the live workers and drops one that exited cleanly. Real broker, real
``jobwheel`` processes."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

from jobwheel.producers.workers import read_workers
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import JobCommand, ScheduleJob, State
from tests.integration.scheduler_support import TopicTail, make_run, produce_runs
from tests.stack_support import wait_for_api
from tests.support import (
    DEMO_TASKS,
    Procs,
    file_lines,
    jobwheel_argv,
    log_tail,
    read_all,
    scaled,
    start_worker,
    stop,
    wait_until,
)

CODEC = Codec()


def _submit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobwheel_argv(["jobwheel", "submit", *args]),
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
        stdin=subprocess.DEVNULL,
    )


def _announced(settings: Any, pid: int, log_path: Path) -> Any:
    """Wait until the worker of ``pid`` is live on the workers topic; its record."""

    def found() -> Any:
        roster = read_workers(settings)
        assert roster is not None, "the test's topics have no workers topic"
        return next((w for w in roster.live if w.pid == pid), None)

    return wait_until(
        found, scaled(60), 0.2, f"worker {pid} never announced:\n{log_tail(log_path)}"
    )


def test_submit_warns_about_a_task_no_live_worker_serves_and_refuses_it_when_asked(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    worker_log = tmp_path / "worker.log"
    worker = start_worker(procs, jobwheel_env, worker_log, tasks=DEMO_TASKS)
    record = _announced(settings, worker.pid, worker_log)
    assert "demo.echo" in record.tasks and record.group == settings.worker_group

    typo = _submit(jobwheel_env, "--task", "demo.ecko", "--now")
    assert typo.returncode == 0, typo.stderr  # a warning: the job is sent
    assert "warning: no live worker serves task 'demo.ecko'" in typo.stderr, typo.stderr
    assert "did you mean 'demo.echo'?" in typo.stderr
    # the tasks the live workers serve
    assert "serve demo.count, demo.echo, demo.fail, demo.flaky, demo.sleep;" in typo.stderr
    served = _submit(jobwheel_env, "--task", "demo.echo", "--now")
    assert served.returncode == 0 and "warning" not in served.stderr, served.stderr

    required = _submit(jobwheel_env, "--task", "demo.echo", "--now", "--require-worker")
    assert required.returncode == 0, required.stderr
    refused = _submit(jobwheel_env, "--task", "demo.ecko", "--now", "--require-worker")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stdout == ""
    assert "no live worker serves task 'demo.ecko'" in refused.stderr
    assert "nothing was sent" in refused.stderr

    # Every record on the requests topic (read to a marker in each partition): the three
    # sent jobs are there (the reader sees sent jobs), the refused one is not.
    sent = [
        CODEC.decode(m.value())
        for m in read_all(settings, settings.topics.requests)
        if m.value() and m.value()[:2] == b"\xc3\x01"
    ]
    schedules = [c for c in sent if isinstance(c, JobCommand) and isinstance(c.body, ScheduleJob)]
    by_id = {c.job_id: c.body.task for c in schedules}
    ids = [r.stdout.strip() for r in (typo, served, required)]
    assert [by_id.get(i) for i in ids] == ["demo.ecko", "demo.echo", "demo.echo"]
    assert len(schedules) == 3, by_id


def test_a_worker_says_once_that_it_lacks_a_task_however_many_runs_of_it_come(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path, tail: TopicTail
) -> None:
    """A worker started with other --tasks than its group's: each run of a task it lacks
    fails here (DEAD), and its terminal says so once per task name, not per run."""
    worker_log = tmp_path / "worker.log"
    worker = start_worker(procs, jobwheel_env, worker_log, tasks="tests.tasks")
    _announced(settings, worker.pid, worker_log)
    runs = [make_run(settings, "demo.echo", {"i": i}) for i in range(3)]
    runs.append(make_run(settings, "demo.sleep", {"seconds": 0}))
    produce_runs(settings, runs)
    for run in runs:
        failed = tail.wait_for(run.run_id, State.FAILED, timeout_s=scaled(60))
        assert "unknown task" in (failed[0].reason or "")
    said = [line for line in file_lines(worker_log) if "does not serve" in line]
    assert len([line for line in said if "task=demo.echo" in line]) == 1, said
    assert len([line for line in said if "task=demo.sleep" in line]) == 1, said
    assert len(said) == 2, said


def test_get_workers_lists_live_workers_and_drops_one_that_exited(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    import json
    import urllib.request

    serve_log = tmp_path / "serve.log"
    procs.spawn(
        ["jobwheel", "serve"], {**jobwheel_env, "JOBWHEEL_DATA_DIR": str(tmp_path)}, serve_log
    )
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    stays = start_worker(procs, jobwheel_env, logs[0], tasks=DEMO_TASKS)
    leaves = start_worker(procs, jobwheel_env, logs[1], tasks="tests.tasks")
    url = settings.status_api_url
    wait_for_api(url, serve_log)

    def workers() -> dict[int, dict[str, Any]]:
        with urllib.request.urlopen(f"{url}/workers", timeout=scaled(30)) as resp:
            body = json.loads(resp.read())
        return {w["pid"]: w for w in body["workers"]}

    both = wait_until(
        lambda: (w := workers()) and {stays.pid, leaves.pid} <= set(w) and w,
        scaled(60),
        0.3,
        "the API never listed both workers",
    )
    assert both[stays.pid]["live"] and "demo.echo" in both[stays.pid]["tasks"]
    assert both[leaves.pid]["live"] and "test.gate" in both[leaves.pid]["tasks"]

    # The pool's signals count both announcements; nothing was dispatched, so no backlog.
    def pool() -> dict[str, Any]:
        with urllib.request.urlopen(f"{url}/queues", timeout=scaled(30)) as resp:
            return next(q for q in json.loads(resp.read())["queues"] if q["queue"] == "default")

    default = wait_until(
        lambda: (q := pool())["workers"] == 2 and q, scaled(30), 0.5, "GET /queues missed a worker"
    )
    assert (default["error"], default["unfinished"], default["waiting"]) == (None, 0, 0), default
    assert default["group"] == settings.worker_group and default["concurrency"] >= 2, default
    # The console's Workers page lists each worker with the tasks it serves, and the pools.
    with urllib.request.urlopen(f"{url}/console/cluster", timeout=scaled(30)) as resp:
        page = resp.read().decode()
    pool_row = next((r for r in page.split("<tr") if "<code>default</code>" in r), "")
    assert f"<code>{settings.worker_group}</code>" in pool_row and "2 (" in pool_row, page
    for pid, task in ((stays.pid, "demo.echo"), (leaves.pid, "test.gate")):
        row = next((r for r in page.split("<tr") if f":{pid}</code>" in r), "")
        assert f"<code>{task}</code>" in row, page

    assert stop(leaves, signal.SIGTERM, scaled(40)) == 0, log_tail(logs[1])
    # Its tombstone removes it at once; the other, still announcing, stays listed.
    after = wait_until(
        lambda: (w := workers()) and leaves.pid not in w and w,
        scaled(30),
        0.3,
        f"the stopped worker is still listed: {workers()}",
    )
    assert after[stays.pid]["live"]
