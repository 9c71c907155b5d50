"""The job state model (README, "Job states") walked on the real pipeline.

`jobwheel scheduler`, `jobwheel worker` and `jobwheel serve` run as processes; the test acts as
a user: commands with the `jobwheel` CLI (which waits for the scheduler's answer), states
through the status API. Every transition the README's table lists is taken at least once, and
the table must list every transition taken, so the documentation and the system cannot drift
apart. Along the way: refused commands leave the state alone and say why, a made-up id makes no
job, a paused job stays paused whatever a manual run does, and `list --state` finds each job
under its state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.stack_support import Stack, wait_for_api
from tests.support import (
    Procs,
    scaled,
    start_worker,
    wait_for_group,
    wait_until,
)

README = Path(__file__).resolve().parents[2] / "README.md"
LIFECYCLE = {"SCHEDULED", "RESUMED", "PAUSED", "CANCELLED", "COMPLETED", "DEAD"}


def documented_transitions() -> set[tuple[str, str]]:
    """``(from, to)`` of every row of the README's transition table."""
    section = README.read_text().split("\n## Job states\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([A-Z]+) \| [^|]+ \| [^|]+ \|$", section, re.MULTILINE)
    assert rows, "no transition table under '## Job states' in README.md"
    return {(origin.strip(), to) for origins, to in rows for origin in origins.split(",")}


