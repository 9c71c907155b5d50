"""The read commands of the CLI against a running `jobwheel serve`, and `jobwheel health`
against the real stack (broker, scheduler, worker, status service)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwheel.schemas.models import State
from jobwheel.settings import Settings
from tests.stack_support import wait_for_api
from tests.status_support import event, lifecycle, now_ms, produce
from tests.support import DEMO_TASKS, Procs, jobwheel_argv, log_tail, start_worker, wait_until


def jobwheel(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobwheel_argv(["jobwheel", *args]),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


API_TOKEN = "cli-test-token-5f1e0c"


@pytest.fixture
def served(
    settings: Settings, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path
) -> Iterator[dict[str, str]]:
    """A `jobwheel serve` (embedded store, sink in-process, an API token) fed with a few jobs'
    events. The returned environment holds the token, as a user's shell would."""
    t0 = now_ms() - 5_000
    events = lifecycle("cli-done", t0)
    events += [
        event(
            "cli-wait", State.SCHEDULED, seq=1, t=t0, task="demo.sleep", next_fire_ms=t0 + 9_000_000
        ),
        event("cli-bad", State.SCHEDULED, seq=1, t=t0 - 1, task="demo.fail"),
        event(
            "cli-bad",
            State.DISPATCHED,
            seq=2,
            t=t0,
            run_id="cli-bad@1",
            attempt=1,
            task="demo.fail",
            scheduled_time_ms=t0,
        ),
        event(
            "cli-bad",
            State.FAILED,
            seq=2,
            t=t0 + 9,
            run_id="cli-bad@1",
            attempt=1,
            error="ValueError: nope",
            worker="w:2",
        ),
        event("cli-bad", State.DEAD, seq=3, t=t0 + 10, run_id="cli-bad@1", attempt=1),
        event("cli-bad", State.DEAD, seq=4, t=t0 + 10),  # the one-off job, after its run
    ]
    produce(settings, events)
    log = tmp_path / "serve.log"
    env = {**jobwheel_env, "JOBWHEEL_API_TOKEN": API_TOKEN}
    procs.spawn(["jobwheel", "serve"], env, log)
    wait_for_api(settings.status_api_url, log, 60)
    wait_until(
        lambda: '"total": 3' in jobwheel(env, "list", "--json").stdout,
        30,
        interval_s=0.3,
        message="events did not reach the store:\n" + log_tail(log),
    )
    yield env


def _status_prints_the_job_and_its_runs_one_line_each(served: dict[str, str]) -> None:
    out = jobwheel(served, "status", "cli-done")
    assert out.returncode == 0, out.stderr
    job_line, run_line, events_header, *event_lines = out.stdout.splitlines()
    assert events_header == "events:"
    states = [line.split()[1] for line in event_lines]
    assert states == ["SCHEDULED", "DISPATCHED", "STARTED", "SUCCEEDED", "COMPLETED"]
    assert job_line.startswith("job cli-done  COMPLETED  task=demo.echo")
    assert run_line.startswith("run cli-done@") and "  SUCCEEDED  " in run_line
    assert "late=7ms" in run_line and "duration=100ms" in run_line and "worker=w:1" in run_line

    failed = jobwheel(served, "status", "cli-bad").stdout
    assert failed.startswith("job cli-bad  DEAD  ") and "ValueError: nope" in failed
    assert "  FAILED  " in failed  # the attempt's event

    as_json = json.loads(jobwheel(served, "status", "cli-done", "--json").stdout)
    assert as_json["job"]["state"] == "COMPLETED" and len(as_json["runs"]) == 1


def _status_of_an_unknown_job_fails_with_a_reason(served: dict[str, str]) -> None:
    out = jobwheel(served, "status", "nope")
    assert out.returncode == 1
    assert "not found" in out.stderr and "HTTP 404" in out.stderr


