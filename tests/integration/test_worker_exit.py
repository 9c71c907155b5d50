"""A stopping worker exits within its grace period plus a stated bound
(:data:`jobwheel.consumers.worker.cli.EXIT_BOUND_S`), whatever holds it: real processes, real
signals, a real broker."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from jobwheel.consumers.worker.cli import EXIT_BOUND_S
from jobwheel.schemas.models import State
from tests.integration.scheduler_support import TopicTail, make_run, produce_runs
from tests.support import log_tail, scaled, start_worker, wait_until

GRACE_MS = 1000


def _exit_code(proc: subprocess.Popen[bytes], log_path: Path) -> int:
    """The worker's exit code; it must come within the grace plus the bound (and a margin for
    the load), else the worker did not exit on its own."""
    try:
        return proc.wait(scaled(GRACE_MS / 1000 + EXIT_BOUND_S + 15))
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the worker did not exit within its grace plus {EXIT_BOUND_S:g} s after SIGTERM:\n"
            f"{log_tail(log_path)}"
        ) from None


def test_sigterm_exits_a_worker_whose_task_blocks_the_event_loop(
    settings: Any, jobwheel_env: dict[str, str], procs: Any, tmp_path: Path
) -> None:
    """An async task that never yields (``time.sleep`` in a coroutine) blocks the loop that
    hears signals: before the exit watchdog SIGTERM changed nothing and the worker ran until
    SIGKILL. Now it exits 1 after one warning line, not a line per timer tick."""
    tail = TopicTail(settings, [settings.topics.acks])
    try:
        started = tmp_path / "started"
        quick = make_run(settings, "demo.echo", {"quick": True})
        blocker = make_run(settings, "test.blocks_loop", {"started": str(started)})
        produce_runs(settings, [quick])
        log_path = tmp_path / "worker.log"
        proc = start_worker(procs, jobwheel_env, log_path, worker_shutdown_grace_ms=str(GRACE_MS))
        # The worker is up and answering before the blocking run arrives.
        tail.wait_for(quick.run_id, State.SUCCEEDED, timeout_s=scaled(60))
        produce_runs(settings, [blocker])
        wait_until(started.exists, scaled(60), message="the blocking task never started")
    finally:
        tail.close()
    os.killpg(proc.pid, signal.SIGTERM)
    assert _exit_code(proc, log_path) == 1, log_tail(log_path)
    lines = log_path.read_text().splitlines()
    watchdog = [line for line in lines if "did not exit in time after a stop signal" in line]
    assert len(watchdog) == 1, log_tail(log_path)
    assert "SIGTERM" in watchdog[0]
    # One line about it, not one per tick of a timer.
    repeats = Counter(line.split(": ", 1)[-1][:40] for line in lines)
    assert max(repeats.values()) <= 3, repeats.most_common(3)