class Walk(Stack):
    """A user's view of the stack (:class:`tests.stack_support.Stack`: CLI commands, job
    states from the API), stricter where a state walk needs it, and every state change seen."""

    def ok(self, *args: str) -> str:
        """Stack's ``ok``, and the CLI said nothing of an answer it did not get."""
        result = self.cli(*args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        assert "no answer" not in result.stderr and "cannot confirm" not in result.stderr, (
            args,
            result.stderr,
        )
        return result.stdout.strip()

    def refused(self, *args: str) -> str:
        result = self.cli(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        (line,) = result.stderr.splitlines()
        return line

    def get(self, path: str) -> Any:
        """The API's answer; None for a 404 only (any other failure raises: a walk must not
        read a broken API as "no such job yet")."""
        code, payload = self.call("GET", path)
        if code == 404:
            return None
        assert code == 200, (path, code, payload)
        return payload

    def transitions(self, job_id: str) -> set[tuple[str, str]]:
        """The state changes of a job, from its job-level events in the store (its history,
        so a state passed through in a moment counts too)."""
        states: list[str] = []
        for event in self.get(f"/jobs/{job_id}")["events"]:
            if event["run_id"] is None and event["state"] in LIFECYCLE:
                state = "SCHEDULED" if event["state"] == "RESUMED" else event["state"]
                if not states or states[-1] != state:
                    states.append(state)
        return set(zip(["(new)", *states], states, strict=False))

    def run_ends(self, job_id: str, run_state: str, count: int = 1) -> list[dict[str, Any]]:
        def ended() -> list[dict[str, Any]] | None:
            detail = self.get(f"/jobs/{job_id}")
            runs = [r for r in (detail or {}).get("runs", []) if r["state"] == run_state]
            return runs if len(runs) >= count else None

        return wait_until(ended, 60, interval_s=0.3, message=f"{job_id}: no {count} {run_state}")

    def events(self, job_id: str) -> list[str]:
        return [e["state"] for e in self.get(f"/jobs/{job_id}")["events"]]

    def listed(self, state: str) -> set[str]:
        out = self.ok("list", "--state", state.lower(), "--json")
        return {j["job_id"] for j in json.loads(out)["jobs"]}


@pytest.fixture
def walk(settings: Any, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path) -> Walk:
    def env(name: str) -> dict[str, str]:
        return {**jobwheel_env, "JOBWHEEL_DATA_DIR": str(tmp_path / name)}

    procs.spawn(["jobwheel", "scheduler"], env("scheduler"), tmp_path / "scheduler.log")
    start_worker(procs, env("worker"), tmp_path / "worker.log")
    serve_log = tmp_path / "serve.log"
    procs.spawn(["jobwheel", "serve"], env("serve"), serve_log)
    wait_for_api(settings.status_api_url, serve_log)
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    return Walk(settings, {**jobwheel_env, "JOBWHEEL_DATA_DIR": str(tmp_path / "cli")}, tmp_path)


# Each of the ~60 steps waits for the scheduler, the worker and the sink (a second or two):
# the per-test timeout is their sum with room, not the default.
@pytest.mark.timeout(600)
def test_every_transition_of_the_job_state_table_on_the_real_pipeline(walk: Walk) -> None:
    w = walk
    wait = ("--wait", str(scaled(30)))
    never = str(w.tmp / "never-exists")
    fails = w.tmp / "fails"
    fails.touch()

    # A recurring job: pause, a manual run while paused, resume, refusals, cancel.
    assert w.ok("submit", "--task", "demo.echo", "--id", "tick", "--every", "1h") == "tick"
    scheduled = w.reaches("tick", "SCHEDULED")
    assert scheduled["next_fire_ms"] is not None
    w.ok("pause", "tick", *wait)
    assert w.reaches("tick", "PAUSED")["next_fire_ms"] is None
    w.ok("trigger", "tick", *wait)  # runs once; the job stays PAUSED, visibly
    w.run_ends("tick", "SUCCEEDED")
    assert w.job("tick")["state"] == "PAUSED"
    line = w.refused("pause", "tick", *wait)
    assert line == "jobwheel pause: refused: cannot pause: job is already PAUSED"
    # the answer is the job's state, not the event's name (RESUMED)
    assert w.ok("resume", "tick", *wait) == "tick: resume applied; the job is SCHEDULED"
    assert w.reaches("tick", "SCHEDULED")["next_fire_ms"] == scheduled["next_fire_ms"]
    line = w.refused("resume", "tick", *wait)
    assert line == "jobwheel resume: refused: cannot resume: job is SCHEDULED, not PAUSED"
    w.ok("cancel", "tick", *wait)
    w.reaches("tick", "CANCELLED")
    line = w.refused("cancel", "tick", *wait)  # a second cancel: an answer, not a new state
    assert line == "jobwheel cancel: refused: job is already CANCELLED"
    assert w.job("tick")["state"] == "CANCELLED"
    assert "tick" in w.listed("CANCELLED")
    assert w.refused("trigger", "tick", *wait).endswith("cannot trigger: job is CANCELLED")
    # the same id scheduled again is a new job in its place; then paused and cancelled
    w.ok("submit", "--task", "demo.echo", "--id", "tick", "--every", "1h")
    w.reaches("tick", "SCHEDULED")
    w.ok("pause", "tick", *wait)
    w.reaches("tick", "PAUSED")
    w.ok("cancel", "tick", *wait)
    w.reaches("tick", "CANCELLED")

    # One-off jobs: COMPLETED when the run succeeded, DEAD when it died; a manual run of a
    # finished job settles it again by its outcome; the same id scheduled again.
    args = json.dumps({"fail_if": never})
    w.ok("submit", "--task", "test.switch", "--id", "ok", "--now", "--args", args)
    w.reaches("ok", "COMPLETED")
    assert w.refused("cancel", "ok", *wait).endswith(
        "job is COMPLETED: it has finished, nothing is left to cancel"
    )
    w.ok(
        "submit",
        "--task",
        "test.switch",
        "--id",
        "bad",
        "--now",
        "--max-attempts",
        "1",
        "--args",
        json.dumps({"fail_if": str(fails)}),
    )
    bad = w.reaches("bad", "DEAD")
    assert "test.switch" in bad["last_error"]
    assert w.events("bad")[-2:] == ["DEAD", "DEAD"]  # the run, then the job
    assert "bad" in w.listed("DEAD") and "bad" not in w.listed("COMPLETED")
    # "ok" runs again and dies (its switch now fails): COMPLETED -> DEAD; "bad" runs again and
    # succeeds: DEAD -> COMPLETED
    w.ok(
        "submit",
        "--task",
        "test.switch",
        "--id",
        "ok",
        "--in",
        "1h",
        "--args",
        json.dumps({"fail_if": str(fails)}),
    )
    w.reaches("ok", "SCHEDULED")  # (COMPLETED -> SCHEDULED: the same id again)
    w.ok("trigger", "ok", *wait)
    w.run_ends("ok", "DEAD")
    assert w.job("ok")["state"] == "SCHEDULED"  # its 1h fire is still ahead
    w.ok("cancel", "ok", *wait)
    w.reaches("ok", "CANCELLED")
    fails.unlink()
    w.ok("trigger", "bad", *wait)
    w.reaches("bad", "COMPLETED")
    fails.touch()
    w.ok("trigger", "bad", *wait)
    w.reaches("bad", "DEAD")
    w.ok("submit", "--task", "demo.echo", "--id", "bad", "--in", "1h")
    w.reaches("bad", "SCHEDULED")  # DEAD -> SCHEDULED

    # Paused while its only run is out: it stays PAUSED when the run ends, and ends on resume.
    for job_id, fail_if, end in (("held-ok", never, "COMPLETED"), ("held-bad", str(fails), "DEAD")):
        gate, started = w.tmp / f"{job_id}.gate", w.tmp / f"{job_id}.started"
        w.ok(
            "submit",
            "--task",
            "test.switch",
            "--id",
            job_id,
            "--now",
            "--max-attempts",
            "1",
            "--args",
            json.dumps({"fail_if": fail_if, "gate": str(gate), "started": str(started)}),
        )
        w.reaches(job_id, "SCHEDULED")
        wait_until(started.exists, 60, message=f"{job_id} never started")
        w.ok("pause", job_id, *wait)
        w.reaches(job_id, "PAUSED")
        gate.touch()
        w.run_ends(job_id, "SUCCEEDED" if end == "COMPLETED" else "DEAD")
        assert w.job(job_id)["state"] == "PAUSED"
        w.ok("resume", job_id, *wait)
        w.reaches(job_id, end)

    # A command for a job that never was: refused, and no job appears.
    line = w.refused("cancel", "deadbeef", *wait)
    assert line.startswith("jobwheel cancel: refused: unknown job 'deadbeef': never scheduled")
    assert w.job("deadbeef") is None
    counts = w.get("/stats/states")
    assert counts["states"] == {"CANCELLED": 2, "COMPLETED": 1, "DEAD": 1, "SCHEDULED": 1}
    assert counts["total"] == 5  # tick, ok, bad, held-ok, held-bad: no "deadbeef"
    assert w.listed("SCHEDULED") == {"bad"}

    # What was walked is what the README documents, no more and no less.
    taken = set().union(*(w.transitions(j) for j in ("tick", "ok", "bad", "held-ok", "held-bad")))
    assert taken == documented_transitions()
