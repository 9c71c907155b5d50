"""A real stack for the tests that act as a user: `jobwheel scheduler`, `jobwheel worker`
(``jobwheel.consumers.demo`` and ``tests.tasks``) and `jobwheel serve`, each a process with its own
data dir, plus the CLI and the API as a user reaches them."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import (
    Procs,
    jobwheel_argv,
    log_tail,
    scaled,
    start_worker,
    wait_for_group,
    wait_until,
)


@dataclass
class Stack:
    settings: Any
    env: dict[str, str]
    tmp: Path
    token: str | None = None

    @property
    def url(self) -> str:
        return self.settings.status_api_url

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            jobwheel_argv(["jobwheel", *args]),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=scaled(90),
            stdin=subprocess.DEVNULL,
        )

    def ok(self, *args: str) -> str:
        result = self.cli(*args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=scaled(30)) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get(self, path: str) -> Any:
        code, payload = self.call("GET", path)
        return payload if code == 200 else None

    def job(self, job_id: str) -> dict[str, Any] | None:
        detail = self.get(f"/jobs/{job_id}")
        return None if detail is None else detail["job"]

    def reaches(self, job_id: str, state: str, timeout_s: float = 60) -> dict[str, Any]:
        return wait_until(
            lambda: (j := self.job(job_id)) is not None and j["state"] == state and j,
            timeout_s,
            interval_s=0.3,
            message=f"{job_id} never reached {state}: {self.get(f'/jobs/{job_id}')}",
        )


def api_up(url: str) -> bool:
    """Does the status API at ``url`` answer ``/health`` with 200 (not serving yet: False)?"""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_for_api(url: str, log_path: Path, timeout_s: float = 90) -> None:
    """Wait until the status API at ``url`` is up; if it never is, the failure shows the tail
    of its process's log (``log_path``), where the reason is."""
    wait_until(lambda: api_up(url), timeout_s, message=f"API not up:\n{log_tail(log_path)}")


def start_stack(
    settings: Any,
    env: dict[str, str],
    procs: Procs,
    tmp_path: Path,
    *,
    token: str | None = None,
    worker_env: dict[str, str] | None = None,
) -> Stack:
    """Scheduler, worker and status API running, the worker owning every runs partition."""

    def data(name: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**env, **(extra or {}), "JOBWHEEL_DATA_DIR": str(tmp_path / name)}

    secret = {"JOBWHEEL_API_TOKEN": token} if token else {}
    procs.spawn(["jobwheel", "scheduler"], data("scheduler"), tmp_path / "scheduler.log")
    start_worker(procs, data("worker", worker_env), tmp_path / "worker.log")
    serve_log = tmp_path / "serve.log"
    procs.spawn(["jobwheel", "serve"], data("serve", secret), serve_log)
    wait_for_api(settings.status_api_url, serve_log)
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    return Stack(settings, data("cli", secret), tmp_path, token)
