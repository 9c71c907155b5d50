"""A stop signal's handler never waits for a lock the interrupted main thread holds
(:mod:`jobwheel.signals`). ``jobwheel up`` hung on a second Ctrl-C that arrived while its stop
loop was inside ``Event.wait``/``clear``: the handler set the same event."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import scaled

#: The main thread holds an event's lock, as ``Event.wait``/``clear`` do for a moment, when the
#: signal comes; the Python handler runs at its next bytecode, still inside that moment.
SCRIPT = """
import os, signal, sys, threading
from jobwheel.signals import on_signals

event = threading.Event()
if sys.argv[1] == "in-handler":
    signal.signal(signal.SIGUSR1, lambda *_: event.set())
else:
    on_signals([signal.SIGUSR1], lambda _signum: event.set())
with event._cond:
    os.kill(os.getpid(), signal.SIGUSR1)
    sum(range(100))
sys.exit(0 if event.wait(10) else 3)
"""


def _run(mode: str, timeout_s: float) -> int:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], timeout=timeout_s).returncode


def test_a_signal_arriving_while_the_main_thread_holds_the_events_lock_still_sets_it():
    # The hazard is real: the same call made in the handler itself waits for ever.
    with pytest.raises(subprocess.TimeoutExpired):
        _run("in-handler", scaled(3))
    assert _run("relayed", scaled(20)) == 0


def test_off_the_main_thread_nothing_is_installed_and_no_thread_is_left():
    import signal
    import threading

    from jobwheel.signals import on_signals

    before = signal.getsignal(signal.SIGUSR2)
    restores = []
    caller = threading.Thread(target=lambda: restores.append(on_signals([signal.SIGUSR2], print)))
    caller.start()
    caller.join()
    assert signal.getsignal(signal.SIGUSR2) is before
    assert not [t for t in threading.enumerate() if t.name == "jobwheel-signals"]
    restores[0]()  # and putting nothing back is harmless
