"""Helpers shared by the tests: read a topic, wait for a condition, run jobwheel subprocesses.

Use with the fixtures of ``tests/conftest.py`` (``kafka_bootstrap``, ``settings``,
``jobwheel_env``, ``procs``)::

    proc = start_worker(procs, jobwheel_env, tmp_path / "worker.log", "--concurrency", "2")
    msgs = consume(settings, settings.topics.acks, min_count=3)
    wait_until(lambda: proc.poll() is None, 5, message="worker died")
    assert read_all(settings, settings.topics.requests) == []  # provably nothing there

Time: every timeout these helpers take is *nominal* seconds, multiplied by the one factor
``JOBWHEEL_TEST_TIME_SCALE`` (default 1), so a slow machine widens every deadline in one place
(``JOBWHEEL_TEST_TIME_SCALE=3 pytest ...``). Deadlines a test sets itself (``proc.wait``,
``subprocess.run``, ``@pytest.mark.timeout``) go through :func:`scaled`; the per-test timeout
is scaled by ``tests/conftest.py``. A timeout is only ever a limit on waiting for a condition,
never a measurement: the tests make no claim about how fast anything is.

Helpers raise :class:`HarnessError` when they themselves fail (a topic that does not exist,
a consumer error), so a check such as "nothing was sent" can never pass because the reader
was broken.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from jobwheel.settings import jvm_options

if TYPE_CHECKING:
    from confluent_kafka import Message

    from jobwheel.settings import Settings

T = TypeVar("T")

TIME_SCALE_ENV = "JOBWHEEL_TEST_TIME_SCALE"
#: Header of the records :func:`read_all` writes to prove it has read everything.
MARKER_HEADER = "jobwheel.test.marker"


class HarnessError(RuntimeError):
    """A test helper could not do its own job (as opposed to the code under test failing)."""


def _time_scale() -> float:
    raw = os.environ.get(TIME_SCALE_ENV, "1")
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise HarnessError(
            f"{TIME_SCALE_ENV}={raw!r} is not a positive number; set a factor such as 2 "
            "to give every test deadline twice as long, or unset it"
        )
    return value


TIME_SCALE = _time_scale()


def scaled(seconds: float) -> float:
    """``seconds`` times ``JOBWHEEL_TEST_TIME_SCALE``: every deadline of the suite goes
    through here, so a slow machine can widen all of them at once."""
    return seconds * TIME_SCALE


def _partitions(consumer: Any, topic: str, deadline: float) -> list[int]:
    """The topic's partitions; HarnessError if the broker does not know the topic by then."""
    last: object = None
    while True:
        meta = consumer.list_topics(topic, timeout=5.0).topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        last = meta.error if meta is not None else "no metadata"
        if time.monotonic() >= deadline:
            raise HarnessError(
                f"topic {topic!r} not found on the broker ({last}); was it created "
                "(the settings fixture creates the test's topics)?"
            )
        time.sleep(0.1)


def _reader(settings: Settings, group: str | None) -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        settings.librdkafka(
            **{
                "group.id": group or f"test-consume-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": group is not None,
                "enable.partition.eof": False,
                "isolation.level": "read_committed",
            }
        )
    )


def _check(msg: Message, topic: str, errors: list[str]) -> bool:
    """True for a record; records a transient error (False); raises on a fatal one."""
    error = msg.error()
    if error is None:
        return True
    if error.fatal():
        raise HarnessError(f"reading {topic!r} failed: {error.str()} ({error.name()})")
    errors.append(f"{error.name()}: {error.str()}")
    return False


def consume(
    settings: Settings,
    topic: str,
    *,
    min_count: int,
    timeout_s: float = 30.0,
    group: str | None = None,
) -> list[Message]:
    """Read ``topic`` from the beginning until ``min_count`` records (or the timeout).

    On timeout it returns what it has, so the test's own assertion says what was missing;
    but if the consumer reported errors meanwhile it raises :class:`HarnessError` with them
    (a short answer must never be the reader's fault), and so it does when the topic does not
    exist. To prove that *nothing* is on a topic use :func:`read_all`, which cannot time out
    into an empty answer. Without ``group`` all partitions are assigned directly (no group
    join: fast and leaves no committed offsets); with ``group`` it subscribes as that consumer
    group. Reads committed records only (``isolation.level=read_committed``).
    """
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    consumer = _reader(settings, group)
    out: list[Message] = []
    errors: list[str] = []
    deadline = time.monotonic() + scaled(timeout_s)
    try:
        if group is None:
            partitions = _partitions(consumer, topic, deadline)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        else:
            consumer.subscribe([topic])
        while len(out) < min_count and time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if msg is not None and _check(msg, topic, errors):
                out.append(msg)
    finally:
        consumer.close()
    if group is None:
        # Assigned, not subscribed: the throwaway group id is never used, so a broker that
        # refuses it (ACLs) has no bearing on what was read.
        errors = [e for e in errors if not e.startswith("GROUP_AUTHORIZATION_FAILED")]
    if len(out) < min_count and errors:
        raise HarnessError(
            f"read {len(out)} of {min_count} records from {topic!r}; the consumer reported "
            f"errors: {errors[-5:]}"
        )
    return out


