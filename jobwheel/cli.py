"""The ``jobwheel`` command. Each package registers its own subcommands (``<pkg>/cli.py``).

Subcommand modules keep heavy imports (confluent-kafka, chdb, uvicorn) inside the handlers so
``jobwheel --help`` and quick commands start fast.

What a user sees is decided here for every subcommand:

- an error is one line on stderr naming what was wrong and what to do (exit 2 for bad input,
  bad settings included; 1 for everything else), never a traceback;
- a one-shot command (submit, status, health, ...) reports its outcome itself (stdout, exit
  code, that one line), so its log shows errors only (``JOBWHEEL_LOG_LEVEL=DEBUG``: all);
  services (scheduler, worker, serve, sink, up) log at ``JOBWHEEL_LOG_LEVEL``;
- a server command run on an install without its extra (``pip install jobwheel`` is the client
  SDK only) names the extra to install in that one line (:mod:`jobwheel.extras`);
- output cut short by the reader (``jobwheel status ID | head -3``) ends the command quietly;
- modules named on the command line (``jobwheel worker --tasks my_tasks``) are found in the
  current folder too, as ``python -m`` would find them.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from jobwheel import extras, logs
from jobwheel.errors import JobwheelError, ValidationError, clip

if TYPE_CHECKING:
    from jobwheel.settings import Settings

#: Subcommands that run until stopped and log for their log files; every other one is a
#: one-shot command. ``jobwheel up`` is neither: it talks to a person at a terminal itself, so
#: its own log shows warnings and errors only (its services' logs are in their files);
#: ``topics ensure`` shows its warnings (topics created with one replica on a cluster).
SERVICES = frozenset({"scheduler", "worker", "serve", "sink"})
_QUIET_LEVEL = {"up": "WARNING", "topics": "WARNING"}
#: Exit code of a command whose reader went away (128 + SIGPIPE, as a C tool would end).
BROKEN_PIPE = 141


def build_parser() -> argparse.ArgumentParser:
    from jobwheel.consumers import cli as consumers_cli
    from jobwheel.deploy import cli as deploy_cli
    from jobwheel.producers import cli as producers_cli
    from jobwheel.streams import cli as streams_cli

    parser = argparse.ArgumentParser(
        prog="jobwheel", description="A distributed job scheduler on Apache Kafka."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (deploy_cli, producers_cli, streams_cli, consumers_cli):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:
        # The reader of stdout went away: stop quietly, and let nothing flush into the closed
        # pipe at exit (which would print "Exception ignored ... BrokenPipeError").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE


#: Allocations between two young-generation collections of a service (Python's default: 700).
GC_YOUNG_THRESHOLD = 50_000


def _tune_gc() -> None:
    """A service allocates a few hundred objects per record and keeps some of them for long
    (the scheduler's record cache, the sink's batches): with Python's default thresholds its
    collector ran a thousand times per 40,000 jobs and took 60 us per job in a scheduler
    holding 4,096 records. Nearly all of those objects are freed by reference counting; the
    collector is only for cycles, which are rare here. So: collect the young generation every
    50,000 allocations instead of 700, and move what start-up built (modules, settings,
    compiled codecs) out of the collector's reach for good (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _report_fatal_signals() -> None:
    """A service runs native code (librdkafka's threads, RocksDB, the embedded ClickHouse
    engine): one that crashes it (SIGSEGV, SIGABRT from a failed assert, SIGBUS) ends the
    process before any Python handler or log line can say where. Python's faulthandler writes
    every thread's stack to stderr, where the service's log goes, before the process dies,
    so the supervisor's copy of the log names the thread and the call that were running.
    Without a stderr that is a file descriptor (closed, or a test's in-memory stream) there is
    nowhere to write, and the service runs without it."""
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (OSError, RuntimeError, ValueError):  # no file descriptor / sys.stderr is None
        logging.getLogger("jobwheel.cli").debug("fatal signals unreported: stderr has no fd")