def _a_unique_start_of_a_job_id_names_the_job(served: dict[str, str]) -> None:
    """`status`, the job commands and `dlq --job` take the start of an id (the README's sample
    shortens ids to their start); one that starts several ids is refused naming them, and
    nothing is sent."""
    out = jobwheel(served, "status", "cli-d")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("job cli-done  COMPLETED  "), out.stdout
    as_json = json.loads(jobwheel(served, "status", "cli-b", "--json").stdout)
    assert as_json["job"]["job_id"] == "cli-bad"
    paused = jobwheel(served, "pause", "cli-w", "--no-wait")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.strip() == "cli-wait: pause sent; the scheduler will make the job PAUSED"
    for args in (["status", "cli-"], ["pause", "cli-"], ["dlq", "list", "--job", "cli-"]):
        refused = jobwheel(served, *args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        assert refused.stdout == ""
        assert "'cli-' is the start of 3 job ids (cli-bad, cli-done, cli-wait)" in refused.stderr
        assert "give more of the id" in refused.stderr and len(refused.stderr.splitlines()) == 1
    too_short = jobwheel(served, "status", "cli")  # under 4 characters: an id, not a prefix
    assert too_short.returncode == 1 and "HTTP 404" in too_short.stderr
    assert "the start of an id names a job from 4 characters on" in too_short.stderr


def _list_filters(served: dict[str, str]) -> None:
    out = jobwheel(served, "list", "--state", "dead")
    assert out.returncode == 0, out.stderr
    assert [line.split()[1] for line in out.stdout.splitlines()] == ["cli-bad"]
    assert "1 of 1 jobs" in out.stderr
    run_state = jobwheel(served, "list", "--state", "failed")
    assert run_state.returncode == 2 and "state of a run" in run_state.stderr
    by_task = json.loads(jobwheel(served, "list", "--task", "demo.sleep", "--json").stdout)
    assert [j["job_id"] for j in by_task["jobs"]] == ["cli-wait"]
    assert json.loads(jobwheel(served, "list", "--since", "1h", "--json").stdout)["total"] == 3
    bad = jobwheel(served, "list", "--state", "RUNNING")
    assert bad.returncode == 2 and "invalid state" in bad.stderr


def _sql(served: dict[str, str]) -> None:
    out = jobwheel(
        served, "sql", "SELECT state, count() AS n FROM jobs GROUP BY state ORDER BY state"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["state\tn", "COMPLETED\t1", "DEAD\t1", "SCHEDULED\t1"]
    as_json = json.loads(jobwheel(served, "sql", "SELECT 1 AS one", "--json").stdout)
    assert as_json["rows"] == [[1]]
    refused = jobwheel(served, "sql", "DROP TABLE jobs")
    assert refused.returncode == 1 and "read-only" in refused.stderr


def _hostile_input(served: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "outfile.txt"
    out = jobwheel(served, "sql", f"SELECT 'x' INTO OUTFILE '{target}' TRUNCATE")
    assert out.returncode == 1 and "INTO OUTFILE" in out.stderr
    assert not target.exists()
    for flag, value in (("--since", "²"), ("--until", "1" * 23), ("--offset", str(2**40))):
        bad = jobwheel(served, "list", flag, value)
        assert bad.returncode == 2, (flag, bad.stdout, bad.stderr)
        assert f"invalid {flag.lstrip('-')}: " in bad.stderr and len(bad.stderr.splitlines()) == 1


def _token_required(served: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{served['JOBWHEEL_API_PORT']}/jobs"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 401
    anonymous = {k: v for k, v in served.items() if k != "JOBWHEEL_API_TOKEN"}
    out = jobwheel(anonymous, "list")
    assert out.returncode == 1 and "HTTP 401" in out.stderr and "JOBWHEEL_API_TOKEN" in out.stderr
    wrong = jobwheel({**served, "JOBWHEEL_API_TOKEN": "not-the-token"}, "status", "cli-done")
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr


def _docs_pages_work_offline_and_without_the_token(served: dict[str, str]) -> None:
    """The real `jobwheel serve` (token set): the docs page and every asset it loads come from
    it, with no token; the API calls the page makes still need one."""
    from tests.status_support import docs_assets

    base = f"http://127.0.0.1:{served['JOBWHEEL_API_PORT']}"
    with urllib.request.urlopen(f"{base}/docs", timeout=10) as resp:
        html = resp.read().decode()
    urls = docs_assets(html)
    assert urls and all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    for url in ["/", *urls]:
        with urllib.request.urlopen(f"{base}{url}", timeout=10) as resp:
            assert resp.status == 200 and resp.read(), url
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{base}/stats/states", timeout=10)
    assert info.value.code == 401


def test_read_commands_against_a_running_serve(served: dict[str, str], tmp_path: Path) -> None:
    """One `jobwheel serve` for all read commands (starting it is the slow part)."""
    _docs_pages_work_offline_and_without_the_token(served)
    _status_prints_the_job_and_its_runs_one_line_each(served)
    _status_of_an_unknown_job_fails_with_a_reason(served)
    _a_unique_start_of_a_job_id_names_the_job(served)
    _list_filters(served)
    _sql(served)
    _hostile_input(served, tmp_path)
    _token_required(served)


def test_health_checks_each_part_of_the_stack(
    served: dict[str, str], procs: Procs, tmp_path: Path
) -> None:
    start_worker(procs, served, tmp_path / "w.log", tasks=DEMO_TASKS)
    last: list[subprocess.CompletedProcess[str]] = []

    def health_shows(word: str) -> subprocess.CompletedProcess[str] | None:
        last[:] = [jobwheel(served, "health")]
        return last[0] if word in last[0].stdout else None

    try:
        partial = wait_until(lambda: health_shows("ok    workers"), 60, interval_s=1)
    except AssertionError:
        raise AssertionError(
            f"the worker never showed up:\n{last[0].stdout}{last[0].stderr}"
            + log_tail(tmp_path / "w.log")
        ) from None
    assert partial.returncode == 1
    lines = {line.split()[1]: line.split()[0] for line in partial.stdout.splitlines()}
    assert lines == {
        "broker": "ok",
        "replication": "ok",
        "schedulers": "FAIL",
        "partitions": "ok",  # nothing to read, no timer due: idle, not stuck
        "workers": "ok",
        "status": "ok",
    }

    procs.spawn(["jobwheel", "scheduler"], served, tmp_path / "s.log")
    healthy = wait_until(
        lambda: (r := jobwheel(served, "health", "--json")).returncode == 0 and r,
        90,
        interval_s=1,
        message="the scheduler never joined its group:\n" + log_tail(tmp_path / "s.log"),
    )
    assert [c["check"] for c in json.loads(healthy.stdout)["checks"]] == [
        "broker",
        "replication",
        "schedulers",
        "partitions",
        "workers",
        "status",
    ]