def read_all(settings: Settings, topic: str, *, timeout_s: float = 30.0) -> list[Message]:
    """Every record on ``topic`` now, provably complete: what a negative check reads.

    It first writes a marker record (header ``jobwheel.test.marker``) to each partition, then
    reads from the beginning until it has seen every partition's marker, and returns the
    records before them. So ``read_all(...) == []`` means "the topic held nothing", never "the
    reader saw nothing": it did see the markers. Markers of earlier calls are left out. Only
    for topics nobody else in the test reads (the markers stay on the topic). Raises
    :class:`HarnessError` if a marker does not arrive.
    """
    from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

    token = uuid.uuid4().hex.encode()
    deadline = time.monotonic() + scaled(timeout_s)
    consumer = _reader(settings, None)
    try:
        partitions = _partitions(consumer, topic, deadline)
        producer = Producer(settings.librdkafka(**{"acks": "all"}))
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(f"{err.name()}: {err.str()}")

        for p in partitions:
            producer.produce(
                topic,
                value=b"jobwheel test marker",
                partition=p,
                headers=[(MARKER_HEADER, token)],
                on_delivery=delivered,
            )
        left = producer.flush(max(0.0, deadline - time.monotonic()))
        if left or failures:
            raise HarnessError(f"could not write the markers to {topic!r}: {failures or left}")
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        waiting = set(partitions)
        out: list[Message] = []
        errors: list[str] = []
        while waiting and time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if msg is None or not _check(msg, topic, errors) or msg.partition() not in waiting:
                continue
            headers = msg.headers() or []
            if (MARKER_HEADER, token) in headers:
                waiting.discard(msg.partition())
            elif not any(name == MARKER_HEADER for name, _ in headers):  # an earlier call's
                out.append(msg)
        if waiting:
            raise HarnessError(
                f"the markers written to partitions {sorted(waiting)} of {topic!r} were not "
                f"read back within {scaled(timeout_s):.0f}s (consumer errors: {errors[-5:]})"
            )
        return out
    finally:
        consumer.close()