def _run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError as SettingsValidationError
    from pydantic_settings import SettingsError

    from jobwheel.settings import get_settings

    try:
        settings = get_settings()
    except (SettingsValidationError, SettingsError) as exc:
        print(f"jobwheel {args.command}: {settings_error(exc)}", file=sys.stderr)
        return 2
    service = args.command in SERVICES
    _configure_logging(args.command, service or _foreground(args), settings)
    if service:
        _tune_gc()
        _report_fatal_signals()
    _importable_from_here()
    # A service's output is its JSON log: its last word is a log line too (a supervisor shows
    # it, a log collector keeps it); a one-shot command's is one plain line.
    json_out = service and logs.chosen_format() == "json"
    server = None
    try:
        if service:  # /metrics and /health/* when JOBWHEEL_METRICS_PORT is set
            from jobwheel import metrics

            server = metrics.start(settings, args.command)
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at exit
        return code
    except ValidationError as exc:
        _say_error(args.command, f"invalid {exc}", json_out)
        return 2
    except JobwheelError as exc:
        _say_error(args.command, str(exc), json_out)
        return 1
    except KeyboardInterrupt:
        return 130
    except ImportError as exc:
        missing = extras.missing_message(args.command, exc)
        if missing is None:
            raise
        _say_error(args.command, missing, json_out)
        return 1
    except Exception:
        if not json_out:
            raise
        logging.getLogger("jobwheel.cli").exception(
            "the service crashed", extra={"command": args.command}
        )
        return 1
    finally:
        if server is not None:
            server.close()


def _say_error(command: str, message: str, json_out: bool) -> None:
    if json_out:
        logging.getLogger("jobwheel.cli").error(message, extra={"command": command})
    else:
        print(f"jobwheel {command}: {message}", file=sys.stderr)


def _foreground(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "foreground", False))


def _configure_logging(command: str, service: bool, settings: Settings) -> None:
    level = settings.log_level
    if not service and level != "DEBUG":
        # the command prints its own outcome; its log is for debugging
        floor = _QUIET_LEVEL.get(command, "ERROR")
        level = max(level, floor, key=logging.getLevelName)
    logs.configure(level, settings.log_format)
    if not service and level != "DEBUG":
        # librdkafka's own chatter (reconnect attempts to a broker that is down) is for a
        # service's log file; a one-shot command says in one line what went wrong.
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: not record.name.endswith(".librdkafka"))


def _importable_from_here() -> None:
    """Modules in the current folder can be imported by name (``--tasks my_tasks``), after
    everything installed, so a file there never shadows a library."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)


# --- settings errors as one line ------------------------------------------------------------

_EXPECTED = {
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "bool_parsing": "true or false",
    "dict_type": "a JSON object",
    "list_type": "a JSON list",
    "json_invalid": "valid JSON",
    "path_type": "a path",
}


def settings_error(exc: Exception) -> str:
    """One line for a ``JOBWHEEL_*`` variable that cannot be read: the variable, its value and
    the form expected (pydantic's own report is a 20-line block naming Python field names)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):  # pydantic-settings could not even decode it (JSON fields)
        match = re.search(r'field "(\w+)"', str(exc))
        name = f"JOBWHEEL_{match[1].upper()}" if match else "a JOBWHEEL_* variable"
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        return (
            f"{name} is not valid JSON{cause}; give a JSON object, e.g. "
            f'{name}=\'{{"client.id": "me"}}\''
        )
    found = errors()
    first = found[0]
    loc = [str(part) for part in first.get("loc", ())]
    name = f"JOBWHEEL_{loc[0].upper()}" if loc else "a JOBWHEEL_* variable"
    if len(loc) > 1:
        name += f" (at {'.'.join(loc[1:])})"
    expected = _EXPECTED.get(first.get("type", ""))
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    if expected is None:
        expected = re.sub(r"^Input should be ", "", message)
    value = f"={clip(first['input'])}" if "input" in first else ""
    more = f" ({len(found) - 1} more setting(s) invalid too)" if len(found) > 1 else ""
    return f"{name}{value} is not valid: expected {expected}{more}"


if __name__ == "__main__":
    sys.exit(main())
