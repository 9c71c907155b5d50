"""``jobwheel up``: broker + topics + supervised services, stopped in order."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from jobwheel.deploy.broker import LocalBroker, free_port
from jobwheel.deploy.stack import SERVICES, Service, Stack
from jobwheel.schemas.models import State
from jobwheel.settings import Settings
from tests.support import BROKER_JVM_OPTIONS, Procs, jobwheel_argv, scaled, wait_until

FLAKY_SERVICE = (
    "import os, sys, time\n"
    "print('hello from', os.environ['JOBWHEEL_BOOTSTRAP_SERVERS'], flush=True)\n"
    "print('warning flaky.main: about to exit code=3', flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
    "sys.exit(3)\n"
)


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        data_dir=tmp_path / "data",
        broker_port=free_port(),
        broker_controller_port=free_port(),
        broker_heap="256m",
        topic_prefix="stack",
        partitions=4,
    )


# Each test starts its own broker and waits on it several times: its timeout is the sum of
# its waits (nominal seconds, scaled like them), not the 300 s default.
@pytest.mark.timeout(120 + 30 + 60 + 30)
def test_stack_supervises_services_and_stops_everything(tmp_path: Path):
    settings = _settings(tmp_path)
    out = io.StringIO()
    services = [
        Service("flaky", (sys.executable, "-c", FLAKY_SERVICE, "0.2"), banner="flaky is here"),
        Service("steady", (sys.executable, "-c", FLAKY_SERVICE, "600")),
        Service("off", (sys.executable, "-c", "raise SystemExit(9)"), enabled=False),
    ]
    stack = Stack(settings, services=services, out=out)
    stop = threading.Event()
    runner = threading.Thread(target=lambda: setattr(stack, "code", stack.run(stop)))
    runner.start()
    try:
        wait_until(lambda: "jobwheel stack up" in out.getvalue(), 120, message=out.getvalue())
        bootstrap = f"127.0.0.1:{settings.broker_port}"
        topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
        assert {s.name for s in settings.topics.specs()} <= set(topics)

        # A service that dies is reported loudly and restarted.
        wait_until(
            lambda: out.getvalue().count("service flaky: started") >= 2, 30, message=out.getvalue()
        )
        text = out.getvalue()
        assert "!! service flaky exited with code 3" in text
        # The terminal gets its warning; what is not a log line goes to its log file only.
        assert "[flaky] warning: about to exit code=3" in text
        assert f"[flaky] hello from {bootstrap}" not in text
        assert "flaky is here" in text
        assert "service off: disabled, skipped" in text
        log = (settings.data_dir / "logs" / "flaky.log").read_text()
        assert f"hello from {bootstrap}" in log
        steady = next(r.proc for r in stack._running if r.service.name == "steady")
        assert steady is not None and steady.poll() is None
    finally:
        stop.set()
        runner.join(scaled(60))
    assert not runner.is_alive()
    assert stack.code == 0
    assert steady.poll() is not None  # services were stopped ...
    assert LocalBroker(settings.data_dir / "kafka").running_pid() is None  # ... and the broker


@pytest.mark.timeout(180 + 120 + 30 + 90 + 5 * 60)  # + five CLI calls outside the waits
def test_jobwheel_up_runs_a_job_end_to_end_and_stops_on_sigterm(tmp_path: Path, procs: Procs):
    """What `make run` starts, used as the README says: submit, watch the status, query SQL."""
    data = tmp_path / "data"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env.update(
        JOBWHEEL_DATA_DIR=str(data),
        JOBWHEEL_BROKER_PORT=str(port),
        JOBWHEEL_BROKER_CONTROLLER_PORT=str(free_port()),
        JOBWHEEL_BROKER_HEAP="256m",
        JOBWHEEL_BROKER_JVM_OPTIONS=BROKER_JVM_OPTIONS,
        JOBWHEEL_TOPIC_PREFIX="upcli",
        JOBWHEEL_PARTITIONS="4",
        JOBWHEEL_LOG_FORMAT="text",
        JOBWHEEL_API_PORT=str(free_port()),
    )
    log = tmp_path / "up.log"
    proc = procs.spawn(["jobwheel", "up"], env, log)
    wait_until(lambda: "jobwheel stack up" in log.read_text(), 180, message=log.read_text())
    assert f"bootstrap servers: 127.0.0.1:{port}" in log.read_text()
    broker_pid = LocalBroker(data / "kafka").running_pid()
    assert broker_pid is not None
    for service in SERVICES:
        if service.enabled:
            assert f"service {service.name}: started" in log.read_text()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            jobwheel_argv(["jobwheel", *args]),
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )

    submitted = cli("submit", "--task", "demo.echo", "--in", "2s", "--args", '{"x": 1}')
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id

    def succeeded() -> str | None:
        out = cli("status", job_id)
        return out.stdout if out.returncode == 0 and "SUCCEEDED" in out.stdout else None

    status = wait_until(succeeded, 120, 1.0, f"job never SUCCEEDED:\n{log.read_text()[-3000:]}")

    def lifecycle() -> list[str] | None:
        events = json.loads(cli("status", "--json", job_id).stdout)["events"]
        states = [e["state"] for e in events]
        return states if "COMPLETED" in states else None

    states = wait_until(lifecycle, 30, 1.0, "the job's events never reached COMPLETED")
    assert states == ["SCHEDULED", "DISPATCHED", "STARTED", "SUCCEEDED", "COMPLETED"], states
    # The human form shows the same lifecycle, states in capitals, one line each.
    text = cli("status", job_id).stdout
    for state in states:
        assert f"  {state}" in text, (state, status, text)
    sql = cli("sql", f"SELECT run_id, state FROM runs WHERE job_id = '{job_id}'")
    assert sql.returncode == 0, sql.stderr
    assert f"{job_id}@" in sql.stdout and "SUCCEEDED" in sql.stdout
    health = cli("health")
    assert health.returncode == 0, health.stdout + health.stderr
    # ... and it asked every service's readiness, found through the running stack
    for service in ("scheduler", "worker", "api"):
        assert f"ok    ready:{service}" in health.stdout, health.stdout
    assert "  metrics:           scheduler http://127.0.0.1:" in log.read_text()

    # Quiet: the services' start-up chatter and librdkafka's lines are in their log files.
    terminal = log.read_text()
    assert "%3|" not in terminal and "\x1b[" not in terminal
    assert "[scheduler] info" not in terminal and "partition ready" not in terminal
    assert "partition ready" in (data / "logs" / "scheduler.log").read_text()

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(90)) == 0, log.read_text()
    assert "kafka: stopped" in log.read_text()
    assert LocalBroker(data / "kafka").running_pid() is None


# Its waits: the stack up (90), the worker in its group (60), the run started (60), the stop
# (worker grace 12 + its close budget and margin 25 + scheduler and api 30), the next attempt
# (90), margins.
@pytest.mark.timeout(90 + 60 + 60 + 70 + 90 + 60)
def test_ctrl_c_lets_a_busy_worker_hand_its_run_back_and_it_never_runs_twice_at_once(
    settings: Settings,
    jobwheel_env: dict[str, str],
    kafka_bootstrap: str,
    procs: Procs,
    tmp_path: Path,
) -> None:
    """`make run`, a long task running, Ctrl-C in the terminal (SIGINT to the whole process
    group): the stack waits for the worker's own grace (12 s here, more than the 10 s the
    stack used to give any service), the worker hands the run back, and the run's next attempt
    is the only execution after it: attempt 1 is never delivered again next to attempt 2."""
    from jobwheel.producers.client import JobClient
    from tests.integration.scheduler_support import TopicTail
    from tests.support import DEMO_TASKS, start_worker, wait_for_group, wait_for_log

    env = {
        **jobwheel_env,
        "JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS": "12000",
        "JOBWHEEL_LOG_FORMAT": "text",
    }
    log = tmp_path / "up.log"
    up = procs.spawn(["jobwheel", "up", "--bootstrap", kafka_bootstrap], env, log)
    wait_for_log(log, "jobwheel stack up", 90, proc=up)
    wait_for_group(settings, settings.worker_group, settings.topics.runs, timeout_s=60)
    tail = TopicTail(settings, [settings.topics.acks])
    with JobClient(settings) as client:
        job_id = client.schedule("long", task="demo.sleep", args={"seconds": 3600}, now=True)

    def started() -> str | None:
        found = tail.events(job_id, State.STARTED)
        return found[0].run_id if found else None

    run_id = wait_until(started, 60, message="the long run never STARTED")

    os.killpg(up.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    assert up.wait(scaled(12 + 25 + 30 + 20)) == 0, log.read_text()
    text = log.read_text()
    assert "stopping worker: waiting up to 37s (runs in flight may finish within 12s" in text
    # While the worker takes its 12 s grace, the terminal counts down what is left of the 37.
    left = [int(n) for n in re.findall(r"still waiting: worker (\d+)s left until SIGKILL", text)]
    assert left and left == sorted(left, reverse=True) and left[0] < 37, text
    assert "until SIGKILL (Ctrl-C again: hurry it)" in text
    assert "[worker] worker stopping running=1" in text
    assert "[worker] worker stopped" in text
    assert "service worker: stopped (exit 0)" in text
    assert "did not stop" not in text and "killed" not in text
    (handed,) = tail.wait_for(run_id, State.FAILED, timeout_s=30)
    assert (handed.attempt, handed.reason) == (1, "worker shutdown")

    # The stack again, minus the status service: the run goes on as attempt 2, and attempt 1
    # is not executed a second time.
    procs.spawn(["jobwheel", "scheduler"], env, tmp_path / "scheduler.log")
    start_worker(procs, env, tmp_path / "w2.log", tasks=DEMO_TASKS)
    again = tail.wait_for(run_id, State.STARTED, count=2, timeout_s=90)
    tail.read_to_end()
    assert [e.attempt for e in tail.of(run_id, State.STARTED)] == [1, 2], again


# Its waits: the first stack up (90) and ready (90), the second's answer (90), its stop when it
# was not refused (90), the health calls (3 x 60).
@pytest.mark.timeout(90 + 90 + 90 + 90 + 3 * 60)
def test_a_second_jobwheel_up_on_the_same_data_dir_is_refused_and_leaves_the_first_alone(
    settings: Settings,
    jobwheel_env: dict[str, str],
    kafka_bootstrap: str,
    procs: Procs,
    tmp_path: Path,
) -> None:
    """`make run` in a second terminal while the first one runs: refused in one line naming the
    running stack (pid, API URL) and what to do, before it starts a service, writes a log line
    or touches the first one's stack.json (which `jobwheel health` reads)."""
    from tests.support import stop, wait_for_log

    env = {**jobwheel_env, "JOBWHEEL_LOG_FORMAT": "text"}  # as `make run`
    data = settings.data_dir
    first_log = tmp_path / "first.log"
    first = procs.spawn(["jobwheel", "up", "--bootstrap", kafka_bootstrap], env, first_log)
    wait_for_log(first_log, "jobwheel stack up", 90, proc=first)

    def health() -> str:
        result = subprocess.run(
            jobwheel_argv(["jobwheel", "health"]),
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        return result.stdout + result.stderr

    ready = [f"ok    ready:{name}" for name in ("scheduler", "worker", "api")]
    wait_until(
        lambda: all(line in health() for line in ready), 90, 1.0, "the first stack never ready"
    )
    stack_file = (data / "stack.json").read_text()

    second_log = tmp_path / "second.log"
    second = procs.spawn(["jobwheel", "up", "--bootstrap", kafka_bootstrap], env, second_log)
    wait_until(
        lambda: second.poll() is not None or "jobwheel stack up" in second_log.read_text(),
        90,
        message=second_log.read_text(),
    )
    if second.poll() is None:  # not refused: stopped as its user would, with Ctrl-C
        stop(second, signal.SIGINT, timeout_s=90)
    said = second_log.read_text()
    assert second.returncode == 1, said
    (line,) = said.splitlines()
    assert line.startswith(
        f"jobwheel up: a jobwheel stack is already running on the data dir {data} "
        f"(pid {first.pid}, API {settings.status_api_url}, Kafka {kafka_bootstrap}); "
        f"use that one, stop it first (Ctrl-C in its terminal or `kill {first.pid}`), or start "
        "this one on another data dir"
    ), line

    # The first stack is untouched and still answers for itself.
    assert first.poll() is None
    assert (data / "stack.json").read_text() == stack_file
    for name in ("scheduler", "api"):
        own = (data / "logs" / f"{name}.log").read_text()
        assert "another scheduler is running" not in own and "Cannot lock file" not in own
    report = health()
    assert all(line in report for line in ready), report


#: A ``jobwheel up`` whose services are the test's own: the CLI's own signal handling
#: (``deploy.cli._stop_event``, the line ``jobwheel up`` runs) around a :class:`Stack` on the
#: session's broker, in the main thread of a process the test signals, as a terminal would.
#: STABLE_AFTER_S (a minute) is shortened so a run that stays up resets the back-off within
#: the test; the back-off itself is the real one (1 s, doubling).
UP_DRIVER = """
import sys
from pathlib import Path

import jobwheel.deploy.stack as stack_module
from jobwheel.deploy.cli import _stop_event
from jobwheel.deploy.stack import Service, Stack
from jobwheel.settings import get_settings

data_dir, marks, stable_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
stack_module.STABLE_AFTER_S = stable_s
service = (sys.executable, "-c", sys.argv[4])
never = lambda settings: 600.0  # only the test's Ctrl-Cs end these two
services = [
    Service("crashy", (*service, "crashy", str(marks / "crashy"), str(stable_s + 0.5))),
    Service("stubborn", (*service, "stubborn", str(marks / "stubborn")), grace=never),
    Service("deaf", (*service, "deaf", str(marks / "deaf")), grace=never),
]
settings = get_settings()
stack = Stack(settings, bootstrap=settings.bootstrap_servers, data_dir=data_dir, services=services)
sys.exit(stack.run(_stop_event(again=stack.ask_again)))
"""

#: crashy: exits at once three times, then stays up past STABLE_AFTER_S and exits, then stays.
#: stubborn: exits on its second SIGTERM. deaf: never exits on SIGTERM. Each notes its starts
#: and the SIGTERMs it gets in its marks file.
UP_SERVICE = """
import signal, sys, time
from pathlib import Path

mode, mark = sys.argv[1], Path(sys.argv[2])
def note(text):
    with mark.open("a") as f:
        f.write(text + "\\n")
def on_term(signum, frame):
    note("TERM")
    if mode == "stubborn" and mark.read_text().count("TERM") >= 2:
        sys.exit(0)
note("up")
if mode == "crashy":
    starts = mark.read_text().count("up")
    if starts <= 3:
        sys.exit(3)
    if starts == 4:
        time.sleep(float(sys.argv[3]))
        sys.exit(3)
else:
    signal.signal(signal.SIGTERM, on_term)
while True:
    signal.pause()
"""


@pytest.mark.timeout(60 + 60 + 3 * 30)
def test_jobwheel_up_backs_off_restarts_and_a_second_ctrl_c_hurries_a_third_kills(
    settings, jobwheel_env, tmp_path: Path, procs: Procs
):
    """The restart policy and the stop of ``jobwheel up`` (deploy/stack.py's module doc), with
    real SIGINTs to the supervising process. A service that keeps exiting is restarted after
    1 s, 2 s, 4 s, and after 1 s again once a run of it stayed up past STABLE_AFTER_S. The
    first Ctrl-C sends each service SIGTERM and waits its grace; the second sends SIGTERM
    again (what makes a worker hand its runs back at once); the third kills what is left."""
    marks = tmp_path / "marks"
    marks.mkdir()
    stable_s = scaled(3)
    out = tmp_path / "up.log"
    argv = [sys.executable, "-c", UP_DRIVER, str(tmp_path / "data"), str(marks), str(stable_s)]
    up = procs.spawn([*argv, UP_SERVICE], jobwheel_env, out)

    def said() -> str:
        return out.read_text(errors="replace")

    def wait_said(text: str, count: int = 1, timeout_s: float = 30) -> None:
        wait_until(lambda: said().count(text) >= count, scaled(timeout_s), 0.1, said())

    def terms(name: str) -> int:
        return (marks / name).read_text().count("TERM") if (marks / name).exists() else 0

    try:
        wait_said("service crashy: started", 5, 60)
        delays = [
            line.split("restarting in ")[1].split(";")[0].split(".")[0]
            for line in said().splitlines()
            if line.startswith("!! service crashy exited with code 3; restarting in ")
        ]
        assert delays == ["1s", "2s", "4s", "1s"], said()
        assert "service stubborn: started" in said() and "service deaf: started" in said()
        assert said().count("service stubborn: started") == 1  # they never exited

        up.send_signal(signal.SIGINT)
        wait_said("stopping the stack (Ctrl-C again: hand running runs back at once)")
        wait_until(lambda: terms("stubborn") == 1 and terms("deaf") == 1, scaled(30), 0.1, said())
        wait_said("service crashy: stopped (on SIGTERM)")
        assert "hurrying" not in said() and up.poll() is None  # waiting out their grace

        up.send_signal(signal.SIGINT)
        wait_said("hurrying ")
        wait_said("service stubborn: stopped (exit 0)")
        wait_until(lambda: terms("deaf") == 2, scaled(30), 0.1, said())
        assert "killing" not in said() and up.poll() is None

        up.send_signal(signal.SIGINT)
        wait_said("killing deaf")
        wait_said("service deaf: stopped (on SIGKILL)")
        assert up.wait(scaled(30)) == 0, said()
        assert terms("deaf") == 2 and terms("stubborn") == 2
    finally:
        # The services live in sessions of their own and two of them ignore SIGTERM (the
        # signal they get when the supervisor dies): a failed test must not leave them behind.
        # Only a pid whose command line still names this test's marks (a pid may be reused).
        for line in said().splitlines():
            if ": started (pid " in line:
                pid = int(line.split("(pid ")[1].split(")")[0])
                with contextlib.suppress(OSError):
                    if str(marks) in Path(f"/proc/{pid}/cmdline").read_bytes().decode():
                        os.kill(pid, signal.SIGKILL)
