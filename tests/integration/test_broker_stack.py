"""``jobwheel up``: broker + topics + supervised services, stopped in order."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from deploy.broker import LocalBroker, free_port
from deploy.stack import SERVICES, Service, Stack
from jobwheel.settings import Settings
from tests.support import Procs, jobwheel_argv, scaled, wait_until

FLAKY_SERVICE = (
    "import os, sys, time\n"
    "print('hello from', os.environ['JOBWHEEL_BOOTSTRAP_SERVERS'], flush=True)\n"
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
        assert f"[flaky] hello from {bootstrap}" in text
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

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(scaled(90)) == 0, log.read_text()
    assert "kafka: stopped" in log.read_text()
    assert LocalBroker(data / "kafka").running_pid() is None
