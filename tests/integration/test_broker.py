"""``jobwheel broker start|stop|status``: a real JVM broker in a temp dir on free ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from jobwheel.deploy.broker import LocalBroker, free_port
from tests.support import BROKER_JVM_OPTIONS, Procs, process_cmdline, wait_until

JOBWHEEL = [sys.executable, "-m", "jobwheel.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env["JOBWHEEL_LOG_FORMAT"] = "text"
    env["JOBWHEEL_BROKER_HEAP"] = "256m"
    env["JOBWHEEL_BROKER_JVM_OPTIONS"] = BROKER_JVM_OPTIONS
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*JOBWHEEL, *args], env=env or _env(), capture_output=True, text=True, timeout=180
    )


def test_start_status_stop_via_cli(tmp_path: Path):
    data, port, cport = tmp_path / "kafka", free_port(), free_port()
    where = ["--data-dir", str(data)]
    try:
        started = _cli(
            "broker", "start", *where, "--port", str(port), "--controller-port", str(cport)
        )
        assert started.returncode == 0, started.stderr
        assert f"broker ready at 127.0.0.1:{port}" in started.stdout

        # The CLI returned; a detached JVM running kafka.Kafka serves the port.
        pid = int((data / "broker.pid").read_text())
        cmdline = process_cmdline(pid)
        assert "java" in Path(cmdline[0]).name
        assert "kafka.Kafka" in cmdline
        assert str(data / "server.properties") in cmdline
        # JOBWHEEL_BROKER_JVM_OPTIONS reach the JVM, before its class path and main class
        assert cmdline.index(BROKER_JVM_OPTIONS) < cmdline.index("kafka.Kafka"), cmdline
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
        assert list(metadata.brokers) == [1]

        status = _cli("broker", "status", *where)
        assert status.returncode == 0
        assert f"ready: bootstrap 127.0.0.1:{port}, pid {pid}" in status.stdout

        again = _cli(
            "broker", "start", *where, "--port", str(port), "--controller-port", str(cport)
        )
        assert again.returncode == 0, again.stderr  # already running: idempotent
        assert int((data / "broker.pid").read_text()) == pid

        stopped = _cli("broker", "stop", *where)
        assert stopped.returncode == 0 and "broker stopped" in stopped.stdout
        assert not Path(f"/proc/{pid}").exists() or "kafka.Kafka" not in process_cmdline(pid)

        status = _cli("broker", "status", *where)
        assert status.returncode == 3 and "not running" in status.stdout
    finally:
        LocalBroker(data).stop(timeout_s=10)


def test_restart_keeps_topics(tmp_path: Path):
    broker = LocalBroker(
        tmp_path / "kafka", port=free_port(), controller_port=free_port(), heap="256m"
    )
    try:
        broker.start(die_with_parent=True)
        from confluent_kafka.admin import NewTopic

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("kept", 2, 1)])["kept"].result(10)
        broker.stop()
        broker.start(die_with_parent=True)
        topics = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10).topics
        assert len(topics["kept"].partitions) == 2
    finally:
        broker.stop(timeout_s=10)


def test_taken_port_is_refused_naming_port_and_setting(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _cli(
            "broker",
            "start",
            "--data-dir",
            str(tmp_path / "k"),
            "--port",
            str(port),
            "--controller-port",
            str(free_port()),
        )
    assert result.returncode == 1
    assert f"port {port} (listener) on 127.0.0.1 is already in use" in result.stderr
    assert "JOBWHEEL_BROKER_PORT" in result.stderr
    assert not (tmp_path / "k" / "broker.pid").exists()


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        ("JOBWHEEL_BROKER_HEAP", "1k", "heap"),  # the JVM refuses to start with this heap
        ("JOBWHEEL_BROKER_JVM_OPTIONS", "-XX:+NoSuchJobwheelTestFlag", "nosuchjobwheeltestflag"),
    ],
)
def test_broker_dying_during_startup_reports_its_output(
    tmp_path: Path, variable: str, value: str, complaint: str
):
    result = _cli(
        "broker",
        "start",
        "--data-dir",
        str(tmp_path / "k"),
        "--port",
        str(free_port()),
        "--controller-port",
        str(free_port()),
        env=_env(**{variable: value}),
    )
    assert result.returncode == 1
    assert "exited during startup" in result.stderr
    assert complaint in result.stderr.lower(), result.stderr  # the JVM's own, from broker.out


def test_missing_java_names_what_to_install(tmp_path: Path):
    env = _env(PATH=str(tmp_path))  # no java (and no mvn) on PATH
    result = _cli(
        "broker",
        "start",
        "--data-dir",
        str(tmp_path / "k"),
        "--port",
        str(free_port()),
        "--controller-port",
        str(free_port()),
        env=env,
    )
    assert result.returncode == 1
    assert "Java is not installed" in result.stderr
    assert "openjdk-17" in result.stderr


def test_foreground_broker_stops_on_sigterm(tmp_path: Path, procs: Procs):
    data, port = tmp_path / "kafka", free_port()
    proc = procs.spawn(
        [
            "jobwheel",
            "broker",
            "start",
            "--foreground",
            "--data-dir",
            str(data),
            "--port",
            str(port),
            "--controller-port",
            str(free_port()),
        ],
        _env(),
        tmp_path / "fg.log",
    )
    wait_until(
        lambda: "broker ready" in (tmp_path / "fg.log").read_text(),
        120,
        message="foreground broker never became ready",
    )
    pid = int((data / "broker.pid").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert not Path(f"/proc/{pid}").exists() or "kafka.Kafka" not in process_cmdline(pid)
    assert not (data / "broker.pid").exists()
