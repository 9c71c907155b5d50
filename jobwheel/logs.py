"""Structured logging: one JSON object per line (or key=value text), fields passed as ``extra``.

log.info("run dispatched", extra={"job_id": j, "partition": p})
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
#: Not written: uvicorn's copy of its message with terminal colour codes in it.
_DROPPED = _STANDARD | {"color_message"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _DROPPED})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _DROPPED)
        line = f"{record.levelname.lower():5} {record.name}: {record.getMessage()}"
        line = f"{line} {extra}" if extra else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class ServiceHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (as the standard library's
    own last-resort handler does), not to the stream of the moment it was installed: a command
    run in-process by a test harness, which swaps ``sys.stderr`` per test, left a handler on a
    closed stream, and a background thread that logged later printed a "Logging error"."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        # Task code runs in the worker's process: one that closed or replaced sys.stderr made
        # the next log line raise and the worker die ("lost sys.stderr"). The process's own
        # stderr then.
        stream = sys.stderr
        if stream is None or getattr(stream, "closed", False):
            stream = sys.__stderr__
        return stream

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass

    def handleError(self, record: logging.LogRecord) -> None:
        """A line that cannot be written is lost, never an exception in the code that logged
        (the standard handler lets a ValueError of a closed stream through)."""
        with contextlib.suppress(Exception):
            super().handleError(record)


#: The format :func:`configure` chose for this process (None: not configured yet).
_chosen: str | None = None


def choose_format(configured: str | None, stream: Any = None) -> str:
    """The log format of this process: ``JOBWHEEL_LOG_FORMAT`` when set, else text when
    ``stream`` (stderr) is a terminal and JSON when it is not (a file, a pipe, a supervisor, a
    log collector). The one place the choice is made: a service started by hand at a terminal
    printed JSON lines meant for machines."""
    if configured is not None:
        return configured
    stream = sys.stderr if stream is None else stream
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "json"


def chosen_format() -> str:
    """What :func:`configure` chose, for what writes outside the log (a service's last words
    go as a log line in JSON, as a plain line in text) and for the processes a stack starts,
    whose output it collects in one file per service: one format per file."""
    return _chosen if _chosen is not None else choose_format(None)


def configure(level: str = "INFO", fmt: str | None = None) -> str:
    """Install the jobwheel formatter on the root logger (idempotent); ``fmt`` None chooses
    by stderr (:func:`choose_format`). Returns the format chosen."""
    global _chosen
    _chosen = choose_format(fmt)
    handler = ServiceHandler()
    handler.setFormatter(_JsonFormatter() if _chosen == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for chatty in QUIET_BELOW_WARNING:
        logging.getLogger(chatty).setLevel(logging.WARNING)
    return _chosen


#: Libraries that log every HTTP request at INFO (the Schema Registry client's httpx): one line
#: per record a service encodes would bury its own lines. Their warnings still show.
QUIET_BELOW_WARNING = ("httpx", "httpcore")


class Throttle(logging.Filter):
    """Lets one record of a kind through per ``interval_s`` and counts the rest.

    A kind is the logger, the message template and its first arguments (librdkafka's facility
    and client name) or its ``code`` field: a broker outage then costs one line per client and
    error every half minute, not one per reconnect attempt. The next line of a kind that gets
    through carries ``suppressed`` = how many were dropped since the last one.
    """

    def __init__(self, interval_s: float = 30.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._seen: dict[tuple[Any, ...], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        key = (record.name, record.msg, args[:2], getattr(record, "code", None))
        now = time.monotonic()
        last, dropped = self._seen.get(key, (-self.interval_s, 0))
        if now - last < self.interval_s:
            self._seen[key] = (last, dropped + 1)
            return False
        if dropped:
            record.suppressed = dropped
        self._seen[key] = (now, 0)
        return True


class Sampled:
    """One line per ``interval_s`` for an event one record can cause and a burst repeats
    thousands of times a second (a client's clock behind the broker's by more than the
    tolerance: each of its commands). The caller asks before it builds the line, so a
    suppressed one costs a counter, not a log record: a line per command took an eighth of
    the scheduler's time in a burst of 80,000 from one such client. Its metric still counts
    every one; the line says how many it stands for.
    """

    def __init__(self, interval_s: float = 30.0) -> None:
        self.interval_s = interval_s
        self._last = -interval_s
        self._count = 0

    def due(self) -> int:
        """0 while the last line is younger than the interval; else how many events this
        line stands for (this one and those suppressed since the last)."""
        self._count += 1
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return 0
        count, self._count, self._last = self._count, 0, now
        return count


#: librdkafka lines about a retry that succeeds by itself, which read like failures: a fresh
#: broker loads its coordinators for a moment after each start, and every first producer
#: said "Failed to acquire idempotence PID ... Coordinator load in progress: retrying".
SELF_HEALING = ("Coordinator load in progress",)


class SelfHealing(logging.Filter):
    """Turns the lines of :data:`SELF_HEALING` into DEBUG records (kept when debugging)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not any(text in message for text in SELF_HEALING):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def librdkafka_logger(package: str) -> logging.Logger:
    """The logger a package's confluent-kafka clients are given (their ``logger`` setting):
    ``<package>.librdkafka``, throttled. Without one, librdkafka prints raw ``%3|...|FAIL|``
    lines to stderr, once per reconnect attempt; with one, its lines are log records like any
    other: throttled in a service's log, left out of a one-shot command's output
    (:mod:`jobwheel.cli`)."""
    logger = logging.getLogger(f"{package}.librdkafka")
    if not any(isinstance(f, SelfHealing) for f in logger.filters):
        logger.addFilter(SelfHealing())
    if not any(isinstance(f, Throttle) for f in logger.filters):
        logger.addFilter(Throttle())
    return logger
