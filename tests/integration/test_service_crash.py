"""A service killed by a fatal signal (a crash in native code: librdkafka, RocksDB, the
embedded ClickHouse engine) says in its log where every thread was: real processes, a real
signal, a real broker. One without a stderr to write that to starts anyway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.scheduler_support import start_scheduler
from tests.support import log_tail, scaled, start_worker, wait_for_log

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("service", ["scheduler", "worker"])
def test_a_service_that_dies_of_a_fatal_signal_leaves_every_threads_stack_in_its_log(
    service: str, jobwheel_env: dict[str, str], procs: Any, tmp_path: Path
) -> None:
    if service == "scheduler":
        proc = start_scheduler(procs, jobwheel_env, tmp_path / "s")  # waits for a partition
    else:
        proc = start_worker(procs, jobwheel_env, tmp_path / "worker.log")
        wait_for_log(proc.log_path, "worker started", 60, proc=proc)
    assert proc.poll() is None, log_tail(proc.log_path)
    os.kill(proc.pid, signal.SIGSEGV)  # as a crash in a native library delivers it
    assert proc.wait(scaled(30)) == -signal.SIGSEGV
    log = proc.log_path.read_text(errors="replace")
    fatal = "Fatal Python error: Segmentation fault"
    assert fatal in log, f"the {service} died without a word:\n{log_tail(proc.log_path, 10)}"
    crash = log[log.index(fatal) :]
    # Every thread: the main thread (the service's loop) and the others it runs.
    assert "Current thread" in crash and "Thread 0x" in crash, crash[:2000]
    assert "most recent call first" in crash, crash[:2000]
    assert f'File "{REPO}{os.sep}' in crash, crash[:2000]  # the service's own code named


@pytest.mark.parametrize("stderr", ["None", "io.StringIO()"])
def test_a_service_without_a_stderr_file_descriptor_starts_without_the_report(
    stderr: str,
) -> None:
    """Started with stderr closed (``2>&-``: sys.stderr is None) or run in-process under a
    harness's in-memory stream, faulthandler has nowhere to write and raises: the service
    must start anyway, and the report stays on where there is a descriptor. (In a process of
    its own: faulthandler's state is the process's.)"""
    script = (
        "import faulthandler, io, sys\n"
        "from jobwheel import cli\n"
        f"sys.stderr = {stderr}\n"
        "cli._report_fatal_signals()\n"  # raised RuntimeError / io.UnsupportedOperation
        "assert not faulthandler.is_enabled()\n"
        "sys.stderr = sys.__stderr__\n"
        "cli._report_fatal_signals()\n"
        "assert faulthandler.is_enabled()\n"
        "print('started')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=scaled(60)
    )
    assert (done.returncode, done.stdout) == (0, "started\n"), done.stderr
