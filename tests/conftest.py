"""Shared fixtures: one real Kafka broker per test session, per-test settings and topics.

The broker is a Docker container (testcontainers) when a Docker engine answers, otherwise a
genuine Apache Kafka JVM broker started from the Maven jars in ``deploy/lib`` on free ports in
a temporary directory (:class:`jobwheel.deploy.broker.LocalBroker`). Every test gets its own topic
prefix and consumer-group names, so tests sharing the session broker never see each other's
records. ``JOBWHEEL_TEST_BOOTSTRAP=host:port`` uses an already running broker instead (handy
when iterating on one test: `jobwheel broker start` once, then run pytest repeatedly).

Every test's timeout (the ``timeout`` of pyproject.toml, or a test's own
``@pytest.mark.timeout(seconds)``) is multiplied by ``JOBWHEEL_TEST_TIME_SCALE``, the same
factor :func:`tests.support.scaled` applies to the waits inside the tests.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from tests.support import (
    BROKER_JVM_ARGS,
    BROKER_JVM_OPTIONS,
    KAFKA_IMAGE,
    TIME_SCALE,
    Procs,
    docker_engine,
    require_kafka_version,
    scaled,
)

# The status store's fixtures (engine_dsn, store) live with their builders.
pytest_plugins = ["tests.status_support"]

INTEGRATION_DIR = Path(__file__).parent / "integration"

# No property test asserts on wall-clock time: Hypothesis' default 200 ms deadline per example
# failed a codec test under load (260 ms once, 33 ms on the rerun). Speed lives in load/.
hypothesis_settings.register_profile(
    "jobwheel", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("jobwheel")
REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs the broker (or lives in tests/integration) as integration;
    scale every test's timeout by JOBWHEEL_TEST_TIME_SCALE."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        in_integration = INTEGRATION_DIR in Path(str(item.fspath)).parents
        if in_integration or "kafka_bootstrap" in fixtures:
            item.add_marker(pytest.mark.integration)
        if TIME_SCALE != 1:
            _scale_timeout(config, item)


def _scale_timeout(config: pytest.Config, item: pytest.Item) -> None:
    """Put a scaled copy of the test's timeout in front of its markers (pytest-timeout reads
    the closest one); the nominal value is the test's own marker, else the configured one."""
    marker = item.get_closest_marker("timeout")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        nominal = marker.args[0]
    elif "timeout" in kwargs:
        nominal = kwargs.pop("timeout")
    else:
        nominal = config.getvalue("timeout") or config.getini("timeout")
    if nominal:
        item.add_marker(pytest.mark.timeout(scaled(float(nominal)), **kwargs), append=False)


@pytest.fixture(autouse=True)
def _service_log_handler_removed() -> Iterator[None]:
    """A command a test runs in-process (``jobwheel.cli.main``) installs the service log
    handler on the root logger, as a service does; take it away again with the test, so that
    a background thread of a later test (an API's sink still starting) does not print through
    it into the run's output."""
    from jobwheel import logs

    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    added = [h for h in root.handlers if h not in before and isinstance(h, logs.ServiceHandler)]
    for handler in added:
        root.removeHandler(handler)
    if added:
        root.setLevel(level)


#: Where each test process (pytest-xdist worker) notes the test it runs and, through
#: faulthandler, every thread's stack when it dies of a fatal signal or gets SIGTERM: one
#: file per process, in a folder the controlling process makes and passes on.
FAULTS_DIR_ENV = "PYTEST_WORKER_FAULTS_DIR"


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler set-up, which this replaces
def pytest_configure(config: pytest.Config) -> None:
    """A test process that dies leaves xdist only "node down: Not properly terminated" (its
    output is captured). Each process writes what it ran and, on a fatal signal, its stacks
    to a file; the controlling process prints that file when a process is lost."""
    import faulthandler
    import shutil
    import signal
    import tempfile

    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        if FAULTS_DIR_ENV not in os.environ:
            os.environ[FAULTS_DIR_ENV] = tempfile.mkdtemp(prefix="pytest-faults-")
            config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(FAULTS_DIR_ENV), True))
        return
    folder = os.environ.get(FAULTS_DIR_ENV)
    if folder is None:
        return
    faults = open(Path(folder) / f"{worker}.log", "a", buffering=1)  # open for life
    _faults.append(faults)
    faulthandler.enable(file=faults, all_threads=True)
    faulthandler.register(signal.SIGTERM, file=faults, all_threads=True, chain=True)


