"""Which queues a deployment has: the ones ``JOBWHEEL_QUEUES`` declares, and every queue whose
runs topic exists on the broker (``jobwheel queues add NAME`` creates one at run time).

A queue *is* its runs topic (:func:`jobwheel.schemas.topics.runs_topic`): the broker's topic
list is the one place a queue added at run time is written, so no process needs a restart or
a new environment to learn it, and a queue can never be known without a topic to carry its
runs. Schedulers, workers, the SDK, the API and the pool signals all ask a
:class:`QueueDirectory`, which reads the topic list once at first use and again, at most every
:data:`REFRESH_S`, when it is asked about a name it does not know yet: a known queue costs a set
lookup, an unknown one at most one metadata request a second however many records name it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from jobwheel.schemas.topics import DEFAULT_QUEUE, queue_of_topic
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: The least time between two reads of the broker's topic list for a name not known yet.
REFRESH_S = 1.0
#: How long one read of the topic list may take.
LIST_TIMEOUT_S = 5.0

#: Reads the names of the broker's topics within the given seconds (raises when it cannot).
TopicLister = Callable[[float], Iterable[str]]


def admin_topic_lister(settings: Settings, package: str = "jobwheel.kafka") -> TopicLister:
    """A :data:`TopicLister` on an admin client of ``settings`` made at its first call. A
    request for every topic: naming one would let a broker that auto-creates topics create it."""
    admin = None

    def names(timeout_s: float) -> Iterable[str]:
        nonlocal admin
        if admin is None:
            from jobwheel.kafka.admin import admin_client

            admin = admin_client(settings, package)
        return admin.list_topics(timeout=timeout_s).topics.keys()

    return names


class QueueDirectory:
    """The queues of one deployment (see the module docstring); a ``Collection`` of names, so
    it stands wherever the declared names did: ``name in directory`` learns a queue added
    since, iterating gives the ones known now. Thread-safe.

    ``benefit_of_doubt``: what ``in`` answers for a name the broker could not be asked about
    (unreachable). True for a client checking a job before it is sent (the scheduler still
    decides, and answers REJECTED with a reason); False for the scheduler itself, which must
    not put runs on a topic it has not seen."""

    def __init__(
        self,
        settings: Settings,
        lister: TopicLister | None,
        *,
        benefit_of_doubt: bool = False,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = settings.topic_prefix
        self.declared = settings.queue_names
        self._lister = lister
        self._benefit_of_doubt = benefit_of_doubt
        self._refresh_s = refresh_s
        self._clock = clock
        self._known = frozenset(self.declared)
        self._found: tuple[str, ...] = ()
        self._read_at: float | None = None
        self._lock = threading.Lock()
        #: The last read of the topic list failed (its error), else None.
        self.error: str | None = None

    def __contains__(self, name: object) -> bool:
        if name in self._known:
            return True
        if not isinstance(name, str) or self._lister is None:
            return False
        with self._lock:
            self._read_if_due()
            if name in self._known:
                return True
            return self.error is not None and self._benefit_of_doubt

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self, refresh: bool = False) -> tuple[str, ...]:
        """The queues known now: the declared ones first (``default`` first), then the ones
        found on the broker by name. ``refresh``: read the topic list first (when one was not
        read within :data:`REFRESH_S`)."""
        if refresh and self._lister is not None:
            with self._lock:
                self._read_if_due()
        return (*self.declared, *self._found)

    def _read_if_due(self) -> None:
        """Read the topic list unless one was read within :data:`REFRESH_S` (lock held)."""
        if self._read_at is None or self._clock() - self._read_at >= self._refresh_s:
            self._read()

    def _read(self) -> None:
        assert self._lister is not None
        self._read_at = self._clock()
        try:
            topics = list(self._lister(LIST_TIMEOUT_S))
        except Exception as exc:
            if self.error is None:
                log.warning(
                    "cannot read the broker's topics to learn the queues added at run time",
                    extra={"error": str(exc), "known": sorted(self._known)},
                )
            self.error = str(exc) or type(exc).__name__
            return
        self.error = None
        found = sorted(
            {q for t in topics if (q := queue_of_topic(self.prefix, t)) is not None}
            - set(self.declared)
        )
        new = set(found) - self._known
        if new:
            log.info("queues found on the broker", extra={"queues": sorted(new)})
        # A runs topic deleted is a queue gone: forgotten, unless JOBWHEEL_QUEUES declares it.
        self._found = tuple(found)
        self._known = frozenset((*self.declared, *found)) | {DEFAULT_QUEUE}
