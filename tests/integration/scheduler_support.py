"""Helpers for tests that run real scheduler processes against the session broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from jobwheel.settings import Settings
from schemas.codec import default_codec
from schemas.models import Run, State, StatusEvent
from tests.support import Procs, log_tail, wait_until


class TopicTail:
    """Reads the runs, status, acks and dead-letter topics (read_committed) in a background
    thread; ``status`` holds the events of both the scheduler (status) and workers (acks).

    Everything a pipeline test asserts on is what a real consumer would see.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runs: list[tuple[Run, int]] = []  # (run, broker timestamp ms)
        self.status: list[StatusEvent] = []
        self.dead: list[Any] = []  # raw confluent messages
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._codec = default_codec()
        t = settings.topics
        self._consumer = Consumer(
            settings.librdkafka(
                **{
                    "group.id": f"tail-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._consumer.assign(
            [
                TopicPartition(topic, p, OFFSET_BEGINNING)
                for topic in (t.runs, t.status, t.acks, t.dead_letter)
                for p in range(settings.partitions)
            ]
        )
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        t = self.settings.topics
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            with self._lock:
                if msg.topic() == t.dead_letter:
                    self.dead.append(msg)
                    continue
                value = self._codec.decode(msg.value())
                if msg.topic() == t.runs:
                    self.runs.append((value, msg.timestamp()[1]))
                else:
                    self.status.append(value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

    def runs_of(self, job_id: str) -> list[Run]:
        with self._lock:
            return [r for r, _ in self.runs if r.job_id == job_id]

    def events(self, job_id: str | None = None, state: State | None = None) -> list[StatusEvent]:
        with self._lock:
            return [
                e
                for e in self.status
                if (job_id is None or e.job_id == job_id) and (state is None or e.state == state)
            ]

    def wait(self, predicate: Callable[[], Any], timeout_s: float, message: str = "") -> Any:
        return wait_until(predicate, timeout_s, 0.1, message)


def scheduler_env(base_env: dict[str, str], data_dir: Path) -> dict[str, str]:
    return {**base_env, "JOBWHEEL_DATA_DIR": str(data_dir)}


def start_scheduler(
    procs: Procs, base_env: dict[str, str], data_dir: Path, *, wait: bool = True
) -> Any:
    """Start ``jobwheel scheduler`` with its own data dir; wait until it owns partitions."""
    log_path = data_dir.parent / f"{data_dir.name}.log"
    proc = procs.spawn(["jobwheel", "scheduler"], scheduler_env(base_env, data_dir), log_path)
    if wait:
        wait_until(
            lambda: (
                proc.poll() is not None
                or (log_path.exists() and "partition ready" in log_path.read_text(errors="replace"))
            ),
            90,
            0.2,
            f"scheduler did not claim partitions:\n{log_tail(log_path)}",
        )
        assert proc.poll() is None, f"scheduler exited:\n{log_tail(log_path)}"
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc


def now_ms() -> int:
    return time.time_ns() // 1_000_000