_faults: list[Any] = []  # this test process's file, once configured


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    for faults in _faults:
        faults.write(f"{nodeid} starts (pid {os.getpid()})\n")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent under -p no:xdist
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the controlling process: a test process was lost; show what it left."""
    folder = os.environ.get(FAULTS_DIR_ENV)
    worker = node.gateway.id
    if not error or folder is None:
        return
    path = Path(folder) / f"{worker}.log"
    text = path.read_text(errors="replace") if path.exists() else "(no file)"
    print(f"\n[{worker}] lost: {error}; its last tests and any fatal signal's stacks "
          f"({path}):\n" + "\n".join(text.splitlines()[-80:]), flush=True)  # fmt: skip


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Any:
    """``figure(text)``: a measured figure of this test for the report. Printed in the summary
    at the end of the run (``pytest_terminal_summary``), which also works when the suite runs
    in several processes (``make test`` does), where a test's own output is not shown."""

    def note(text: str) -> None:
        request.node.user_properties.append(("figure", text))

    return note


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == "figure"
    ]
    if lines:
        terminalreporter.section("figures measured by the tests")
        for line in lines:
            terminalreporter.line(line)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``"host:port"`` of a real Kafka broker for the whole session (started on first use)."""
    external = os.environ.get("JOBWHEEL_TEST_BOOTSTRAP")
    if external:
        require_kafka_version(external)
        yield external
        return
    if docker_engine():
        yield from _container_broker()
        return
    yield from _local_broker(tmp_path_factory.mktemp("kafka"))


def container_env(host_port: int) -> dict[str, str]:
    """The apache/kafka image's environment for the local broker's own server.properties
    (deploy/broker.py: one KRaft config for both), each key as ``KAFKA_<KEY>``. Inside the
    container the broker listens on 9092 (clients, published on ``host_port`` and advertised
    there) and 9093 (its controller), and keeps its log in the image's data directory."""
    from jobwheel.deploy.broker import server_properties

    text = server_properties(port=host_port, controller_port=9093, log_dirs=Path("/x"))
    props = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line[0] == "#"
    )
    props.update(
        {
            "listeners": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{host_port}",
            "controller.quorum.voters": "1@localhost:9093",
            "log.dirs": "/tmp/kraft-combined-logs",  # the image's own, writable by its user
        }
    )
    return {"KAFKA_" + key.upper().replace(".", "_"): value for key, value in props.items()}


