"""A deadline for blocking client calls that cannot be interrupted.

Some of librdkafka's blocking calls do not keep the timeout they are given:
``rd_kafka_send_offsets_to_transaction`` never checks its coordinator request's timeout
(librdkafka issue 5456) and can wait for good when the cached group coordinator's broker went
away (issue 5511). A short broker restart left a scheduler inside that call for minutes, its
partitions owned and nothing dispatched. Python cannot interrupt a thread blocked in C, so the
deadline is kept from outside: the caller announces "call X started" with :meth:`CallWatchdog.
watch`, and a daemon thread that sees a call still running past its deadline logs one error line
naming it and ends the process with :data:`HUNG_CALL_EXIT_CODE`.

Why exit rather than replace the client: the hung thread is still inside the client handle, and
destroying a librdkafka handle under an in-flight call crashes the process (a use-after-free in
librdkafka's threads) or blocks the destroy on the same stuck request. Exiting is safe because
nothing a scheduler or the status sink holds in memory is needed: the scheduler's open
transaction is aborted by the broker (transaction timeout) and its input read again from the
committed offsets by the next owner, and the sink commits only what it inserted (the table
deduplicates what is read again). Its supervisor (``jobwheel up``, Compose's ``restart:``, a
Kubernetes pod) starts a clean process. The exit code is distinct (75, ``EX_TEMPFAIL``: try
again) so an operator tells this from a crash.

Only time with Kafka reachable counts (``reachable``, a TCP probe of the bootstrap servers): a
call waiting out a broker outage is not hung (librdkafka sends it when the broker is back, and
exiting would not bring the broker back), one that goes on after the broker accepts connections
again is. A frozen broker that still accepts connections counts as reachable.

Health: :meth:`CallWatchdog.check_live` is a liveness check that turns red halfway to the
deadline, so a probe or ``jobwheel health`` sees the hang before the process goes.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: The process's exit code when a watched call outlived its deadline (sysexits' EX_TEMPFAIL).
HUNG_CALL_EXIT_CODE = 75


class CallWatchdog:
    """Ends the process when a watched blocking call outlives ``deadline_s`` (see the module
    doc). ``setting`` names the setting of the deadline in what is logged; ``exit`` and
    ``clock`` are injectable so a test can see the exit path taken without exiting."""

    def __init__(
        self,
        deadline_s: float,
        *,
        what: str,
        setting: str,
        exit: Callable[[int], object] = os._exit,
        clock: Callable[[], float] = time.monotonic,
        check_every_s: float | None = None,
        reachable: Callable[[], bool] | None = None,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"the {what}'s call deadline must be positive, not {deadline_s}")
        self.deadline_s = deadline_s
        self.what = what
        self.setting = setting
        self._exit = exit
        self._clock = clock
        self._every_s = check_every_s or min(1.0, deadline_s / 10)
        self._reachable = reachable
        self._lock = threading.Lock()
        #: token -> (call, when it began, its deadline in seconds)
        self._calls: dict[int, tuple[str, float, float]] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    @contextmanager
    def watch(self, call: str, deadline_s: float | None = None) -> Iterator[None]:
        """Run the body as the blocking call ``call``, under ``deadline_s`` (the watchdog's
        own when None): a call known to return within a shorter time when it is well can be
        given that, so its hang costs no more than it must."""
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"{call}'s deadline must be positive, not {deadline_s}")
        self._start()
        token = next(self._ids)
        with self._lock:
            self._calls[token] = (call, self._clock(), deadline_s or self.deadline_s)
        try:
            yield
        finally:
            with self._lock:
                del self._calls[token]

    def oldest(self) -> tuple[str, float] | None:
        """The longest-running watched call and its seconds so far, or None."""
        with self._lock:
            if not self._calls:
                return None
            call, began, _ = min(self._calls.values(), key=lambda c: c[1])
        return call, self._clock() - began

    def _nearest(self) -> tuple[str, float, float] | None:
        """The watched call that has used the largest share of its deadline: its name, its
        seconds so far and its deadline; None when no call is in flight."""
        now = self._clock()
        with self._lock:
            calls = [(call, now - began, limit) for call, began, limit in self._calls.values()]
        return max(calls, key=lambda c: c[1] / c[2], default=None)

    def check(self) -> bool:
        """One pass of the watchdog: take the exit path if a call is past its deadline."""
        oldest = self.oldest()
        if oldest is None or self.fired:
            return False
        if self._reachable is not None and oldest[1] >= self._every_s and not self._reachable():
            self._restart_clocks()  # waiting out an outage is not hanging (module doc)
            return False
        nearest = self._nearest()
        if nearest is None:
            return False
        call, running_s, deadline_s = nearest
        if running_s <= deadline_s:
            return False
        self.fired = True
        log.critical(
            f"{call} has not returned for {running_s:.0f} s with Kafka reachable (deadline "
            f"{deadline_s:.0f} s, "
            f"{self.setting}): the {self.what} is hung inside its Kafka client and exits with "
            f"code {HUNG_CALL_EXIT_CODE} for its supervisor to restart it (nothing is lost: "
            "what was not committed is read again)",
            extra={"call": call, "running_s": round(running_s, 1), "code": HUNG_CALL_EXIT_CODE},
        )
        _flush_logs()
        self._exit(HUNG_CALL_EXIT_CODE)
        return True

    def _restart_clocks(self) -> None:
        now = self._clock()
        with self._lock:
            self._calls = {token: (call, now, d) for token, (call, _, d) in self._calls.items()}

    def check_live(self) -> tuple[bool, str]:
        """Liveness: red once a call has run for half its deadline (the exit comes at the
        deadline), so the hang shows before the process goes."""
        nearest = self._nearest()
        if nearest is None:
            return True, f"no blocking Kafka call of the {self.what} in flight"
        call, running_s, deadline_s = nearest
        if running_s > deadline_s / 2:
            return False, (
                f"{call} has not returned for {running_s:.0f} s with Kafka reachable: the "
                f"{self.what} is hung in "
                f"its Kafka client and exits at {deadline_s:.0f} s ({self.setting})"
            )
        return True, f"{call} in flight for {running_s:.1f} s"

    def close(self) -> None:
        self._stop.set()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
                return
            self._stop = threading.Event()  # a closed watchdog that is used again starts anew
            self._thread = threading.Thread(
                target=self._run, name=f"jobwheel-watchdog-{self.what}", daemon=True
            )
        self._thread.start()

    def _run(self) -> None:
        stop = self._stop
        while not stop.wait(self._every_s):
            if self.check():
                return


def kafka_reachable(settings: Settings) -> Callable[[], bool]:
    """The watchdog's ``reachable``: does a bootstrap server accept a TCP connection (asked
    at most once a second, only while a call is in flight)."""
    from jobwheel.metrics import BrokerProbe

    probe = BrokerProbe(settings.bootstrap_servers, every_s=1.0, timeout_s=1.0)
    return lambda: probe()[0]


def _flush_logs() -> None:
    """os._exit skips the interpreter's shutdown: flush what the error line went to."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: S110 - exiting anyway; a broken handler must not stop it
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: S110
            pass
