"""What `make run` shows in the terminal of each line a service writes (everything goes to the
service's log file; this is the terminal's share)."""

from __future__ import annotations

import json

import pytest

from jobwheel.deploy.stack import SERVICES, terminal_line

WORKER_SHOWN = next(s for s in SERVICES if s.name == "worker").shown


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        # warnings and errors, in either log format, with their fields
        (
            "warning jobwheel.consumers.worker.pool: run handed back run_id=j@1 attempt=1\n",
            "[worker] warning: run handed back run_id=j@1 attempt=1",
        ),
        (
            json.dumps({"ts": 1.5, "level": "error", "logger": "x", "msg": "boom", "code": 7}),
            "[worker] error: boom code=7",
        ),
        # the few INFO lines a person wants, and no other
        (
            "info  jobwheel.consumers.worker.pool: worker stopping running=1 grace_s=25.0",
            "[worker] worker stopping running=1 grace_s=25.0",
        ),
        (
            "info  jobwheel.consumers.worker.pool: worker stopped worker=vm:1",
            "[worker] worker stopped worker=vm:1",
        ),
        ("info  jobwheel.consumers.worker.pool: partitions assigned partitions=[0, 1, 2]", None),
        (json.dumps({"ts": 1, "level": "info", "logger": "x", "msg": "worker started"}), None),
        ("debug jobwheel.streams.engine: tick", None),
        # output that is not a log line: librdkafka's raw lines, a framework's, escape codes
        ("%3|1796091618.436|FAIL|rdkafka#producer-3| [thrd:x]: Connect failed", None),
        ("INFO:     Uvicorn running on http://127.0.0.1:8080 (Press CTRL+C to quit)", None),
        ("\x1b[?25h", None),
        ("\x1b[31mwarning x: coloured\x1b[0m", "[worker] warning: coloured"),
        ("{not json", None),
    ],
)
def test_the_terminal_gets_warnings_errors_and_the_listed_state_changes(
    raw: str, shown: str | None
) -> None:
    assert terminal_line("worker", raw, WORKER_SHOWN) == shown


def test_every_service_of_the_stack_stops_within_its_own_grace() -> None:
    from jobwheel.settings import Settings

    settings = Settings(worker_shutdown_grace_ms=40_000)  # type: ignore[call-arg]
    worker = next(s for s in SERVICES if s.name == "worker")
    assert worker.grace(settings) > 40  # at least its own grace, then time to hand back
    assert worker.stop_stage < min(s.stop_stage for s in SERVICES if s.name != "worker")
    assert "40s" in worker.waiting_for(settings)


def test_up_tasks_replace_the_workers_modules(tmp_path) -> None:
    from jobwheel.deploy.stack import Stack
    from jobwheel.settings import Settings

    stack = Stack(Settings(data_dir=tmp_path), tasks="jobwheel.consumers.demo,my_tasks")  # type: ignore[call-arg]
    (worker,) = [s for s in stack.services if s.name == "worker"]
    assert worker.argv[-2:] == ("--tasks", "jobwheel.consumers.demo,my_tasks")
    assert worker.stop_stage == 0
    assert [s.name for s in stack.services] == [s.name for s in SERVICES]


def test_up_on_a_data_dir_holding_a_cluster_gives_its_nodes_the_jvm_options(tmp_path) -> None:
    """`jobwheel up` without --nodes on a data dir where a local cluster is recorded runs that
    cluster, its JVMs with JOBWHEEL_BROKER_JVM_OPTIONS (they were left out before)."""
    from jobwheel.deploy.broker import LocalCluster
    from jobwheel.deploy.stack import Stack
    from jobwheel.settings import Settings

    recorded = LocalCluster(tmp_path / "kafka", nodes=3, ports=[(1, 2), (3, 4), (5, 6)])
    recorded._write_manifest()
    settings = Settings(data_dir=tmp_path, broker_jvm_options="-XX:TieredStopAtLevel=1")  # type: ignore[call-arg]
    broker = Stack(settings).broker
    assert isinstance(broker, LocalCluster)
    assert [broker.node(n).port for n in broker.node_ids] == [1, 3, 5]  # the recorded one
    for n in broker.node_ids:
        assert broker.node(n).jvm_options == ("-XX:TieredStopAtLevel=1",)


def test_each_jobwheel_service_gets_its_own_metrics_port_and_health_finds_them(
    tmp_path, monkeypatch
) -> None:
    """Ports from JOBWHEEL_METRICS_PORT upwards (a taken one is skipped), in each service's
    environment only; a service that serves none gets none; `jobwheel health` reads them from
    stack.json while the stack's supervisor runs."""
    import socket
    import subprocess

    from jobwheel.consumers.status.cli import health_endpoints
    from jobwheel.deploy.broker import free_port
    from jobwheel.deploy.stack import Service, Stack, read_stack_file
    from jobwheel.settings import Settings

    base = free_port()
    with socket.socket() as taken:  # the second port of the range is in use
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        monkeypatch.setenv("JOBWHEEL_METRICS_PORT", "1")  # inherited, never passed on as is
        settings = Settings(data_dir=tmp_path, metrics_port=base)  # type: ignore[call-arg]
        other = Service("other", ("true",))
        stack = Stack(settings, services=[*SERVICES, other])
        for service in stack.services:
            stack._assign_metrics_port(service)
    ports = stack.metrics_ports
    assert set(ports) == {s.name for s in SERVICES}
    assert ports["scheduler"] == base and ports["worker"] != base + 1
    assert len(set(ports.values())) == len(ports)
    by_name = {s.name: s for s in stack.services}
    assert stack.child_env(by_name["worker"])["JOBWHEEL_METRICS_PORT"] == str(ports["worker"])
    assert "JOBWHEEL_METRICS_PORT" not in stack.child_env(other)

    stack._write_stack_file()
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    assert read_stack_file(tmp_path) == urls
    monkeypatch.delenv("JOBWHEEL_METRICS_PORT")
    extra = "x=http://h:1/,http://h2:2"
    found = health_endpoints(Settings(data_dir=tmp_path, health_urls=extra))  # type: ignore[call-arg]
    assert found == {**urls, "x": "http://h:1", "h2:2": "http://h2:2"}
    # a stack.json left by a supervisor that is gone names nothing
    doc = json.loads((tmp_path / "stack.json").read_text())
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "stack.json").write_text(json.dumps({**doc, "pid": gone.pid}))
    assert read_stack_file(tmp_path) == {}


def test_the_topics_line_counts_every_topic_it_created() -> None:
    """`jobwheel up` said "topics: 5 with prefix jobwheel (6 created)": it counted the prefix's
    topics, while the scheduler's changelog (named by its application id) was created too."""
    from jobwheel.kafka.admin import topic_specs, topics_summary
    from jobwheel.settings import Settings

    settings = Settings()
    names = [spec.name for spec in topic_specs(settings)]
    assert "jobwheel-scheduler-jobs-changelog" in names
    assert topics_summary(settings, names).startswith(f"{len(names)} topics, all created now")
    assert topics_summary(settings, []).startswith(f"{len(names)} topics, all there already")
    assert topics_summary(settings, names[:2]).startswith(
        f"{len(names)} topics, 2 created now, {len(names) - 2} there already (prefix jobwheel, "
    )
