"""``jobwheel up``: the whole local stack in one terminal, without Docker.

Starts the local broker (``<data_dir>/kafka``; or uses a running one given with
``--bootstrap``), ensures the topics, then runs every entry of :data:`SERVICES` as a
subprocess, each in a session of its own (so a Ctrl-C in the terminal reaches this supervisor,
which stops the services in order, not the services all at once).

**Output.** Each service's output goes, whole, to ``<data_dir>/logs/<name>.log``, in the log
format the stack chose for itself (``JOBWHEEL_LOG_FORMAT``, or text at a terminal), one format
per file (:func:`set_aside_other_format`). The terminal
gets what a person at it needs: one line per service start, a service's warnings and errors
(with their tracebacks), the few state changes listed per service (:attr:`Service.shown`,
e.g. a worker stopping and handing runs back), and the supervisor's own lines. Framework
chatter, librdkafka lines and escape codes stay in the log files.

**Stopping.** Ctrl-C / SIGTERM stops the services stage by stage (:attr:`Service.stop_stage`):
workers first, while the scheduler and the status service still run, so a run a worker hands
back is dispatched again and recorded at once. Each service gets at least its own grace
(:attr:`Service.grace`: the worker's ``JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS`` plus the time to hand
back and leave its group) before SIGKILL, and the terminal says what it is waiting for, then
every :data:`COUNTDOWN_EVERY_S` how long each service has left. A second
Ctrl-C asks again (a worker then hands its runs back at once, a scheduler exits at once); a third
kills what is left.

**Restart policy.** A service that exits while the stack is up is logged loudly (exit code and
the tail of its log) and restarted after a back-off that doubles from 1 s up to 30 s, reset
once it has stayed up for a minute. A local stack is for development: it keeps going so the
rest stays usable, and the log says what crashed. A broker that dies ends the stack.

**Metrics and health.** Each jobwheel service gets a port of its own for ``/metrics``,
``/health/live`` and ``/health/ready`` (``JOBWHEEL_METRICS_PORT`` in its environment): from
``JOBWHEEL_METRICS_PORT`` of the stack (default :data:`METRICS_BASE_PORT`) upwards, in
:data:`SERVICES` order, or a free port when one is taken. The banner prints them, and
``<data_dir>/stack.json`` lists them while the stack runs, which is where ``jobwheel health``
finds them.

**One stack per data dir.** The services of a stack own its data dir (the scheduler's state, the
embedded ClickHouse, the log files, ``stack.json``), so a second ``jobwheel up`` on it would
only crash-loop against the first one's locks and, on its way out, delete the first one's
``stack.json``. ``jobwheel up`` holds a lock on ``<data_dir>/stack.lock`` while it runs (the
kernel drops it however the process ends) and a second one, finding it held, is refused
before it touches anything, naming the running stack (its pid and API URL) and what to do.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from jobwheel import logs
from jobwheel.deploy.broker import LocalBroker, LocalCluster, is_cluster_dir, tail
from jobwheel.errors import ConfigError
from jobwheel.kafka.admin import ensure_topics, topics_summary
from jobwheel.retry import Backoff
from jobwheel.settings import Settings

log = logging.getLogger(__name__)

#: Grace of a service that declares none; also added to a service's own grace for its exit.
STOP_GRACE_S = 10.0
#: While a stop waits for services, how often the terminal is told how long each has left: a
#: worker's grace is 25 s and more, and a terminal silent that long looks hung (and gets the
#: second Ctrl-C that hands the runs back, or a kill).
COUNTDOWN_EVERY_S = 5.0
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
#: The first metrics port of ``jobwheel up`` when JOBWHEEL_METRICS_PORT is not set.
METRICS_BASE_PORT = 9400
#: What ``jobwheel up`` writes in its data dir while it runs: its pid and its services'
#: metrics/health URLs (read by ``jobwheel health``).
STACK_FILE = "stack.json"
#: Locked (``flock``) by the ``jobwheel up`` running on a data dir, for as long as it runs.
LOCK_FILE = "stack.lock"
#: Lines of a traceback (or other continuation lines) shown after a service's error line.
MAX_CONTINUATION_LINES = 40

_LEVELS = ("debug", "info", "warning", "error", "critical")
_TEXT_LOG = re.compile(r"^(debug|info|warning|error|critical)\s+(\S+): (.*)$")
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def jobwheel(*args: str) -> tuple[str, ...]:
    """argv of a ``jobwheel`` subcommand run by this interpreter (same venv, no PATH lookup).
    ``-P``: ``python -m`` puts the working folder first on the import path, so a folder named
    ``jobwheel`` there (a data dir, as in ``~/.local/share``; any folder of a user's of that
    name) took the package's name in an editable install, and every service of ``jobwheel up``
    failed to import (``jobwheel.kafka`` was the data dir's ``kafka`` folder). The service
    itself adds the folder after the installed packages (its ``--tasks`` modules), as the
    ``jobwheel`` command does."""
    return (sys.executable, "-P", "-m", "jobwheel.cli", *args)


def _default_grace(settings: Settings) -> float:
    return STOP_GRACE_S


@dataclass(frozen=True)
class Service:
    """One long-running process of the local stack.

    ``banner`` is printed once the stack is up, formatted with ``settings`` (e.g.
    ``"status API: {settings.status_api_url}"``). ``enabled=False`` keeps an entry listed but
    skips it with a log line. ``grace`` is how long a stop may take before SIGKILL, from the
    stack's settings; ``waiting_for`` says what that time is for; ``stop_stage`` orders the
    stop (lower first, a stage at a time).
    ``shown`` are the messages of the service's INFO log lines worth a line in the terminal
    (warnings and errors always are). ``metrics``: a jobwheel service that serves
    ``/metrics`` and ``/health/*`` on the port the stack gives it.
    """

    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    banner: str = ""
    enabled: bool = True
    grace: Callable[[Settings], float] = _default_grace
    waiting_for: Callable[[Settings], str] = lambda settings: ""
    stop_stage: int = 1
    shown: frozenset[str] = frozenset()
    metrics: bool = False
    #: Its Kafka principal on a secure stack (``jobwheel acls apply``'s role); a service
    #: without one gets no Kafka credentials there.
    kafka_role: str | None = None


def _worker_grace(settings: Settings) -> float:
    # Its own grace for runs in flight, then handing them back (up to 10 s), then its verdicts,
    # final commit and leaving the group (up to 10 s more, after which it says what the broker
    # did not get and exits); a margin on top, so the worker's own line is never cut by a kill.
    return settings.worker_shutdown_grace_ms / 1000 + 25.0


def _scheduler_grace(settings: Settings) -> float:
    # The transaction in flight commits or times out within the transaction timeout.
    return settings.scheduler_transaction_timeout_ms / 1000 + STOP_GRACE_S


DEMO_TASKS = "jobwheel.consumers.demo"


def worker_service(tasks: str) -> Service:
    """The stack's worker, running the ``@task`` functions of the modules ``tasks`` names
    (``jobwheel up --tasks``; the modules are found in the folder ``jobwheel up`` runs in)."""
    return Service(
        "worker",
        jobwheel("worker", "--tasks", tasks),
        grace=_worker_grace,
        waiting_for=lambda s: (
            f"runs in flight may finish within "
            f"{s.worker_shutdown_grace_ms / 1000:g}s (JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS), then "
            "are handed back to the scheduler"
        ),
        stop_stage=0,
        shown=frozenset({"worker stopping", "worker stopped"}),
        metrics=True,
        kafka_role="worker",
    )


#: The local stack, in start order. Adding a service is one line here.
SERVICES: list[Service] = [
    Service(
        "scheduler",
        jobwheel("scheduler"),
        grace=_scheduler_grace,
        waiting_for=lambda s: "it commits its last transaction and leaves its group",
        metrics=True,
        kafka_role="scheduler",
    ),
    worker_service(DEMO_TASKS),
    Service(
        "api",
        jobwheel("serve"),
        banner="status API: {settings.status_api_url} (OpenAPI at {settings.status_api_url}/docs)",
        waiting_for=lambda s: "the status sink writes what it has read",
        metrics=True,
        kafka_role="api",
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
        self.backoff = Backoff(start_s=BACKOFF_START_S, max_s=BACKOFF_MAX_S)
        self.restart_at: float | None = None
        self.restarts = 0


def terminal_line(name: str, raw: str, shown: frozenset[str]) -> str | None:
    """What the terminal shows of one line of a service's output (None: the log file only).

    A log line (jobwheel's text or JSON format) at WARNING or above is shown, an INFO line only
    when its message is one of ``shown``; anything else (framework output, librdkafka lines) is
    left to the log file. Escape codes are removed.
    """
    line = _ESCAPES.sub("", raw).rstrip()
    parsed = _parse_log_line(line)
    if parsed is None:
        return None
    level, message, rest = parsed
    if level in ("warning", "error", "critical"):
        return f"[{name}] {level}: {message}{rest}"
    if level == "info" and message in shown:
        return f"[{name}] {message}{rest}"
    return None


def set_aside_other_format(log_path: Path, fmt: str) -> Path | None:
    """Move ``log_path`` to ``<name>.log.<its format>`` when its latest log line is not in
    ``fmt``, so a log file holds one format (a ``make run``, text, after a ``jobwheel up``
    under a supervisor, JSON, appended text to JSON lines, and neither a reader nor a log
    collector could parse the file). Returns where it went, or None when nothing moved."""
    try:
        with open(log_path, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 65536))
            lines = file.read().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        line = _ESCAPES.sub("", line).rstrip()
        if _parse_log_line(line) is None:
            continue
        found = "json" if line.startswith("{") else "text"
        if found == fmt:
            return None
        kept = log_path.with_name(f"{log_path.name}.{found}")
        if kept.exists():  # set aside before: this joins it, in the same format
            with open(kept, "ab") as out, open(log_path, "rb") as earlier:
                shutil.copyfileobj(earlier, out)
            log_path.unlink()
        else:
            os.replace(log_path, kept)
        return kept
    return None


def _parse_log_line(line: str) -> tuple[str, str, str] | None:
    """``(level, message, " key=value ...")`` of a jobwheel log line, or None."""
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("level") not in _LEVELS:
            return None
        extra = " ".join(
            f"{k}={v}" for k, v in record.items() if k not in ("ts", "level", "logger", "msg")
        )
        return str(record["level"]), str(record.get("msg", "")), f" {extra}" if extra else ""
    match = _TEXT_LOG.match(line)
    if match is None:
        return None
    level, message = match[1], match[3]
    # The text format is "<message> k=v k=v": the message is the part before the first k=v.
    head, sep, tail_ = message.partition("=")
    if sep and " " in head:
        text, _, key = head.rpartition(" ")
        return level, text, f" {key}={tail_}"
    return level, message, ""


class Stack:
    """The supervisor behind ``jobwheel up``."""

    def __init__(
        self,
        settings: Settings,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        bootstrap: str | None = None,
        tasks: str | None = None,
        services: list[Service] | None = None,
        out: IO[str] | None = None,
        nodes: int | None = None,
        secure: bool = False,
    ) -> None:
        """``nodes`` > 1 runs a local cluster (as does a data dir that holds one); ``secure``
        runs the broker or cluster with TLS, SASL and ACLs, and each service as its role."""
        self.data_dir = Path(data_dir or settings.data_dir).resolve()
        if secure and bootstrap is not None:
            raise ConfigError(
                "--secure is for the broker `jobwheel up` starts; with --bootstrap, give the "
                "stack your cluster's client config in JOBWHEEL_KAFKA_CONFIG instead"
            )
        kafka_dir = self.data_dir / "kafka"
        self.broker: LocalBroker | LocalCluster
        if nodes is None and is_cluster_dir(kafka_dir):
            self.broker = LocalCluster.from_settings(settings, data_dir=kafka_dir, secure=secure)
        elif (nodes or 1) > 1:
            self.broker = LocalCluster.from_settings(
                settings,
                nodes=nodes or 1,
                data_dir=kafka_dir,
                port=port,
                controller_port=controller_port,
                secure=secure,
            )
        else:
            self.broker = LocalBroker.from_settings(
                settings,
                data_dir=kafka_dir,
                port=port,
                controller_port=controller_port,
                secure=secure,
            )
        #: Where ``jobwheel acls apply`` writes each role's client config (secure stacks).
        self.credentials_dir = self.data_dir / "kafka-credentials"
        #: A broker this stack neither starts nor stops (``jobwheel up --bootstrap``).
        self.external = bootstrap
        self.settings = settings.model_copy(
            update={
                "bootstrap_servers": bootstrap or self.broker.bootstrap,
                "data_dir": self.data_dir,
            }
        )
        self.services = list(SERVICES if services is None else services)
        if tasks is not None:
            self.services = [
                worker_service(tasks) if s.name == "worker" else s for s in self.services
            ]
        self.logs_dir = self.data_dir / "logs"
        self.stack_file = self.data_dir / STACK_FILE
        #: service name -> its metrics/health port (services with ``metrics`` only)
        self.metrics_ports: dict[str, int] = {}
        self.out = out or sys.stdout
        self._out_lock = threading.Lock()
        self._running: list[_Running] = []
        self._owns_broker = False
        self._asks = 0  # stop requests after the first (a second Ctrl-C hurries, a third kills)
        self._asked = threading.Event()
        self._lock_fd: int | None = None

    def _say(self, line: str) -> None:
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    def child_env(self, service: Service) -> dict[str, str]:
        """This process's environment, pointed at the stack's broker and data dir, with its
        own metrics port (and none for a service that serves no metrics)."""
        env = {
            **os.environ,
            "JOBWHEEL_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "JOBWHEEL_DATA_DIR": str(self.data_dir),
            "PYTHONUNBUFFERED": "1",
            **service.env,
        }
        # One format for every service's log file: the stack's own choice (the setting, or
        # text at a terminal), not each child's, whose stderr is a pipe (JSON when left to it).
        env["JOBWHEEL_LOG_FORMAT"] = logs.chosen_format()
        if self.external is None and self.broker.secure:
            # each service its own principal, never the admin's config of this process
            env.pop("JOBWHEEL_KAFKA_CONFIG", None)
            if service.kafka_role is not None:
                path = self.credentials_dir / f"{service.kafka_role}.json"
                env["JOBWHEEL_KAFKA_CONFIG"] = path.read_text()
        env.pop("JOBWHEEL_METRICS_PORT", None)
        port = self.metrics_ports.get(service.name)
        if port is not None:
            env["JOBWHEEL_METRICS_PORT"] = str(port)
        return env

    def metrics_url(self, name: str) -> str:
        host = self.settings.metrics_host
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return f"http://{host}:{self.metrics_ports[name]}"

    def _assign_metrics_port(self, service: Service) -> None:
        """The service's metrics port: the one it had if still free, else the next of the
        stack's range (:data:`METRICS_BASE_PORT` or JOBWHEEL_METRICS_PORT), else any free one."""
        if not service.metrics:
            return
        current = self.metrics_ports.get(service.name)
        if current is not None and _port_free(self.settings.metrics_host, current):
            return
        base = self.settings.metrics_port or METRICS_BASE_PORT
        taken = set(self.metrics_ports.values())
        wanted = base + [s.name for s in self.services if s.metrics].index(service.name)
        if wanted not in taken and _port_free(self.settings.metrics_host, wanted):
            port = wanted
        else:
            from jobwheel.deploy.broker import free_port

            port = free_port(self.settings.metrics_host)
        if current is not None:
            self._say(f"service {service.name}: metrics port {current} is taken; using {port}")
        self.metrics_ports[service.name] = port

    def _write_stack_file(self) -> None:
        """``stack.json``: where ``jobwheel health`` finds the services' health endpoints."""
        api = any(s.enabled and s.name == "api" for s in self.services)
        doc = {
            "pid": os.getpid(),
            "bootstrap_servers": self.settings.bootstrap_servers,
            "api_url": self.settings.status_api_url if api else None,
            "services": {name: self.metrics_url(name) for name in self.metrics_ports},
        }
        tmp = self.stack_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(self.stack_file)

    def ask_again(self) -> None:
        """A stop request while stopping (a second Ctrl-C): hurry the services, then kill."""
        self._asks += 1
        self._asked.set()

    def run(self, stop: threading.Event) -> int:
        """Bring the stack up, supervise until ``stop`` is set, then take it down in order.

        Raises :class:`ConfigError` at once, having changed nothing, when another ``jobwheel
        up`` runs on the same data dir."""
        self._claim_data_dir()
        try:
            self._start_broker()
            if stop.is_set():
                return 0
            created = ensure_topics(self.settings)
            self._say(f"topics: {topics_summary(self.settings, created)}")
            if self.external is None and self.broker.secure:
                self._apply_acls()
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            for service in self.services:
                if not service.enabled:
                    self._say(f"service {service.name}: disabled, skipped")
                    continue
                running = _Running(service, self.logs_dir / f"{service.name}.log")
                earlier = set_aside_other_format(running.log_path, logs.chosen_format())
                if earlier is not None:
                    self._say(
                        f"service {service.name}: its log so far is in the other format; "
                        f"kept as {earlier}, this run writes {logs.chosen_format()}"
                    )
                self._running.append(running)
                self._spawn(running)
            self._write_stack_file()
            self._banner()
            while not stop.wait(0.5):
                if self.external is None and not self._broker_running():
                    self._say(f"!! the Kafka broker exited; see {self._broker_log()}")
                    log.error("broker exited", extra={"log": self._broker_log()})
                    return 1
                self._supervise()
            return 0
        finally:
            try:
                self._shutdown()
            finally:
                self._release_data_dir()

    def _claim_data_dir(self) -> None:
        """Lock the data dir for this stack, or refuse: another ``jobwheel up`` holds it.

        The lock is taken before anything else (broker, topics, services, log files), and
        ``stack.json`` is written at once with this process's pid and API URL, so a second
        stack can say which one runs."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(running_stack_message(self.data_dir)) from None
        self._lock_fd = fd
        self._write_stack_file()

    def _release_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the file drops the lock
            self._lock_fd = None

    def _broker_running(self) -> bool:
        """The single broker runs, or any node of the cluster (a cluster with a node down is
        what fault tests and rolling restarts make; only a cluster with none left ends it)."""
        if isinstance(self.broker, LocalCluster):
            # the pids only: status() would also ask every node for metadata, twice a second
            return any(self.broker.node(n).running_pid() for n in self.broker.node_ids)
        return self.broker.running_pid() is not None

    def _broker_log(self) -> str:
        if isinstance(self.broker, LocalCluster):
            return f"{self.broker.data_dir}/node*/logs/server.log"
        return str(self.broker.log_path)

    def _start_broker(self) -> None:
        if self.external is not None:
            self._say(f"kafka: using the broker at {self.external} (not started or stopped here)")
            return
        what = (
            f"cluster of {len(self.broker.nodes)} nodes"
            if isinstance(self.broker, LocalCluster)
            else "broker"
        )
        if self._broker_running():
            if isinstance(self.broker, LocalCluster):
                self.broker.start(die_with_parent=True)  # its nodes that are down; waits for all
            else:
                self.broker.wait_ready()
            self._say(f"kafka: reusing the {what} already running at {self.broker.bootstrap}")
        else:
            seconds = self.broker.start(die_with_parent=True)
            self._owns_broker = True
            self._say(f"kafka: {what} started at {self.broker.bootstrap} in {seconds:.1f}s")
        if self.broker.secure:
            # topics and ACLs are made as the admin; the services get their roles' configs
            admin = {**self.settings.kafka_config, **self.broker.admin_config()}
            self.settings = self.settings.model_copy(update={"kafka_config": admin})
            self._say(
                f"kafka: secure (SASL_SSL and ACLs); CA {self.broker.ca_cert_path}, admin "
                f"config {self.broker.admin_config_path}"
            )

    def _apply_acls(self) -> None:
        from jobwheel.deploy.acls import apply_acls

        roles = sorted({s.kafka_role for s in self.services if s.kafka_role} | {"submitter"})
        apply_acls(self.settings, roles=roles, credentials_dir=self.credentials_dir)
        self._say(
            f"kafka: one principal per role ({', '.join(roles)}); their client configs are in "
            f"{self.credentials_dir}/<role>.json (submit with JOBWHEEL_KAFKA_CONFIG="
            f'"$(cat {self.credentials_dir}/submitter.json)")'
        )

    def _banner(self) -> None:
        lines = [
            "jobwheel stack up",
            f"  bootstrap servers: {self.settings.bootstrap_servers}",
            f"  data dir:          {self.data_dir}",
        ]
        if self.external is None:
            lines.append(f"  broker log:        {self._broker_log()}")
        lines.append(f"  service logs:      {self.logs_dir}/<service>.log (everything they say)")
        names = [r.service.name for r in self._running]
        lines.append(f"  services:          {', '.join(names) if names else '(none)'}")
        for running in self._running:
            if running.service.banner:
                lines.append("  " + running.service.banner.format(settings=self.settings))
        if self.metrics_ports:
            urls = ", ".join(
                f"{name} {self.metrics_url(name)}/metrics" for name in self.metrics_ports
            )
            lines.append(f"  metrics:           {urls} (health: /health/live, /health/ready)")
        lines.append(
            "Ctrl-C stops everything (workers first: runs in flight may finish within their "
            "grace, then are handed back; Ctrl-C again to hand them back at once)."
        )
        self._say("\n".join(lines))

    def _spawn(self, running: _Running) -> None:
        service = running.service
        before = self.metrics_ports.get(service.name)
        self._assign_metrics_port(service)
        if before is not None and self.metrics_ports[service.name] != before:
            self._write_stack_file()
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
            target=self._pump, args=(service, proc, running.log_path), daemon=True
        )
        running.pump.start()
        self._say(f"service {service.name}: started (pid {proc.pid}), log {running.log_path}")

    def _pump(self, service: Service, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        """Copy a service's output to its log file, and what matters of it to the terminal."""
        assert proc.stdout is not None
        continuation = 0  # lines of a traceback still to show after a shown error line
        with open(log_path, "ab") as log_file:
            for raw in iter(proc.stdout.readline, b""):
                log_file.write(raw)
                log_file.flush()
                text = raw.decode(errors="replace")
                shown = terminal_line(service.name, text, service.shown)
                if shown is not None:
                    self._say(shown)
                    continuation = (
                        MAX_CONTINUATION_LINES
                        if " error: " in shown or (" critical: " in shown)
                        else 0
                    )
                elif continuation and _parse_log_line(text.rstrip()) is None:
                    continuation -= 1
                    self._say(f"[{service.name}]   {_ESCAPES.sub('', text).rstrip()}")
                else:
                    continuation = 0

    def _supervise(self) -> None:
        now = time.monotonic()
        for running in self._running:
            proc = running.proc
            if proc is not None and proc.poll() is not None:
                if running.pump is not None:
                    running.pump.join(2.0)
                if now - running.started_at >= STABLE_AFTER_S:
                    running.backoff.reset()
                delay_s = running.backoff.failed()
                running.proc = None
                running.restart_at = now + delay_s
                self._say(
                    f"!! service {running.service.name} exited with code {proc.returncode}; "
                    f"restarting in {delay_s:.0f}s. Last lines of {running.log_path}:\n"
                    + tail(running.log_path, 15)
                )
                log.info(  # the terminal has the line above; this is for a redirected log
                    "service exited",
                    extra={"service": running.service.name, "code": proc.returncode},
                )
            elif running.proc is None and now >= (running.restart_at or float("inf")):
                running.restarts += 1
                self._spawn(running)

    # --- stopping -----------------------------------------------------------------------------

    def _shutdown(self) -> None:
        alive = [r for r in self._running if r.proc is not None and r.proc.poll() is None]
        if alive:
            self._say("stopping the stack (Ctrl-C again: hand running runs back at once)")
        for stage in sorted({r.service.stop_stage for r in alive}):
            self._stop_stage([r for r in alive if r.service.stop_stage == stage])
        for running in self._running:
            if running.pump is not None:
                running.pump.join(2.0)
        if alive:
            self._say(f"services stopped: {', '.join(r.service.name for r in self._running)}")
        self.stack_file.unlink(missing_ok=True)
        if self._owns_broker:
            self.broker.stop()
            self._say("kafka: stopped")

    def _stop_stage(self, group: list[_Running]) -> None:
        """SIGTERM to each service of one stage, then wait for each up to its own grace."""
        started = time.monotonic()
        deadlines: dict[int, float] = {}
        for running in group:
            assert running.proc is not None
            grace = running.service.grace(self.settings)
            deadlines[id(running)] = started + grace
            _signal_group(running.proc, signal.SIGTERM)
            what = running.service.waiting_for(self.settings)
            self._say(
                f"stopping {running.service.name}: waiting up to {grace:.0f}s"
                + (f" ({what})" if what else "")
            )
        asks_seen = self._asks
        waiting = list(group)
        next_count = started + COUNTDOWN_EVERY_S
        while waiting:
            self._asked.wait(0.1)
            self._asked.clear()
            if self._asks != asks_seen:
                asks_seen = self._asks
                hard = asks_seen >= 2
                for running in waiting:
                    assert running.proc is not None
                    _signal_group(running.proc, signal.SIGKILL if hard else signal.SIGTERM)
                names = ", ".join(r.service.name for r in waiting)
                self._say(f"{'killing' if hard else 'hurrying'} {names}")
            now = time.monotonic()
            for running in list(waiting):
                proc = running.proc
                assert proc is not None
                if proc.poll() is not None:
                    waiting.remove(running)
                    code = proc.returncode
                    how = f"exit {code}" if code >= 0 else f"on {signal.Signals(-code).name}"
                    self._say(
                        f"service {running.service.name}: stopped ({how}) "
                        f"after {now - started:.1f}s"
                    )
                elif now >= deadlines[id(running)]:
                    waiting.remove(running)
                    _signal_group(proc, signal.SIGKILL)
                    proc.wait()
                    self._say(
                        f"!! service {running.service.name} did not stop within "
                        f"{deadlines[id(running)] - started:.0f}s; killed"
                    )
            if waiting and now >= next_count:
                next_count += COUNTDOWN_EVERY_S
                left = ", ".join(
                    f"{r.service.name} {max(0.0, deadlines[id(r)] - now):.0f}s" for r in waiting
                )
                one = len(waiting) == 1
                then = ("kill " if asks_seen else "hurry ") + ("it" if one else "them")
                self._say(f"still waiting: {left} left until SIGKILL (Ctrl-C again: {then})")


def _port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def read_stack_file(data_dir: Path) -> dict[str, str]:
    """Service name -> metrics/health URL of the ``jobwheel up`` running on ``data_dir``
    (empty when none runs: no file, or its supervisor is gone)."""
    doc = read_stack_doc(data_dir)
    try:
        services = {str(k): str(v) for k, v in dict(doc["services"]).items()}
        pid = int(doc["pid"])
    except (ValueError, KeyError, TypeError):
        return {}
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # it runs, as another user
    except OSError:
        return {}  # left behind by a stack that was killed
    return services


def read_stack_doc(data_dir: Path) -> dict[str, Any]:
    """The ``stack.json`` of ``data_dir`` as written (empty when there is none, or unreadable)."""
    try:
        doc = json.loads((data_dir / STACK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def running_stack_message(data_dir: Path) -> str:
    """Why a second ``jobwheel up`` on ``data_dir`` is refused, and what to do, in one line."""
    doc = read_stack_doc(data_dir)
    pid = doc.get("pid")
    facts = [f"pid {pid}" if pid else "pid not written yet: it is starting"]
    if doc.get("api_url"):
        facts.append(f"API {doc['api_url']}")
    if doc.get("bootstrap_servers"):
        facts.append(f"Kafka {doc['bootstrap_servers']}")
    stop = f"Ctrl-C in its terminal or `kill {pid}`" if pid else "Ctrl-C in its terminal"
    return (
        f"a jobwheel stack is already running on the data dir {data_dir} ({', '.join(facts)}); "
        f"use that one, stop it first ({stop}), or start this one on another data dir "
        "(--data-dir DIR or JOBWHEEL_DATA_DIR=DIR)"
    )


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
