"""Helpers shared by the tests: read a topic, wait for a condition, run jobwheel subprocesses.

Use with the fixtures of ``tests/conftest.py`` (``kafka_bootstrap``, ``settings``,
``jobwheel_env``, ``procs``)::

    proc = procs.spawn(["jobwheel", "worker", "--tasks", "consumers.demo"], jobwheel_env,
                       tmp_path / "worker.log")
    msgs = consume(settings, settings.topics.acks, min_count=3)
    wait_until(lambda: proc.poll() is None, 5, message="worker died")
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from confluent_kafka import Message

    from jobwheel.settings import Settings

T = TypeVar("T")


def consume(
    settings: Settings,
    topic: str,
    *,
    min_count: int,
    timeout_s: float = 30.0,
    group: str | None = None,
) -> list[Message]:
    """Read ``topic`` from the beginning until ``min_count`` records (or the timeout).

    Returns what it has on timeout, so the test's own assertion says what was missing.
    Without ``group`` all partitions are assigned directly (no group join: fast and leaves
    no committed offsets); with ``group`` it subscribes as that consumer group. Reads
    committed records only (librdkafka's default ``isolation.level=read_committed``).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    conf = settings.librdkafka(
        **{
            "group.id": group or f"test-consume-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": group is not None,
            "enable.partition.eof": False,
        }
    )
    consumer = Consumer(conf)
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        if group is None:
            partitions: list[int] = []
            while not partitions and time.monotonic() < deadline:
                meta = consumer.list_topics(topic, timeout=5.0).topics.get(topic)
                if meta is not None and meta.error is None:
                    partitions = sorted(meta.partitions)
                else:
                    time.sleep(0.1)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        else:
            consumer.subscribe([topic])
        while len(out) < min_count and time.monotonic() < deadline:
            msg = consumer.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                continue  # transient (e.g. topic metadata not yet propagated)
            out.append(msg)
    finally:
        consumer.close()
    return out


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.1,
    message: str = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that value.

    Raises AssertionError(message) on timeout, so it reads like an assertion in a test.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(message or f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


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
    """Send ``sig`` to the process group and wait; SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return int(proc.returncode)


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
