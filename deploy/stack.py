"""``jobwheel up``: the whole local stack in one terminal, without Docker.

Starts the local broker (``<data_dir>/kafka``), ensures the topics, then runs every entry of
:data:`SERVICES` as a subprocess. Each service's output goes to ``<data_dir>/logs/<name>.log``
and, prefixed with ``[name]``, to this terminal. Ctrl-C / SIGTERM stops the services
(SIGTERM, then SIGKILL after a grace period) and then the broker.

Restart policy: a service that exits while the stack is up is logged loudly (exit code and
the tail of its log) and restarted after a back-off that doubles from 1 s up to 30 s, reset
once it has stayed up for a minute. A local stack is for development: it keeps going so the
rest stays usable, and the log says what crashed. A broker that dies ends the stack.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from deploy.broker import LocalBroker, tail
from deploy.topics import ensure_topics
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0


def jobwheel(*args: str) -> tuple[str, ...]:
    """argv of a ``jobwheel`` subcommand run by this interpreter (same venv, no PATH lookup)."""
    return (sys.executable, "-m", "jobwheel.cli", *args)


@dataclass(frozen=True)
class Service:
    """One long-running process of the local stack.

    ``banner`` is printed once the stack is up, formatted with ``settings`` (e.g.
    ``"status API: {settings.status_api_url}"``). ``enabled=False`` keeps an entry listed but
    skips it with a log line.
    """

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    banner: str = ""
    enabled: bool = True


#: The local stack, in start order. Adding a service is one line here.
SERVICES: list[Service] = [
    Service("scheduler", jobwheel("scheduler")),
    Service("worker", jobwheel("worker", "--tasks", "consumers.demo")),
    Service(
        "api",
        jobwheel("serve"),
        banner="status API: {settings.status_api_url} (OpenAPI at {settings.status_api_url}/docs)",
    ),
]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Running:
    """A service's current process, its output pump and its restart bookkeeping."""

    def __init__(self, service: Service, log_path: Path) -> None:
        self.service = service
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.pump: threading.Thread | None = None
        self.started_at = 0.0
        self.backoff_s = BACKOFF_START_S
        self.restart_at: float | None = None
        self.restarts = 0


class Stack:
    """The supervisor behind ``jobwheel up``."""

    def __init__(
        self,
        settings: Settings,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        services: list[Service] | None = None,
        out: IO[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir or settings.data_dir).resolve()
        self.broker = LocalBroker.from_settings(
            settings,
            data_dir=self.data_dir / "kafka",
            port=port,
            controller_port=controller_port,
        )
        self.settings = settings.model_copy(
            update={"bootstrap_servers": self.broker.bootstrap, "data_dir": self.data_dir}
        )
        self.services = list(SERVICES if services is None else services)
        self.logs_dir = self.data_dir / "logs"
        self.out = out or sys.stdout
        self._out_lock = threading.Lock()
        self._running: list[_Running] = []
        self._owns_broker = False

    def _say(self, line: str) -> None:
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def child_env(self, service: Service) -> dict[str, str]:
        """This process's environment, pointed at the stack's broker and data dir."""
        return {
            **os.environ,
            "JOBWHEEL_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "JOBWHEEL_DATA_DIR": str(self.data_dir),
            "PYTHONUNBUFFERED": "1",
            **service.env,
        }

    def run(self, stop: threading.Event) -> int:
        """Bring the stack up, supervise until ``stop`` is set, then take it down in order."""
        try:
            self._start_broker()
            if stop.is_set():
                return 0
            created = ensure_topics(self.settings)
            self._say(
                f"topics: {len(self.settings.topics.specs())} with prefix "
                f"{self.settings.topic_prefix} ({len(created)} created)"
            )
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            for service in self.services:
                if not service.enabled:
                    self._say(f"service {service.name}: disabled, skipped")
                    continue
                running = _Running(service, self.logs_dir / f"{service.name}.log")
                self._running.append(running)
                self._spawn(running)
            self._banner()
            while not stop.wait(0.5):
                if self.broker.running_pid() is None:
                    self._say(f"!! the Kafka broker exited; see {self.broker.log_path}")
                    log.error("broker exited", extra={"log": str(self.broker.log_path)})
                    return 1
                self._supervise()
            return 0
        finally:
            self._shutdown()

    def _start_broker(self) -> None:
        if self.broker.running_pid() is not None:
            self.broker.wait_ready()
            self._say(f"kafka: reusing the broker already running at {self.broker.bootstrap}")
            return
        seconds = self.broker.start(die_with_parent=True)
        self._owns_broker = True
        self._say(f"kafka: started at {self.broker.bootstrap} in {seconds:.1f}s")

    def _banner(self) -> None:
        lines = [
            "jobwheel stack up",
            f"  bootstrap servers: {self.settings.bootstrap_servers}",
            f"  data dir:          {self.data_dir}",
            f"  broker log:        {self.broker.log_path}",
            f"  service logs:      {self.logs_dir}/<service>.log",
        ]
        names = [r.service.name for r in self._running]
        lines.append(f"  services:          {', '.join(names) if names else '(none)'}")
        for running in self._running:
            if running.service.banner:
                lines.append("  " + running.service.banner.format(settings=self.settings))
        lines.append("Ctrl-C stops everything.")
        self._say("\n".join(lines))

    def _spawn(self, running: _Running) -> None:
        service = running.service
        proc = subprocess.Popen(
            service.argv,
            env=self.child_env(service),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        running.proc = proc
        running.started_at = time.monotonic()
        running.restart_at = None
        running.pump = threading.Thread(
            target=self._pump, args=(service.name, proc, running.log_path), daemon=True
        )
        running.pump.start()
        self._say(f"service {service.name}: started (pid {proc.pid}), log {running.log_path}")

    def _pump(self, name: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        """Copy a service's output to its log file and, prefixed, to the terminal."""
        assert proc.stdout is not None
        with open(log_path, "ab") as log_file:
            for raw in iter(proc.stdout.readline, b""):
                log_file.write(raw)
                log_file.flush()
                self._say(f"[{name}] {raw.decode(errors='replace').rstrip()}")

    def _supervise(self) -> None:
        now = time.monotonic()
        for running in self._running:
            proc = running.proc
            if proc is not None and proc.poll() is not None:
                if running.pump is not None:
                    running.pump.join(2.0)
                if now - running.started_at >= STABLE_AFTER_S:
                    running.backoff_s = BACKOFF_START_S
                running.proc = None
                running.restart_at = now + running.backoff_s
                self._say(
                    f"!! service {running.service.name} exited with code {proc.returncode}; "
                    f"restarting in {running.backoff_s:.0f}s. Last lines of {running.log_path}:\n"
                    + tail(running.log_path, 15)
                )
                log.error(
                    "service exited",
                    extra={"service": running.service.name, "code": proc.returncode},
                )
                running.backoff_s = min(running.backoff_s * 2, BACKOFF_MAX_S)
            elif running.proc is None and now >= (running.restart_at or float("inf")):
                running.restarts += 1
                self._spawn(running)

    def _shutdown(self) -> None:
        alive = [r.proc for r in self._running if r.proc is not None and r.proc.poll() is None]
        for proc in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in alive:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for running in self._running:
            if running.pump is not None:
                running.pump.join(2.0)
        if alive:
            self._say(f"services stopped: {', '.join(r.service.name for r in self._running)}")
        if self._owns_broker:
            self.broker.stop()
            self._say("kafka: stopped")