def _container_broker() -> Iterator[str]:
    """Apache Kafka 4.1.1 (the official image, not testcontainers' default Confluent 7.6 =
    Kafka 3.6) with the local broker's KRaft settings, its client port published as is."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    from jobwheel.deploy.broker import free_port, new_cluster_id

    host_port = free_port()
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, host_port)
    for key, value in {**container_env(host_port), "CLUSTER_ID": new_cluster_id()}.items():
        container.with_env(key, value)
    with container:
        wait_for_logs(container, "Kafka Server started", timeout=scaled(120))
        bootstrap = f"127.0.0.1:{host_port}"
        require_kafka_version(bootstrap)
        yield bootstrap


def _local_broker(data_dir: Path) -> Iterator[str]:
    from jobwheel.deploy.broker import BrokerStartError, LocalBroker, free_port
    from jobwheel.errors import ConfigError

    # Free ports are only free when checked: another engineer's test session on this machine
    # may grab one between the check and the JVM's bind, so retry with new ports.
    last: Exception | None = None
    for attempt in range(3):
        broker = LocalBroker(
            data_dir / f"attempt{attempt}",
            port=free_port(),
            controller_port=free_port(),
            heap="384m",
            jvm_options=BROKER_JVM_ARGS,
        )
        try:
            broker.start(die_with_parent=True)
        except (BrokerStartError, ConfigError) as exc:
            if "Java" in str(exc) or "Maven" in str(exc) or "jars" in str(exc):
                raise
            last = exc
            continue
        try:
            require_kafka_version(broker.bootstrap)
            yield broker.bootstrap
        finally:
            broker.stop()
        return
    raise RuntimeError(f"could not start a local Kafka broker after 3 attempts: {last}")


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Any]:
    """A single broker of the test's own (:class:`jobwheel.deploy.broker.LocalBroker`), for
    tests that stop, freeze or restart it; the session's broker is shared and never touched.
    Stopped at the end, woken first if the test left it SIGSTOPped."""
    import signal

    from jobwheel.deploy.broker import LocalBroker, free_port

    broker = LocalBroker(
        tmp_path / "kafka",
        port=free_port(),
        controller_port=free_port(),
        heap="384m",
        jvm_options=BROKER_JVM_ARGS,
    )
    broker.start(die_with_parent=True)
    try:
        yield broker
    finally:
        pid = broker.running_pid()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        broker.stop()


#: Heap of each node of the test cluster: three JVMs beside the single broker and the tests'
#: processes, on 2 cores.
CLUSTER_NODE_HEAP = "320m"


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A three-node KRaft cluster (:class:`jobwheel.deploy.broker.LocalCluster`) for the whole
    session, started on first use, each node broker and controller on free ports.

    One per pytest process: ``make test`` keeps a file's tests in one process, so the cluster
    tests live in one file and share this one cluster (starting three JVMs is the slow part).
    Tests stop, kill and restart its nodes; the cluster tests' own fixture brings every node
    back before each test. ``JOBWHEEL_TEST_CLUSTER_DIR`` uses a cluster already running in
    that data dir (`jobwheel broker start --nodes 3 --data-dir DIR`) instead.
    """
    from jobwheel.deploy.broker import BrokerStartError, LocalCluster, free_port
    from jobwheel.errors import ConfigError

    external = os.environ.get("JOBWHEEL_TEST_CLUSTER_DIR")
    if external:
        yield LocalCluster.load(Path(external))
        return
    root = tmp_path_factory.mktemp("kafka-cluster")
    last: Exception | None = None
    for attempt in range(3):  # another session may take a free port before a JVM binds it
        cluster = LocalCluster(
            root / f"attempt{attempt}",
            nodes=3,
            ports=[(free_port(), free_port()) for _ in range(3)],
            heap=CLUSTER_NODE_HEAP,
            startup_timeout_s=scaled(180),
            jvm_options=BROKER_JVM_ARGS,
        )
        try:
            cluster.start(die_with_parent=True)
        except (BrokerStartError, ConfigError) as exc:
            if "Java" in str(exc) or "Maven" in str(exc) or "jars" in str(exc):
                raise
            last = exc
            continue
        try:
            yield cluster
        finally:
            cluster.stop(timeout_s=20)
        return
    raise RuntimeError(f"could not start a local Kafka cluster after 3 attempts: {last}")


def _test_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def settings_on(bootstrap: str, tmp_path: Path, **overrides: Any) -> Any:
    """Settings for one test on the broker at ``bootstrap``: a unique topic prefix and group
    ids, its topics already created. ``overrides`` are Settings fields (a test on a broker of
    its own that needs, say, another partition count or a shorter transaction timeout)."""
    from jobwheel.deploy.broker import free_port
    from jobwheel.kafka.admin import ensure_topics
    from jobwheel.settings import Settings

    prefix = _test_prefix()
    fields: dict[str, Any] = {
        "partitions": 4,
        "data_dir": tmp_path / "data",
        "log_format": "text",
        "scheduler_app_id": f"{prefix}-scheduler",
        "worker_group": f"{prefix}-workers",
        "status_group": f"{prefix}-status",
        "api_port": free_port(),
        "broker_jvm_options": BROKER_JVM_OPTIONS,  # the broker of a stack a test starts
        **overrides,
    }
    s = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        **fields,
    )
    ensure_topics(s)
    return s


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Any:
    """Settings for one test: unique topic prefix and group ids, its topics already created."""
    return settings_on(kafka_bootstrap, tmp_path)


def _env_value(value: Any) -> str:
    from pydantic import SecretStr

    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    return str(value)


def settings_env(settings: Any) -> dict[str, str]:
    """os.environ plus the JOBWHEEL_* variables that reproduce ``settings`` in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is not None:
            env[f"JOBWHEEL_{name.upper()}"] = _env_value(value)
    env["PYTHONUNBUFFERED"] = "1"
    # `jobwheel worker --tasks tests.tasks` imports the test tasks from the checkout.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def jobwheel_env(settings: Any) -> dict[str, str]:
    return settings_env(settings)


@pytest.fixture
def procs() -> Iterator[Procs]:
    """Spawn subprocesses with ``procs.spawn(args, env, log_path)``; SIGKILLed at teardown."""
    group = Procs()
    try:
        yield group
    finally:
        group.kill_all()
