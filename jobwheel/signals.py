"""Stop signals turned into calls on a thread of their own.

CPython runs a Python signal handler in the main thread, between two of its bytecodes: possibly
inside ``threading.Event.wait`` or ``clear`` while that thread holds the event's lock. A handler
that sets the same event (or takes any lock the main thread may hold: a ``Lock``, a thread's
start) then waits for itself for ever. ``jobwheel up`` hung so on a second Ctrl-C, its stop loop
never turning again. The handler installed here only writes the signal's number to a pipe; a
daemon thread reads it and makes the call, where a lock held by the main thread is only a short
wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


def on_signals(signals: Iterable[int], call: Callable[[int], None]) -> Callable[[], None]:
    """Call ``call(signum)`` on a thread of its own for each of ``signals`` received, in order.

    Returns a function that puts the previous handlers back and ends the thread. Outside the
    main thread (where Python refuses handlers) nothing is installed."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handle(signum: int, _frame: FrameType | None) -> None:
        # A full pipe (a flood of signals) drops this one: the calls before it are pending.
        with contextlib.suppress(OSError):
            os.write(write_fd, bytes([signum]))

    def relay() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while data := pipe.read(64):
                for signum in data:
                    try:
                        call(signum)
                    except Exception:
                        log.exception("handling a signal failed", extra={"signal": signum})

    previous: dict[int, Any] = {}
    for sig in signals:
        with contextlib.suppress(ValueError):  # not the main thread (tests)
            previous[sig] = signal.signal(sig, handle)
    if not previous:  # no handler: no signal can come, so no pipe or thread to keep
        os.close(read_fd)
        os.close(write_fd)
        return lambda: None
    threading.Thread(target=relay, name="jobwheel-signals", daemon=True).start()

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_fd)  # the relay reads the end of the pipe and returns

    return restore
