"""The README's examples, run as written from a scratch folder, as a new user runs them.

The examples are read out of README.md (the "Try it" session, `my_tasks.py` and its worker
command, the SDK script and what it prints), so this test fails when the README drifts from
what jobwheel does. The stack is what `make run` starts (scheduler, a worker with the demo
tasks, the status service, one data dir), pointed at the test's broker and topics; commands
run through a shell in the scratch folder with the venv's `jobwheel` and `python` on PATH and
no PYTHONPATH, so a module is found the way a user's would be.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.stack_support import wait_for_api
from tests.support import Procs, log_tail, scaled, stop, wait_for_group, wait_until

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SAMPLE_ID = re.compile(r"\b[0-9a-f]{32}\b")


def section(title: str) -> str:
    text = README.read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)\n```", text, re.DOTALL)


def session(block: str) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` of a ``$ ``-prompted shell session."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(block.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + " " + next(lines).strip()
            steps.append((command, []))
        else:
            steps[-1][1].append(line)
    return steps


class User:
    """A shell in the scratch folder with the venv's commands on PATH and the stack's env."""

    def __init__(self, env: dict[str, str], scratch: Path, api: str) -> None:
        self.env = env
        self.scratch = scratch
        self.api = api

    def sh(self, command: str) -> subprocess.CompletedProcess[str]:
        command = command.replace("localhost:8080", self.api)
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.scratch,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=scaled(90),
            stdin=subprocess.DEVNULL,
        )

    def ok(self, command: str) -> subprocess.CompletedProcess[str]:
        result = self.sh(command)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        return result

    def until_ok(self, command: str, check: Any = lambda r: True) -> subprocess.CompletedProcess:
        last: list[subprocess.CompletedProcess[str]] = []

        def done() -> subprocess.CompletedProcess[str] | None:
            last[:] = [self.sh(command)]
            return last[0] if last[0].returncode == 0 and check(last[0]) else None

        try:
            return wait_until(done, 90, interval_s=1.0)
        except AssertionError:
            raise AssertionError(f"{command!r} never did as the README shows: {last}") from None

    def spawn(self, command: str, log: Path, procs: Procs) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.scratch,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.add(proc, log)
        return proc


def _matches(shown: str, real: str) -> bool:
    """One field of a `jobwheel status` line: a time, the id field, a state word, a key=value."""
    real = real.strip()
    key, eq, _ = shown.partition("=")
    if not eq and re.match(r"^\d{4}-\d\d-\d\dT", shown):
        return bool(re.match(r"^\d{4}-\d\d-\d\dT", real))  # a time
    if not eq and " " in shown:  # "job 5e0f...", "run 5e0f...@1795942641000"
        return real.split()[0] == shown.split()[0]
    if not eq or key in ("task", "attempts", "next_fire"):
        return real == shown  # a state, or a value the README promises
    return real.split("=", 1)[0] == key  # times, ids, durations: the key


def same_layout(shown: str, real: str) -> bool:
    """A README line of `jobwheel status` output against the real one: the same fields in the
    same order (``...`` stands for fields left out)."""
    real_fields = real.strip().split("  ")
    position = 0
    for field in (f.strip() for f in shown.strip().split("  ") if f.strip()):
        if field == "...":
            continue
        while position < len(real_fields) and not _matches(field, real_fields[position]):
            position += 1
        if position == len(real_fields):
            return False
        position += 1
    return True


@pytest.mark.timeout(480)
def test_the_readme_examples_run_as_written_from_a_scratch_folder(
    settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {k: v for k, v in jobwheel_env.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["JOBWHEEL_DATA_DIR"] = str(tmp_path / "data")  # one data dir, as `make run` has
    user = User(env, scratch, f"127.0.0.1:{settings.api_port}")

    # What `make run` starts.
    user.spawn("jobwheel scheduler", tmp_path / "scheduler.log", procs)
    demo_worker = user.spawn(
        "jobwheel worker --tasks jobwheel.consumers.demo", tmp_path / "w.log", procs
    )
    user.spawn("jobwheel serve", tmp_path / "serve.log", procs)
    wait_for_api(settings.status_api_url, tmp_path / "serve.log")
    wait_for_group(settings, settings.worker_group, settings.topics.runs)

    # --- "Try it" ---------------------------------------------------------------------------
    (try_it,) = blocks(section("Try it"), "sh")
    ids: dict[str, str] = {}  # README's sample id -> the real one
    cron_job = ""
    for command, expected in session(try_it):
        for sample, real in ids.items():
            command = command.replace(sample, real)
        if command.startswith("jobwheel status "):
            job_line = expected[0].split("  ")[1].strip()  # the state the README shows
            result = user.until_ok(command, lambda r, s=job_line: f"  {s}  " in r.stdout)
            real_lines = result.stdout.splitlines()
            assert real_lines[0:1] and same_layout(expected[0], real_lines[0]), (expected, result)
            assert same_layout(expected[1], real_lines[1]), (expected[1], real_lines[1])
            assert real_lines[2] == expected[2] == "events:"
            shown_states = [line.split()[1] for line in expected[3:]]
            real_states = [line.split()[1] for line in real_lines[3:]]
            assert real_states == shown_states, result.stdout
            for shown, real in zip(expected[3:], real_lines[3:], strict=True):
                assert same_layout(shown, real), (shown, real)
        elif "pause|resume|trigger|cancel" in command:
            for verb in ("pause", "resume", "trigger", "cancel"):
                line = command.replace("pause|resume|trigger|cancel", verb)
                said = user.ok(line.replace("JOB_ID", cron_job)).stdout.strip()
                assert said.startswith(f"{cron_job}: {verb} "), said
        elif command.startswith("jobwheel health"):
            user.until_ok(command)  # every part answers (the scheduler may still be joining)
        else:
            result = user.ok(command)
            out = result.stdout.splitlines()
            if command.startswith("jobwheel submit"):
                (job_id,) = out
                assert SAMPLE_ID.fullmatch(job_id), out
                if expected:
                    ids[expected[0]] = job_id
                if "--cron" in command:
                    cron_job = job_id
            elif command.startswith("curl"):
                assert json.loads(result.stdout)["command"] == "schedule", result.stdout
            elif expected:
                assert out == expected, (command, out)
    completed = user.ok("jobwheel list --state COMPLETED --since 1h").stdout
    assert list(ids.values())[0] in completed
    assert cron_job and user.ok(f"jobwheel status {cron_job}").stdout.startswith(
        f"job {cron_job}  CANCELLED  "
    )

    # --- every SDK snippet that runs next to `make run`, as written, in a file of its own -----
    sdk = section("Client SDK")
    snippets = []
    for code in blocks(sdk, "python"):
        first = code.splitlines()[0]
        if "with `make run` up" not in first:
            continue
        name, run_it = re.fullmatch(r"# (\S+\.py); .*: (python \S+\.py)", first).groups()
        (scratch / name).write_text(code + "\n")
        ran = user.ok(run_it)
        assert (ran.stdout, ran.stderr) == ("{'x': 1}\n", ""), (name, ran)
        snippets.append(name)
    assert snippets == ["wait_for_echo.py"]  # the `client.wait` example ran

    # --- my_tasks.py and its worker, started in its folder -----------------------------------
    execution = section("Execution: workers and at-least-once")
    (tasks_code,) = [b for b in blocks(execution, "python") if "# my_tasks.py" in b]
    (worker_command,) = re.findall(r"(jobwheel worker --tasks \S+)", tasks_code.splitlines()[0])
    (scratch / "my_tasks.py").write_text(tasks_code + "\n")
    # Only this stack's worker may get runs: one group, one set of tasks (the README says so).
    assert stop(demo_worker, signal.SIGTERM, timeout_s=60) == 0
    worker = user.spawn(worker_command, tmp_path / "my_tasks_worker.log", procs)
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    assert worker.poll() is None, log_tail(tmp_path / "my_tasks_worker.log")

    # --- the SDK script and what it prints ---------------------------------------------------
    sdk = section("Client SDK")
    sdk_code = blocks(sdk, "python")[0]
    shows = re.search(r"It prints[^\n]*\n\n```\n(.*?)\n```", sdk, re.DOTALL)
    assert shows, "the README shows what the SDK script prints"
    printed = shows[1].splitlines()
    name, run_it = re.fullmatch(
        r"# (\S+\.py); .*: (python \S+\.py)", sdk_code.splitlines()[0]
    ).groups()
    (scratch / name).write_text(sdk_code + "\n")
    result = user.ok(run_it)
    (job_id,) = set(SAMPLE_ID.findall(result.stdout))
    (sample,) = set(SAMPLE_ID.findall("\n".join(printed)))
    assert result.stdout.splitlines() == [line.replace(sample, job_id) for line in printed]
    assert result.stderr == ""  # the task is one my_tasks registers: no warning
    user.until_ok(
        f"jobwheel status {job_id}", lambda r: r.stdout.startswith(f"job {job_id}  PAUSED  ")
    )
    # The job's task runs on the worker started in the scratch folder.
    user.ok(f"jobwheel trigger {job_id}")
    run = user.until_ok(
        f"jobwheel status {job_id} --json",
        lambda r: any(x["state"] == "SUCCEEDED" for x in json.loads(r.stdout)["runs"]),
    )
    (done,) = [x for x in json.loads(run.stdout)["runs"] if x["state"] == "SUCCEEDED"]
    assert done["worker"].endswith(f":{worker.pid}")
    # A misspelt task name: the client knows the registered ones, and says so.
    (scratch / "typo.py").write_text(
        sdk_code.replace("billing.send_invoice", "billing.send_invoce")
    )
    typo = user.ok("python typo.py")
    assert "UnknownTaskWarning: task 'billing.send_invoce' is not one the workers register" in (
        typo.stderr
    ), typo.stderr