class Tail:
    """The one reader of the tests for topics that grow while a test runs: reads ``topics``
    from the beginning (read_committed, assigned, no group) in the caller's thread.

    It never hides a failure: a consumer error is a :class:`HarnessError` at once, except the
    answers a broker gives while it is briefly unavailable (:data:`UNAVAILABLE_KAFKA_ERRORS`),
    which are kept and named if the reader then cannot catch up. A negative check ("nothing
    else arrived") first waits for a fact the reader must see (a positive), then calls
    :meth:`read_to_end`, which reads up to the end offsets taken *after* that fact: so "not
    seen" means "not on the topic", never "not read yet" or "the reader broke".
    """

    def __init__(self, settings: Settings, topics: list[str]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.topics = list(topics)
        self.errors: list[str] = []
        self._consumer = Consumer(
            settings.librdkafka(
                **{
                    "group.id": f"test-tail-{uuid.uuid4().hex[:8]}",
                    # A position lost with a deleted topic starts again at the beginning of the
                    # topic created anew, not at its end (which skips what came first).
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "enable.partition.eof": False,
                    "isolation.level": "read_committed",
                    # The broker answers a connection's requests in order: an end-offset query
                    # waited behind each idle fetch's long poll (500 ms by default), so reading
                    # to the end of 16 partitions took 8 s.
                    "fetch.wait.max.ms": 10,
                }
            )
        )
        deadline = time.monotonic() + scaled(30)
        self._assigned = [
            TopicPartition(topic, p)
            for topic in self.topics
            for p in _partitions(self._consumer, topic, deadline)
        ]
        self._consumer.assign(
            [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in self._assigned]
        )

    def poll(self, max_records: int = 500, timeout_s: float = 0.2) -> list[Message]:
        """The records that arrived since the last call (possibly none)."""
        out = []
        for msg in self._consumer.consume(max_records, timeout_s):
            error = msg.error()
            if error is None:
                out.append(msg)
            elif error.name() in UNAVAILABLE_KAFKA_ERRORS and not error.fatal():
                self.errors.append(f"{error.name()}: {error.str()}")
            else:
                raise HarnessError(
                    f"reading {msg.topic()!r} [{msg.partition()}] failed: {error.str()} "
                    f"({error.name()}); the test's records on it cannot be trusted as complete"
                )
        return out

    def end_offsets(self) -> dict[tuple[str, int], int]:
        """Each partition's end (high watermark) as the broker says now."""
        return {
            (tp.topic, tp.partition): kafka_call(
                lambda tp=tp: self._consumer.get_watermark_offsets(tp, timeout=10, cached=False),
                f"asking the end offset of {tp.topic!r} [{tp.partition}]",
            )[1]
            for tp in self._assigned
        }

    def behind(self, ends: dict[tuple[str, int], int]) -> dict[tuple[str, int], tuple[int, int]]:
        """Partitions whose read position is short of ``ends``: (position, end)."""
        positions = {
            (tp.topic, tp.partition): tp.offset for tp in self._consumer.position(self._assigned)
        }
        return {
            key: (positions.get(key, -1), end)
            for key, end in ends.items()
            if end > 0 and positions.get(key, -1) < end
        }

    def read_to_end(self, on_record: Callable[[Message], None], timeout_s: float = 30.0) -> None:
        """Read (handing each record to ``on_record``) until every partition's position has
        reached its end offset as taken at this call. Raises :class:`HarnessError` if it
        cannot (an open transaction that never ends, a broker that does not answer)."""
        ends = self.end_offsets()
        deadline = time.monotonic() + scaled(timeout_s)
        while True:
            for msg in self.poll():
                on_record(msg)
            short = self.behind(ends)
            if not short:
                return
            if time.monotonic() >= deadline:
                raise HarnessError(
                    f"could not read {self.topics} up to their end offsets within "
                    f"{scaled(timeout_s):.0f}s: (position, end) {short}; consumer errors: "
                    f"{self.errors[-5:]}"
                )

    def close(self) -> None:
        self._consumer.close()


#: Answers a broker gives while a new topic's leaders or a group's coordinator are being
#: set up: worth asking again, unlike any other error. ``_UNKNOWN_PARTITION`` is the client's
#: own twin of UNKNOWN_TOPIC_OR_PART: its metadata does not know the partition yet (a full
#: run saw it from a watermark ask right after the test restarted its broker).
TRANSIENT_KAFKA_ERRORS = frozenset(
    {
        "NOT_LEADER_FOR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "UNKNOWN_TOPIC_OR_PART",
        "_UNKNOWN_PARTITION",
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "REQUEST_TIMED_OUT",
        "_TIMED_OUT",
        "_TRANSPORT",
    }
)


#: What a reader is told while the broker is down or restarting (an outage test stops it on
#: purpose): kept and named if the reader then cannot catch up, not raised at once.
UNAVAILABLE_KAFKA_ERRORS = TRANSIENT_KAFKA_ERRORS | {
    "_ALL_BROKERS_DOWN",
    "_RESOLVE",
    "_MSG_TIMED_OUT",
    "BROKER_NOT_AVAILABLE",
}


def kafka_call(fn: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
    """``fn()``, asked again while the broker answers with a transient error (right after
    topics are created a partition may have no leader yet, a group no coordinator). Any other
    error, or one that lasts past the (nominal) timeout, is a :class:`HarnessError` naming
    ``what`` was being done: never a made-up answer such as 0."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + scaled(timeout_s)
    while True:
        try:
            return fn()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.name() if isinstance(err, KafkaError) else None
            if code not in TRANSIENT_KAFKA_ERRORS or time.monotonic() >= deadline:
                raise HarnessError(f"{what} failed: {exc}") from exc
        time.sleep(0.2)


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.1,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that value.

    ``timeout_s`` is nominal (see :func:`scaled`). Raises AssertionError(message) on
    timeout, so it reads like an assertion in a test.
    """
    limit = scaled(timeout_s)
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {limit:.1f}s")
        time.sleep(interval_s)


def wait_for_log(
    path: Path,
    text: str,
    timeout_s: float,
    *,
    proc: subprocess.Popen[Any] | None = None,
    count: int = 1,
) -> str:
    """Wait until the log file ``path`` contains ``text`` (``count`` times); fails at once,
    with the log's tail, if ``proc`` exits first."""

    def seen() -> str | None:
        body = path.read_text(errors="replace") if path.exists() else ""
        if body.count(text) >= count:
            return body
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"{proc.args} exited ({proc.returncode}) before logging {text!r}:\n"
                + log_tail(path)
            )
        return None

    return wait_until(seen, timeout_s, message=f"{text!r} not in {path}:\n{log_tail(path)}")


def group_assignment(settings: Settings, group: str, topic: str) -> dict[str, set[int]]:
    """Which partitions of ``topic`` each member (client id) of consumer group ``group`` owns
    now, as the broker's group coordinator says: readiness without reading anyone's logs."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.librdkafka())
    description = kafka_call(
        lambda: admin.describe_consumer_groups([group], request_timeout=10)[group].result(30),
        f"describing consumer group {group!r}",
    )
    if description.state is not ConsumerGroupState.STABLE:
        return {}
    return {
        f"{m.client_id}/{m.member_id}": {
            tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic
        }
        for m in description.members
    }


def wait_for_group(
    settings: Settings, group: str, topic: str, timeout_s: float = 60.0, *, members: int = 1
) -> dict[str, set[int]]:
    """Wait until ``members`` members of ``group`` are stable and own every partition of
    ``topic`` between them (e.g. a worker that can receive runs the moment they are sent)."""
    wanted = set(range(settings.partitions))

    def ready() -> dict[str, set[int]] | None:
        owned = group_assignment(settings, group, topic)
        if len(owned) >= members and set().union(*owned.values()) == wanted:
            return owned
        return None

    return wait_until(
        ready,
        timeout_s,
        interval_s=0.3,
        message=f"group {group!r} never owned all of {topic!r} with {members} member(s)",
    )


def jobwheel_argv(args: list[str]) -> list[str]:
    """``["jobwheel", ...]`` runs this interpreter's CLI (no PATH lookup, same venv)."""
    if args and args[0] == "jobwheel":
        return [sys.executable, "-m", "jobwheel.cli", *args[1:]]
    return list(args)


def spawn(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a subprocess with stdout+stderr going to ``log_path``, in its own process group.

    ``args[0] == "jobwheel"`` means this venv's jobwheel CLI. The process gets SIGTERM if the
    test process dies, so a crashed test run does not leave workers behind.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**env, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            jobwheel_argv(args),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
    """Send ``sig`` to the process group and wait (``timeout_s`` nominal); SIGKILL if it does
    not exit in time."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(scaled(timeout_s))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return int(proc.returncode)


def process_cmdline(pid: int) -> list[str]:
    """The command line of process ``pid``, as /proc holds it."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def file_lines(path: Path) -> list[str]:
    """The lines of ``path``, none if it does not exist yet (e.g. a ``tests.tasks`` marker)."""
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Procs:
    """Processes a test spawned; all are SIGKILLed (with their groups) at teardown."""

    def __init__(self) -> None:
        self._procs: list[tuple[subprocess.Popen[Any], Path | None]] = []

    def spawn(
        self, args: list[str], env: dict[str, str], log_path: Path
    ) -> subprocess.Popen[bytes]:
        proc = spawn(args, env, log_path)
        self._procs.append((proc, log_path))
        return proc

    def add(self, proc: subprocess.Popen[Any], log_path: Path | None = None) -> None:
        """Track a process started elsewhere (e.g. by :func:`spawn`)."""
        self._procs.append((proc, log_path))

    append = add

    def __iter__(self) -> Iterator[subprocess.Popen[Any]]:
        return iter(p for p, _ in self._procs)

    def __len__(self) -> int:
        return len(self._procs)

    def kill_all(self) -> None:
        for proc, log_path in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
            if log_path is not None:
                # Shown by pytest only when the test failed (captured teardown output).
                print(f"--- {' '.join(map(str, proc.args))} (exit {proc.returncode}); {log_path}")
                print(log_tail(log_path))


#: What a test's worker serves unless the test says otherwise: the demo tasks and the gate
#: tasks of ``tests/tasks.py``.
WORKER_TASKS = "jobwheel.consumers.demo,tests.tasks"
#: The demo tasks alone.
DEMO_TASKS = "jobwheel.consumers.demo"


def start_worker(
    procs: Procs,
    env: dict[str, str],
    log_path: Path,
    *args: str,
    tasks: str = WORKER_TASKS,
    **env_overrides: str,
) -> subprocess.Popen[bytes]:
    """Start ``jobwheel worker --tasks TASKS ARGS...`` (``"--concurrency", "4"``) with ``env``
    and ``env_overrides`` as ``JOBWHEEL_<NAME>`` variables (``worker_shutdown_grace_ms="2000"``
    sets ``JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS``), its output in ``log_path``, which the process
    carries as ``proc.log_path``. Every test starts its workers here."""
    env = {**env, **{f"JOBWHEEL_{name.upper()}": v for name, v in env_overrides.items()}}
    proc = procs.spawn(["jobwheel", "worker", "--tasks", tasks, *args], env, log_path)
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def metric(base: str, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` of the /metrics a service serves at ``base``; one that is
    not exposed is an AssertionError naming it (never read as 0, which a renamed metric would
    pass as)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        body = resp.read().decode()
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"{base}/metrics exposes no {name}{labels}: renamed, or never created?")


#: The JVM options of the suite's brokers (``JOBWHEEL_BROKER_JVM_OPTIONS``): the C1 compiler
#: only. A test broker lives for minutes, and a fresh broker's optimising (C2) compiler took
#: half of all broker CPU in a full run, on the same two cores as the tests.
BROKER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
#: The same as the JVM's arguments, read as the setting is (``LocalBroker(jvm_options=...)``).
BROKER_JVM_ARGS = jvm_options(BROKER_JVM_OPTIONS)

#: The Kafka the suite is built for (deploy/pom.xml's kafka_2.13, the container's image).
KAFKA_IMAGE = "apache/kafka:4.1.1"
REQUIRED_KAFKA = "4.1"
#: A broker config that exists from Kafka 4.1 on (KIP-1071's streams groups, early access in
#: 4.1): a broker without it is older. A client cannot ask a broker for its version, but it
#: can ask for its configs.
KAFKA_41_CONFIG = "group.streams.heartbeat.interval.ms"
#: Removed in Kafka 4.0: a broker that still has it is a 3.x one (ZooKeeper-era versioning).
KAFKA_3_CONFIG = "inter.broker.protocol.version"


def kafka_version_shortfall(config_names: set[str]) -> str | None:
    """Why a broker with these config names is older than :data:`REQUIRED_KAFKA`, or None."""
    if KAFKA_3_CONFIG in config_names:
        return f"it has {KAFKA_3_CONFIG}, which Kafka 4.0 removed: a Kafka 3.x broker"
    if KAFKA_41_CONFIG not in config_names:
        return f"it lacks {KAFKA_41_CONFIG}, which every Kafka {REQUIRED_KAFKA} broker has"
    return None


def require_kafka_version(bootstrap: str) -> None:
    """Fail the session at once, loudly, on a broker older than the suite needs (the KIP-848
    consumer groups, transactions and configs of Kafka 4.1): a test run against another Kafka
    says nothing about the one jobwheel runs on."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    brokers = kafka_call(
        lambda: admin.list_topics(timeout=10).brokers, f"listing the brokers at {bootstrap}"
    )
    for broker_id in brokers:
        resource = ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
        configs = kafka_call(
            lambda r=resource: admin.describe_configs([r])[r].result(30),
            f"describing broker {broker_id}'s configs at {bootstrap}",
        )
        shortfall = kafka_version_shortfall(set(configs))
        if shortfall is not None:
            raise HarnessError(
                f"the broker {broker_id} at {bootstrap} is older than Kafka {REQUIRED_KAFKA} "
                f"({shortfall}); the suite needs Kafka {REQUIRED_KAFKA}+ ({KAFKA_IMAGE} in a "
                "container, or the local broker of deploy/lib): point JOBWHEEL_TEST_BOOTSTRAP "
                "at one, or unset it"
            )


def docker_engine() -> bool:
    """Does a Docker engine answer? (``docker --version`` answers even without one.)"""
    try:
        import docker

        client = docker.from_env()
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def built_c_module(name: str, source: Path) -> ModuleType:
    """The C module ``name`` the install builds from ``source``: skips the test when there is
    no C compiler here (the package then runs on its Python), fails it when there is one and
    the module was not built, or was built from an older ``source`` (a broken build would
    otherwise pass on the Python alone)."""
    import importlib
    import importlib.util
    import shlex
    import shutil
    import sysconfig

    import pytest

    if importlib.util.find_spec(name) is None:
        compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
        if shutil.which(compiler) is None:
            pytest.skip(f"no C compiler ({compiler}): {name} runs on its Python")
        pytest.fail(
            f"{source.name} is not built although {compiler} is here: run `make setup` "
            "(or .venv/bin/pip install -v -e . and read why the build failed)"
        )
    module = importlib.import_module(name)  # a broken build: its own error
    built = Path(str(module.__file__))
    if built.parent == source.parent:  # the editable install builds it next to its source
        assert built.stat().st_mtime >= source.stat().st_mtime, (
            f"{built.name} is older than {source.name}: run `make setup` to rebuild it"
        )
    return module
