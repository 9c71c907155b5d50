"""The live workers and the tasks they serve, read from the workers topic; and the check
``submit``, the SDK and the API make before sending a job: does a live worker serve its task?

The rules (what a record holds, when a worker is live, what is said about a task) are in
:mod:`jobwheel.schemas.workers`; this module reads the topic (:func:`read_workers`) and decides
what a client does with the answer (:class:`TaskCheck`): warn (the default), refuse, or nothing.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from jobwheel.errors import BrokerError, UnknownTaskWarning, UnservedTaskError
from jobwheel.schemas import workers as roster
from jobwheel.schemas.topics import DEFAULT_QUEUE
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: What a client does about a task no live worker serves: warn and send, refuse and send
#: nothing, or not look (no read of the workers topic at all).
TaskCheckMode = Literal["warn", "refuse", "off"]
TASK_CHECK_MODES: tuple[str, ...] = ("warn", "refuse", "off")
#: How long one read of the workers topic is used for the checks that follow (a client that
#: schedules a thousand jobs a second reads it once per second, not per job).
ROSTER_TTL_S = 1.0
#: How long a read of the workers topic may take.
READ_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Roster:
    """The workers of one read of the topic: all of them (latest records) and when."""

    topic: str
    workers: tuple[roster.WorkerRecord, ...]
    read_at_ms: int

    @property
    def live(self) -> list[roster.WorkerRecord]:
        return roster.live(self.workers, self.read_at_ms)


def read_workers(settings: Settings, timeout_s: float = READ_TIMEOUT_S) -> Roster | None:
    """The workers topic now; None when the broker has no such topic (created by `jobwheel
    topics ensure` from this version on). Raises :class:`BrokerError`."""
    from jobwheel.kafka.reader import read_table

    topic = settings.topics.workers
    table = read_table(settings, topic, "jobwheel.producers", "workers", timeout_s)
    if table is None:
        return None
    return Roster(topic, tuple(roster.latest(table)), time.time_ns() // 1_000_000)


class TaskCheck:
    """A client's check of task names against the live workers, on a roster read at most every
    :data:`ROSTER_TTL_S` (a worker started within that second may be missed: a warning too
    many, never a job lost). Thread-safe.

    When the roster cannot be read (no workers topic yet, a broker error, no ACL to read it)
    ``warn`` says so once per client and sends, and ``refuse`` refuses: it was asked to make
    sure."""

    def __init__(
        self,
        settings: Settings,
        mode: TaskCheckMode = "warn",
        *,
        read: Callable[[Settings], Roster | None] = read_workers,
    ) -> None:
        if mode not in TASK_CHECK_MODES:
            raise ValueError(f"task_check must be one of {TASK_CHECK_MODES}, got {mode!r}")
        self.settings = settings
        self.mode = mode
        self._read = read
        self._lock = threading.Lock()
        self._roster: Roster | None = None
        self._read_at = 0.0
        self._failure: BrokerError | None = None
        self._unreadable_said = False

    def _current(self) -> Roster | None:
        """The roster of the last read, read again when it is older than the TTL; a failed
        read is kept as long (raised again), so a client that cannot read the topic does not
        pay for a failing read on every job."""
        with self._lock:
            if self._read_at == 0.0 or time.monotonic() - self._read_at > ROSTER_TTL_S:
                self._failure = None
                try:
                    self._roster = self._read(self.settings)
                except BrokerError as exc:
                    self._failure = exc
                self._read_at = time.monotonic()
            if self._failure is not None:
                raise self._failure
            return self._roster

    def problem(self, task: str, queue: str = DEFAULT_QUEUE) -> str | None:
        """What is wrong with sending a run of ``task`` on ``queue`` now (one sentence), or
        None. Only the queue's workers count (those in its group): another pool's workers
        never get the run."""
        try:
            found = self._current()
        except BrokerError as exc:
            return f"cannot tell which tasks the workers serve ({exc})"
        if found is None:
            return (
                f"cannot tell which tasks the workers serve: the topic "
                f"{self.settings.topics.workers} does not exist; run `jobwheel topics ensure`"
            )
        group = self.settings.worker_group_for(queue)
        pool = [w for w in found.live if w.group == group]
        return roster.task_problem(task, pool, found.topic)

    def check(
        self,
        tasks: list[str] | list[tuple[str, str]],
        stacklevel: int | None = 2,
        mode: TaskCheckMode | None = None,
    ) -> list[str]:
        """Apply the mode to ``tasks``: ``warn`` returns the problems, and issues an
        :class:`UnknownTaskWarning` for each unless ``stacklevel`` is None (the caller prints
        them itself); ``refuse`` raises :class:`UnservedTaskError` on the first.
        A problem that is not about one task (no live worker, the roster unreadable) is said
        once, not once per task of a batch."""
        mode = mode or self.mode
        if mode == "off":
            return []
        said: list[str] = []
        pairs = [(t, DEFAULT_QUEUE) if isinstance(t, str) else t for t in tasks]
        for task, queue in dict.fromkeys(pairs):
            problem = self.problem(task, queue)
            if problem is None or problem in said:
                continue
            if mode == "refuse":
                raise UnservedTaskError(f"{problem}; nothing was sent")
            if problem.startswith("cannot tell"):
                if self._unreadable_said:
                    continue
                self._unreadable_said = True
            said.append(problem)
            if stacklevel is not None:
                warnings.warn(problem, UnknownTaskWarning, stacklevel=stacklevel + 1)
        return said
