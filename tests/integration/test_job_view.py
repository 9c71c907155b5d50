"""The job view after the documented fix for a misspelt task, on a real stack, read again once
the status store has merged its parts: every view shows what the latest events say."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.stack_support import start_stack, wait_for_api
from tests.support import Procs, scaled, stop, wait_until

# Merging is what made the views forget: OPTIMIZE ... FINAL does every merge at once. The
# embedded store opens in one process only, so it runs in its own while `jobwheel serve` is
# stopped (and this test process never opens an engine of its own).
MERGE = """
from jobwheel.consumers.status.store import StatusStore
from jobwheel.settings import get_settings

store = StatusStore.from_settings(get_settings(), migrate=False)
for table in ("job_state", "run_state"):
    store.client.command(f"OPTIMIZE TABLE {table} FINAL")
print(store.query(
    "SELECT table, count() FROM system.parts WHERE database = currentDatabase() "
    "AND table IN ('job_state', 'run_state') AND active GROUP BY table ORDER BY table"
)[2])
store.close()
"""


# Its waits: the stack (90 + 60), the dead run (60), the replayed run (60), serve stopped (30),
# the merge (60), serve again (90), CLI calls and margins (120).
@pytest.mark.timeout(90 + 60 + 60 + 60 + 30 + 60 + 90 + 120)
def test_a_job_scheduled_again_with_another_task_shows_it_everywhere_after_the_merges(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    stack = start_stack(settings, jobwheel_env, procs, tmp_path)
    job_id = f"typo-{uuid.uuid4().hex[:8]}"

    # A typo: the run is DEAD (no worker registers demo.ecko), and so is the one-off job.
    stack.ok("submit", "--id", job_id, "--task", "demo.ecko", "--now")
    stack.reaches(job_id, "DEAD")
    # The README's fix: the job again under its id with the right task, then the replay.
    stack.ok("submit", "--id", job_id, "--task", "demo.echo", "--in", "1h", "--args", "[7]")
    stack.reaches(job_id, "SCHEDULED")
    stack.ok("dlq", "replay", "--job", job_id)

    def replayed() -> list[dict[str, Any]] | None:
        detail = stack.get(f"/jobs/{job_id}")
        runs = detail["runs"] if detail else []
        return runs if runs and all(r["state"] == "SUCCEEDED" for r in runs) else None

    (run,) = wait_until(
        replayed, 60, 0.5, f"the replay never SUCCEEDED: {stack.get(f'/jobs/{job_id}')}"
    )
    assert run["result"] == [7]  # demo.echo ran it

    # Every part merged: the status service stopped (its sink has written what it read, the
    # views above saw it), the store merged in a process of its own, the service started again.
    serve = next(p for p in procs if "serve" in p.args)
    stop(serve, signal.SIGTERM, timeout_s=30)
    serve_env = {**jobwheel_env, "JOBWHEEL_DATA_DIR": str(tmp_path / "serve")}
    merged = subprocess.run(
        [sys.executable, "-c", MERGE],
        env=serve_env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.strip() == "[('job_state', 1), ('run_state', 1)]", merged.stdout
    serve_log = tmp_path / "serve-again.log"
    procs.spawn(["jobwheel", "serve"], serve_env, serve_log)
    wait_for_api(stack.url, serve_log)

    # The API: the job, its run, the list by task.
    detail = stack.get(f"/jobs/{job_id}")
    assert detail["job"]["task"] == "demo.echo", detail["job"]
    assert [r["task"] for r in detail["runs"]] == ["demo.echo"], detail["runs"]
    assert stack.get(f"/runs/{run['run_id']}")["run"]["task"] == "demo.echo"
    by_task = stack.get("/jobs?task=demo.echo")
    assert [j["job_id"] for j in by_task["jobs"]] == [job_id], by_task
    assert stack.get("/jobs?task=demo.ecko")["jobs"] == []
    # The CLI: status and list.
    status = stack.ok("status", job_id).splitlines()
    assert "  task=demo.echo  " in status[0], status
    (listed,) = [line for line in stack.ok("list").splitlines() if job_id in line]
    assert "  task=demo.echo  " in listed, listed
    # The console's job page.
    with urllib.request.urlopen(f"{stack.url}/console/jobs/{job_id}", timeout=scaled(30)) as r:
        page = r.read().decode()
    assert "<code>demo.echo</code>" in page and "<code>demo.ecko</code>" not in page
