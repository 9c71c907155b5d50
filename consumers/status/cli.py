"""Subcommands of the ``jobwheel`` CLI for ``jobwheel.consumers.status``.

``serve`` and ``sink`` run the service. The read commands (``status``, ``list``, ``sql``) go
through the status API over HTTP (``JOBWHEEL_API_URL``, default ``http://api_host:api_port``)
rather than opening ClickHouse themselves: the embedded store can be opened by one process only,
and that process is ``jobwheel serve``. ``health`` asks every part of the stack.

The job-control commands (``cancel``, ``pause``, ``resume``, ``trigger``) send the command to
Kafka, then wait a moment for the scheduler's answer in the status store: the scheduler is the
authority (a job it does not know is REJECTED as unknown, a cancel of a cancelled job as
already cancelled), and the store is where its answer can be read. When the status API does not
answer, the command is still sent and the command says it cannot confirm.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jobwheel.errors import JobwheelError, ValidationError
from jobwheel.producers.cli import one_line_errors
from jobwheel.schemas import deadletter, progress
from jobwheel.schemas.models import trigger_run_id

if TYPE_CHECKING:
    from jobwheel.schemas.models import JobCommand
    from jobwheel.settings import Settings

_CONTROL_HELP = {
    "cancel": "cancel a job: no further fires (an active run finishes)",
    "pause": "pause a job's fires until resumed",
    "resume": "resume a paused job",
    "trigger": "run a job once now, outside its schedule (a paused job stays paused)",
}
CONTROL_WAIT_S = 10.0
_JOB_ID_HELP = "the job's id, or its start (4 characters or more) if no other id starts so"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add subcommands; each sets ``handler=`` to a function of the parsed args."""
    _register_services(sub)
    _register_jobs(sub)
    _register_dlq(sub)
    _register_health(sub)


def _register_services(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``serve`` and ``sink``: the processes that run until stopped."""
    p = sub.add_parser(
        "serve",
        help="run the status API (and, with the embedded store, the status sink)",
        description="Run the status API on JOBWHEEL_API_HOST:JOBWHEEL_API_PORT. With the "
        "embedded store (no JOBWHEEL_CLICKHOUSE_URL) this process owns the store directory and "
        "also runs the sink; with a ClickHouse server, run `jobwheel sink` separately.",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--no-sink",
        dest="sink",
        action="store_false",
        default=None,
        help="do not run the sink in this process",
    )
    group.add_argument(
        "--sink",
        dest="sink",
        action="store_true",
        help="run the sink here even with a ClickHouse server",
    )
    p.add_argument("--host", help="bind address (default JOBWHEEL_API_HOST)")
    p.add_argument("--port", type=int, help="port (default JOBWHEEL_API_PORT)")
    p.set_defaults(handler=serve)

    p = sub.add_parser(
        "sink",
        help="run the status sink alone (status topic -> ClickHouse)",
        description="Consume the status topic into ClickHouse. Meant for a ClickHouse server "
        "(JOBWHEEL_CLICKHOUSE_URL); run as many as the topic has partitions.",
    )
    p.set_defaults(handler=sink)


def _register_jobs(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``status``, the control commands, ``list`` and ``sql``: what asks the status API."""
    p = sub.add_parser("status", help="a job's state and its runs")
    p.add_argument("job_id", metavar="JOB_ID", help=_JOB_ID_HELP)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(handler=status)

    for name, text in _CONTROL_HELP.items():
        c = sub.add_parser(
            name,
            help=text,
            description=text[0].upper() + text[1:] + ". Exits 0 once the scheduler applied "
            "it, 1 when the scheduler refused it (unknown job, or a job it does not apply to); "
            "when no answer arrives within --wait (or the status API does not answer) it says "
            "so and exits 0: the command was sent.",
        )
        c.add_argument("job_id", metavar="JOB_ID", help=_JOB_ID_HELP)
        c.add_argument("--reason", metavar="TEXT", help="kept in the status event")
        c.add_argument(
            "--wait",
            type=float,
            default=CONTROL_WAIT_S,
            metavar="SECONDS",
            help=f"how long to wait for the scheduler's answer ({CONTROL_WAIT_S:.0f})",
        )
        c.add_argument(
            "--no-wait", dest="wait", action="store_const", const=0.0, help="do not wait"
        )
        c.set_defaults(handler=control, control=name)
        one_line_errors(c, name)

    p = sub.add_parser("list", help="jobs by state, task, queue, last update")
    p.add_argument(
        "--state", help="the job's state: SCHEDULED, PAUSED, COMPLETED, DEAD or CANCELLED"
    )
    p.add_argument("--task", help="task name")
    p.add_argument("--queue", help="queue (worker pool) the job's runs go to")
    p.add_argument("--since", help="updated within this age (1h, 30m) or since a time")
    p.add_argument("--until", help="updated before this time (or age)")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(handler=list_jobs)

    p = sub.add_parser(
        "sql",
        help="run a read-only query on the status store",
        description="Tables: status_events (read it with FINAL), views jobs and runs.",
    )
    p.add_argument("query", metavar="SQL")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(handler=sql)


def _register_health(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``health``: every part of the pipeline checked at once."""
    p = sub.add_parser(
        "health",
        help="check broker, schedulers, workers and the status service; exit 0 if all answer",
        description="Check Kafka, the scheduler and worker groups, every scheduler partition "
        "(stuck: no commit for JOBWHEEL_HEALTH_STUCK_AFTER_MS with work waiting), the status "
        "API, and the readiness (/health/ready) of each process it can find: the services of "
        "a running `jobwheel up` (its stack.json in the data dir) and JOBWHEEL_HEALTH_URLS "
        "(name=http://host:port,...). Exit 0 when all are fine, 1 naming what is not.",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="per check, seconds (5)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=health)


# --- service commands -----------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from jobwheel.consumers.status.api import create_app
    from jobwheel.consumers.status.sink import StatusSink
    from jobwheel.consumers.status.store import StatusStore
    from jobwheel.settings import get_settings

    settings = get_settings()
    host, port = args.host or settings.api_host, args.port or settings.api_port
    _refuse_open_api(host, settings)
    store = StatusStore.from_settings(settings)
    try:
        run_sink = store.embedded if args.sink is None else args.sink
        status_sink = StatusSink(settings, store) if run_sink else None
        app = create_app(settings, store, sink=status_sink, close_store=True)
        logging.getLogger(__name__).info(
            "status API starting",
            extra={
                "url": f"http://{host}:{port}",
                "sink": run_sink,
                "embedded": store.embedded,
                "authentication": settings.api_tokens().enabled,
            },
        )
        uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
    finally:
        store.close()
    return 0


def _refuse_open_api(host: str, settings: Settings) -> None:
    """An API that schedules jobs (which run code on the workers) is not served to the network
    without a token; on loopback only local users reach it, as with the default bind."""
    import ipaddress

    from jobwheel.errors import ConfigError

    if settings.api_tokens().enabled:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"refusing to serve the status API on {host} without authentication: set "
            "JOBWHEEL_API_TOKEN (or JOBWHEEL_API_TOKEN_FILE) to a long random secret, e.g. "
            "`openssl rand -hex 32`, or bind 127.0.0.1"
        )


def sink(args: argparse.Namespace) -> int:
    import logging
    import signal

    from jobwheel.consumers.status.sink import StatusSink
    from jobwheel.consumers.status.store import StatusStore
    from jobwheel.settings import get_settings
    from jobwheel.signals import on_signals

    settings = get_settings()
    store = StatusStore.from_settings(settings)
    if store.embedded:
        logging.getLogger(__name__).warning(
            "the sink holds the embedded store; the API cannot read it while this runs "
            "(use `jobwheel serve`, which runs both, or a ClickHouse server)",
            extra={"dsn": settings.clickhouse_dsn},
        )
    status_sink = StatusSink(settings, store)
    on_signals((signal.SIGTERM, signal.SIGINT), lambda _signum: status_sink.stop())
    try:
        status_sink.run()
    finally:
        store.close()
    return 0


# --- job control ----------------------------------------------------------------------------


def control(args: argparse.Namespace) -> int:
    from jobwheel.producers.client import JobClient
    from jobwheel.schemas import validation as rules

    settings = _settings()
    rules.job_id(args.job_id)
    rules.optional_text(args.reason, "reason", rules.MAX_REASON_CHARS)
    job_id = resolve_job_id(_Api(settings, timeout_s=5.0), args.job_id)
    with JobClient(settings) as client:
        client.check_broker()
        command = client.control(args.control, job_id, args.reason)
    if args.wait <= 0:
        print(control_line(args.control, command, {}))
        return 0
    answer = _await_verdict(_Api(settings, timeout_s=5.0), args.control, command, args.wait)
    if answer.get("state") == "REJECTED":
        print(f"jobwheel {args.control}: refused: {answer.get('reason')}", file=sys.stderr)
        return 1
    print(control_line(args.control, command, answer))
    if "note" in answer:
        print(f"jobwheel {args.control}: {answer['note']}", file=sys.stderr)
    return 0


#: The job's state once the scheduler applies a command it accepts (a trigger leaves the job's
#: state alone and dispatches a run).
_CONTROL_STATE = {"cancel": "CANCELLED", "pause": "PAUSED", "resume": "SCHEDULED"}


def control_line(kind: str, command: JobCommand, answer: dict[str, Any]) -> str:
    """What a job-control command did, in one line that starts with the job id: the new state
    when the scheduler's answer came (``answer["state"]``), else that it was sent and what the
    scheduler will do. A trigger's run id is known when it is sent (the run is named by the
    trigger's issue time), so it is printed either way. Printing the job id alone said
    neither whether anything happened nor which run to look for."""
    job = command.job_id
    state = answer.get("state")
    if kind == "trigger":
        run = answer.get("run_id") or trigger_run_id(job, command.issued_at_ms)
        if state:
            return f"{job}: trigger applied; run {run} is {state}"
        return f"{job}: trigger sent; the scheduler will dispatch run {run}"
    if state:
        return f"{job}: {kind} applied; the job is {state}"
    return f"{job}: {kind} sent; the scheduler will make the job {_CONTROL_STATE[kind]}"


def resolve_job_id(api: _Api, text: str) -> str:
    """The whole id of the job ``text`` names, as the status API resolves a unique prefix
    (``GET /jobs/{id}/runs``), or ``text`` itself when no job has it as id or prefix, or the
    API does not answer (the scheduler is then the one to say whether it knows the job).
    Raises the API's :class:`ValidationError` naming the candidates when it starts several."""
    try:
        code, payload = api.call("GET", f"/jobs/{urllib.parse.quote(text, safe='')}/runs?limit=1")
    except JobwheelError:
        return text
    if code == 422 and isinstance(payload, dict) and payload.get("field") == "job_id":
        raise ValidationError("job_id", str(payload.get("message")))
    if code == 200 and isinstance(payload, dict) and isinstance(payload.get("job_id"), str):
        return payload["job_id"]
    return text


def _await_verdict(api: _Api, kind: str, command: JobCommand, wait_s: float) -> dict[str, Any]:
    """The scheduler's answer to ``command`` as the status store has it: the verdict (its
    ``state`` is the job's new state or REJECTED; a trigger's is its run), or a ``note`` that
    says why there is none."""
    job = urllib.parse.quote(command.job_id, safe="")
    verdict_path = f"/jobs/{job}/commands/{urllib.parse.quote(command.command_id, safe='')}"
    run_id = trigger_run_id(command.job_id, command.issued_at_ms)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            code, payload = api.call("GET", verdict_path)
            if code == 200 and isinstance(payload, dict):
                return payload
            if code in (401, 403):
                return {"note": f"sent; cannot read the answer ({api.base}: HTTP {code})"}
            if kind == "trigger":
                code, payload = api.call("GET", f"/jobs/{job}/runs?limit=1000")
                runs = payload.get("runs", []) if code == 200 and isinstance(payload, dict) else []
                if any(r.get("run_id") == run_id for r in runs):
                    return {"state": "DISPATCHED", "run_id": run_id}
        except JobwheelError:
            return {"note": f"sent; cannot confirm: the status API at {api.base} does not answer"}
        if time.monotonic() >= deadline:
            return {
                "note": f"sent; no answer from the scheduler within {wait_s:g}s (is it running? "
                f"see `jobwheel status {command.job_id}` later)"
            }
        time.sleep(0.2)


# --- HTTP to the status API -----------------------------------------------------------------


class _Api:
    def __init__(self, settings: Settings, timeout_s: float = 30.0) -> None:
        self.base = settings.status_api_url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = settings.api_tokens().client

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json", "accept": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(  # noqa: S310 - the configured API URL
            self.base + path, data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, {"detail": raw.decode(errors="replace")[:500]}
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise JobwheelError(
                f"the status API at {self.base} does not answer ({reason}); is `jobwheel serve` "
                "running? Point JOBWHEEL_API_URL at it."
            ) from exc

    def get_ok(self, method: str, path: str, body: Any = None) -> Any:
        code, payload = self.call(method, path, body)
        if 200 <= code < 300:
            return payload
        detail = payload.get("detail") if isinstance(payload, dict) else payload
        if code == 422 and isinstance(payload, dict) and "field" in payload:
            raise ValidationError(payload["field"], payload.get("message", ""))
        if isinstance(detail, list):  # FastAPI's own validation shape
            detail = "; ".join(
                f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
            )
        if code == 401:
            detail = (
                f"{detail}; set JOBWHEEL_API_TOKEN (or JOBWHEEL_API_READ_TOKEN, or their _FILE "
                "forms) to the token of the API"
            )
        raise JobwheelError(f"{detail} (HTTP {code})")


def _settings() -> Settings:
    from jobwheel.settings import get_settings

    return get_settings()


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value}ms"


def _print_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True))


class _SaidOnce:
    """The texts one ``status`` printed so far: a later error or reason that repeats one (whole,
    or inside itself) shows :data:`AS_ABOVE` in its place. A dead run's reason embeds the
    worker's reason and error, and the job's reason the run's, so one unknown task printed its
    message (with the worker's list of tasks) six times."""

    #: Shorter texts are said again: a reference would be longer than they are.
    MIN_CHARS = 40

    def __init__(self) -> None:
        self._said: list[str] = []

    def __call__(self, text: str) -> str:
        out = text
        for said in sorted(self._said, key=len, reverse=True):
            out = out.replace(said, AS_ABOVE)
        if len(text) >= self.MIN_CHARS and text not in self._said:
            self._said.append(text)
        return out


#: What stands for a text ``status`` printed above.
AS_ABOVE = "[as above]"


def _plain(text: str) -> str:
    return text


def job_line(job: dict[str, Any], once: Callable[[str], str] = _plain) -> str:
    parts = [
        f"job {job['job_id']}",
        job["state"].upper(),
        f"task={job.get('task') or '-'}",
        *([f"queue={job['queue']}"] if job.get("queue") not in (None, "default") else []),
        f"attempts={job.get('attempts', 0)}",
        f"next_fire={_time(job.get('next_fire_ms'))}",
        f"updated={_time(job.get('updated_ms'))}",
    ]
    if job.get("last_error"):
        parts.append(f"last_error={once(job['last_error'])!r}")
    if job.get("last_reason"):
        parts.append(f"reason={once(job['last_reason'])!r}")
    return "  ".join(parts)


def run_line(run: dict[str, Any], once: Callable[[str], str] = _plain) -> str:
    parts = [
        f"run {run['run_id']}",
        run["state"].upper(),
        f"scheduled={_time(run.get('scheduled_time_ms'))}",
        f"dispatched={_time(run.get('dispatched_ms'))}",
        f"late={_ms(run.get('lateness_ms'))}",
        f"finished={_time(run.get('finished_ms'))}",
        f"duration={_ms(run.get('duration_ms'))}",
        f"attempts={run.get('attempts', 0)}",
        f"worker={run.get('worker') or '-'}",
    ]
    if run.get("result_json") is not None:
        parts.append(f"result={_cut(json.dumps(run.get('result'), ensure_ascii=False))}")
    if run.get("error"):
        parts.append(f"error={once(run['error'])!r}")
    return "  ".join(parts)


def _cut(text: str, limit: int = 300) -> str:
    """A task's result as shown on one line: long ones cut (`--json` has all of it)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status(args: argparse.Namespace) -> int:
    path = "/jobs/" + urllib.parse.quote(args.job_id, safe="")
    payload = _Api(_settings()).get_ok("GET", path)
    if args.json:
        _print_json(payload)
        return 0
    for line in status_lines(payload):
        print(line)
    return 0


def status_lines(payload: dict[str, Any]) -> list[str]:
    """``jobwheel status``'s text of ``GET /jobs/{id}``: the job, its runs, its events; each
    long error or reason in full once, then referred to (:class:`_SaidOnce`)."""
    once = _SaidOnce()
    lines = [job_line(payload["job"], once)]
    lines += [run_line(run, once) for run in payload["runs"]]
    if payload.get("events"):
        lines.append("events:")
        lines += ["  " + event_line(event, once) for event in payload["events"]]
    return lines


def event_line(event: dict[str, Any], once: Callable[[str], str] = _plain) -> str:
    parts = [_time(event["event_time_ms"]), f"{event['state'].upper():10}"]
    if event.get("run_id"):
        parts.append(f"run={event['run_id']} attempt={event['attempt']}")
    if event.get("worker"):
        parts.append(f"worker={event['worker']}")
    if event.get("reason"):
        parts.append(f"reason={once(event['reason'])!r}")
    if event.get("error"):
        parts.append(f"error={once(event['error'])!r}")
    return "  ".join(parts)


def list_jobs(args: argparse.Namespace) -> int:
    params = {
        k: v
        for k, v in {
            "state": args.state,
            "task": args.task,
            "queue": args.queue,
            "since": args.since,
            "until": args.until,
            "limit": args.limit,
            "offset": args.offset,
        }.items()
        if v is not None
    }
    payload = _Api(_settings()).get_ok("GET", "/jobs?" + urllib.parse.urlencode(params))
    if args.json:
        _print_json(payload)
        return 0
    for job in payload["jobs"]:
        print(job_line(job))
    shown, total = len(payload["jobs"]), payload["total"]
    print(f"{shown} of {total} jobs (offset {payload['offset']})", file=sys.stderr)
    return 0


def sql(args: argparse.Namespace) -> int:
    payload = _Api(_settings()).get_ok("POST", "/sql", {"sql": args.query})
    if args.json:
        _print_json(payload)
        return 0
    print("\t".join(payload["columns"]))
    for row in payload["rows"]:
        print("\t".join("NULL" if v is None else str(v) for v in row))
    if payload.get("truncated"):
        print(f"(truncated to {len(payload['rows'])} rows)", file=sys.stderr)
    return 0


# --- dead letters ---------------------------------------------------------------------------

_DLQ_DESCRIPTION = """\
The dead-letter topic (<prefix>.dead-letter, kept 30 days) holds what the scheduler could not
use: runs that ended DEAD (attempts used up, or a failure that is not retried, such as an
unknown task), commands it rejected as invalid or could not read, acknowledgements it could
not read, references to records too large to copy, and run records a worker could not read.
Kinds: dead-run, request, ack, too-large, undecodable-run. `list` shows them; `replay` puts
them back after the cause is fixed."""

_REPLAY_DESCRIPTION = """\
Put dead letters back, after a fix. A dead run is dispatched again by the scheduler as the same
run (same run id, its next attempt, max_attempts attempts of its own), with a DISPATCHED event
saying it is a replay; it runs the job's current definition (re-submit the job with a corrected
task name or arguments first, and the replay uses them). A rejected command is produced again,
its original bytes keyed by its job id, only if the scheduler's own checks accept it now:
commands rejected for a transient reason (a schema version the scheduler did not know yet, a
scheduler error, a producer with the wrong partitioner) replay; an invalid command would be
rejected again unchanged, so it is skipped with the reason (fix it and submit it anew).
Acknowledgements, too-large references and undecodable runs are never replayed. Each run is
replayed from its newest dead letter only, and, when the status API answers, runs no longer
DEAD and commands already applied are skipped. Select with --job, --task, --since, --reason,
--kind or --ref (all that are given must match), or --all. Exit 1 if something could not be sent."""


def _register_dlq(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dlq",
        help="list and replay the dead-letter topic (dead runs, rejected commands)",
        description=_DLQ_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dlq = p.add_subparsers(dest="dlq_command", metavar="{list,replay}", required=True)

    def selectors(c: argparse.ArgumentParser) -> None:
        c.add_argument(
            "--since",
            metavar="WHEN",
            help="dead-lettered at or after: an age (2h, 7d), an ISO 8601 time or epoch ms",
        )
        c.add_argument("--task", help="task name (of the dead run, or the rejected ScheduleJob)")
        c.add_argument("--reason", metavar="TEXT", help="part of the error (case-insensitive)")
        c.add_argument("--job", metavar="ID", help=_JOB_ID_HELP)
        c.add_argument("--kind", choices=deadletter.KINDS, help="kind of record")
        c.add_argument("--json", action="store_true", help="print JSON")
        c.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="longest wait for reading the topic (30)",
        )

    c = dlq.add_parser(
        "list",
        help="show dead letters, oldest first",
        description="Show dead letters, oldest first: when, kind, partition:offset (the "
        "record's reference for `replay --ref`), job, run or command, task, and the error.",
    )
    selectors(c)
    c.add_argument("--limit", type=int, default=1000, help="at most this many, the newest (1000)")
    c.set_defaults(handler=dlq_list)
    one_line_errors(c, "dlq list")

    c = dlq.add_parser(
        "replay",
        help="put dead runs and rejected commands back after a fix",
        description=_REPLAY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    selectors(c)
    c.add_argument(
        "--ref",
        metavar="P:O",
        action="append",
        help="the dead letter at partition:offset (as `list` shows it); repeatable",
    )
    c.add_argument("--all", action="store_true", help="every dead letter (no other selector)")
    c.add_argument("--dry-run", action="store_true", help="say what would be sent; send nothing")
    c.add_argument("--note", metavar="TEXT", help="kept in the replayed run's DISPATCHED event")
    c.set_defaults(handler=dlq_replay, limit=10_000)
    one_line_errors(c, "dlq replay")


def _dlq_filter(args: argparse.Namespace) -> Any:
    from jobwheel.clock import SystemClock
    from jobwheel.producers.deadletters import Filter
    from jobwheel.schemas.timetext import instant_ms

    since = instant_ms(args.since, "since", now=SystemClock().now_ms()) if args.since else None
    job = resolve_job_id(_Api(_settings(), timeout_s=5.0), args.job) if args.job else None
    return Filter(
        since_ms=since,
        task=args.task,
        reason=args.reason,
        job_id=job,
        kind=args.kind,
        limit=args.limit,
    )


def dead_letter_line(letter: dict[str, Any]) -> str:
    parts = [
        _time(letter["timestamp_ms"]),
        f"{letter['kind']:9}",
        f"{letter['ref']:>8}",
        f"job={letter['job_id'] or '-'}",
        letter["what"],
    ]
    if letter.get("source"):
        parts.append(f"from={letter['source']}")
    parts.append(f"error={letter['error']!r}")
    if letter.get("replayed"):
        parts.append(f"[{letter['replayed']}]")
    return "  ".join(parts)


def dlq_list(args: argparse.Namespace) -> int:
    from jobwheel.producers.deadletters import read_dead_letters, replay_marks

    settings = _settings()
    _require_broker(settings)
    letters = read_dead_letters(settings, _dlq_filter(args), timeout_s=args.timeout)
    marks = replay_marks(letters, _already_replayed(_Api(settings, timeout_s=5.0), "dlq list"))
    listed = [{**d.as_dict(), "replayed": marks.get(d.ref)} for d in letters]
    if args.json:
        _print_json({"dead_letters": listed})
        return 0
    for letter in listed:
        print(dead_letter_line(letter))
    done = len(marks)
    print(
        f"{len(letters)} dead letters" + (f", {done} of them replayed already" if done else ""),
        file=sys.stderr,
    )
    return 0


def dlq_replay(args: argparse.Namespace) -> int:
    from jobwheel.producers.client import JobClient
    from jobwheel.producers.deadletters import read_dead_letters, replay

    settings = _settings()
    chosen = any(
        v is not None for v in (args.since, args.task, args.reason, args.job, args.kind, args.ref)
    )
    if args.all == chosen:
        raise ValidationError(
            "selection",
            "choose what to replay with --job, --task, --since, --reason, --kind or --ref, or "
            "say --all (not both)",
        )
    refs = set(args.ref or ())
    for ref in refs:
        partition, _, offset = ref.partition(":")
        if not (partition.isdigit() and offset.isdigit()):
            raise ValidationError("ref", f"{ref!r} is not PARTITION:OFFSET (e.g. 3:1207)")
    _require_broker(settings)
    letters = read_dead_letters(settings, _dlq_filter(args), timeout_s=args.timeout)
    if refs:
        letters = [d for d in letters if d.ref in refs]
    api = _Api(settings, timeout_s=5.0)
    with JobClient(settings) as client:
        outcomes = replay(
            settings,
            letters,
            client=client,
            dry_run=args.dry_run,
            reason=args.note,
            already=_already_replayed(api),
        )
    if args.json:
        _print_json({"replays": [o.as_dict() for o in outcomes]})
    else:
        for o in outcomes:
            what = f"{o.letter.ref:>8}  job={o.letter.job_id}  {o.letter.describe()}"
            if o.sent:
                verb = "would replay" if o.dry_run else "replayed"
                sent = "" if o.dry_run or not o.command_id else f"  command={o.command_id}"
                print(f"{verb:12}  {what}{sent}")
            else:
                print(f"{'skipped':12}  {what}: {o.skip}")
    sent = sum(o.sent for o in outcomes)
    failed = sum(1 for o in outcomes if o.skip and o.skip.startswith("not sent"))
    verb = "would be replayed" if args.dry_run else "replayed"
    print(
        f"{sent} of {len(outcomes)} dead letters {verb}"
        + (f"; {failed} could not be sent" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


def _already_replayed(api: _Api, command: str = "dlq replay") -> Any:
    """What the status store says about a dead letter's run or command (None: replay it).
    The store may be a second behind; when the API does not answer, nothing is skipped (or,
    for ``dlq list``, marked)."""
    state = {"up": True}

    def check(letter: Any) -> str | None:
        if not state["up"]:
            return None
        quote = urllib.parse.quote
        try:
            if letter.run_id is not None:
                code, found = api.call("GET", f"/runs/{quote(letter.run_id, safe='')}")
                run = found.get("run") if code == 200 and isinstance(found, dict) else None
                if isinstance(run, dict) and run.get("state") != "DEAD":
                    return f"replayed already: the run is {run.get('state')} now, not DEAD"
            elif letter.command is not None:
                command = letter.command
                path = (
                    f"/jobs/{quote(command.job_id, safe='')}/commands/"
                    f"{quote(command.command_id, safe='')}"
                )
                code, verdict = api.call("GET", path)
                if code == 200 and isinstance(verdict, dict) and verdict.get("state") != "REJECTED":
                    return f"replayed already: the scheduler applied it ({verdict.get('state')})"
        except JobwheelError:
            state["up"] = False
            print(
                f"jobwheel {command}: the status API at {api.base} does not answer; runs and "
                "commands are not checked against it",
                file=sys.stderr,
            )
        return None

    return check


def _require_broker(settings: Settings) -> None:
    from jobwheel.reach import require_reachable

    require_reachable(settings.bootstrap_servers, 2.0)


# --- health ---------------------------------------------------------------------------------


def health(args: argparse.Namespace) -> int:
    from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister
    from jobwheel.kafka.replication import check_replication
    from jobwheel.reach import unreachable

    settings = _settings()
    why = unreachable(settings.bootstrap_servers, min(args.timeout, 2.0))
    if why is not None:
        # Everything else asks Kafka, and would only wait out its timeout to say the same.
        detail = (
            f"cannot reach Kafka at {settings.bootstrap_servers} ({why}); is the broker "
            "running? (`jobwheel broker status`)"
        )
        if args.json:
            _print_json(
                {"ok": False, "checks": [{"check": "broker", "ok": False, "detail": detail}]}
            )
        else:
            print(f"FAIL  {'broker':<10}  {detail}")
        return 1
    pools = functools.cache(lambda: _pool_signals(settings, args.timeout))
    checks: list[tuple[str, Any]] = [
        ("broker", lambda: _check_broker(settings, args.timeout)),
        ("replication", lambda: check_replication(settings, args.timeout)),
        (
            "schedulers",
            lambda: _check_group(settings, settings.scheduler_app_id, args.timeout),
        ),
        ("partitions", lambda: _check_scheduler_partitions(settings, args.timeout)),
        # One pool per queue (JOBWHEEL_QUEUES and those added at run time), each its own group.
        *(
            (
                "workers" if queue == "default" else f"workers:{queue}",
                functools.partial(_check_pool, settings, queue, pools, args.timeout),
            )
            for queue in QueueDirectory(
                settings, admin_topic_lister(settings, "jobwheel.consumers.status")
            ).names(refresh=True)
        ),
        ("status", lambda: _check_api(settings, args.timeout)),
    ]
    over_http = {"status"}
    for name, url in health_endpoints(settings).items():
        over_http.add(f"ready:{name}")
        checks.append((f"ready:{name}", lambda url=url: _check_ready(url, args.timeout)))
    results = []
    for name, check in checks:
        if results and not results[0]["ok"] and name not in over_http:
            continue  # the broker does not answer: asking it again only waits longer
        try:
            ok, detail = check()
        except Exception as exc:
            ok, detail = False, _one_line(exc)
        results.append({"check": name, "ok": ok, "detail": detail})
    if args.json:
        _print_json({"ok": all(r["ok"] for r in results), "checks": results})
    else:
        width = max(10, *(len(r["check"]) for r in results))
        for r in results:
            print(f"{'ok  ' if r['ok'] else 'FAIL'}  {r['check']:<{width}}  {r['detail']}")
    return 0 if all(r["ok"] for r in results) else 1


def health_endpoints(settings: Settings) -> dict[str, str]:
    """Name -> base URL of the processes whose /health/ready ``jobwheel health`` asks: the
    services of the ``jobwheel up`` running on this data dir, then JOBWHEEL_HEALTH_URLS
    (``name=http://host:port`` or a bare URL, named by its host:port, comma separated)."""
    from jobwheel.deploy.stack import read_stack_file

    found = read_stack_file(settings.data_dir)
    for item in settings.health_urls.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep or "://" in name:
            name, url = urllib.parse.urlsplit(item).netloc or item, item
        found[name.strip()] = url.strip().rstrip("/")
    return found


def _check_ready(base: str, timeout_s: float) -> tuple[bool, str]:
    """One process's readiness: ok, or the checks that fail, in its own words."""
    url = f"{base}/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - configured
            code, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        code, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{url} does not answer ({reason}); is the process running?"
    try:
        report = json.loads(raw)
        failing = [c for c in report["checks"] if not c["ok"]]
    except (ValueError, KeyError, TypeError):
        return False, f"{url} answered {code} without a health report: {raw[:200]!r}"
    if code == 200 and not failing:
        return True, f"{base}: ready"
    what = "; ".join(f"{c['check']}: {c['detail']}" for c in failing) or f"HTTP {code}"
    return False, f"{base}: not ready: {what}"


def _one_line(exc: Exception) -> str:
    from jobwheel.kafka.errors import error_text

    return str(exc) if isinstance(exc, JobwheelError) else error_text(exc)


def _admin(settings: Settings) -> Any:
    from jobwheel.kafka.admin import admin_client

    return admin_client(settings, "jobwheel.consumers.status")


def _check_broker(settings: Settings, timeout_s: float) -> tuple[bool, str]:
    meta = _admin(settings).list_topics(timeout=timeout_s)
    status_topic = settings.topics.status
    has_topic = status_topic in meta.topics
    detail = f"{settings.bootstrap_servers}: {len(meta.brokers)} broker(s)"
    if not has_topic:
        return False, f"{detail}; topic {status_topic} missing (run `jobwheel topics ensure`)"
    count = len(meta.topics[status_topic].partitions)
    if count and count != settings.partitions:
        # Every per-partition check would read partitions that are not there (or miss some).
        return False, (
            f"{detail}; topic {status_topic} has {count} partitions but JOBWHEEL_PARTITIONS is "
            f"{settings.partitions} here: set JOBWHEEL_PARTITIONS={count} where this command "
            "runs (every process of a deployment needs the topics' count)"
        )
    return True, detail


def _check_group(settings: Settings, group: str, timeout_s: float) -> tuple[bool, str]:
    from jobwheel.kafka.admin import describe_group

    state, members = describe_group(settings, group, timeout_s, "jobwheel.consumers.status")
    if not members:
        return False, f"group {group}: no members (state {state}); is it running?"
    return True, f"group {group}: {len(members)} member(s), {state}"


def _pool_signals(settings: Settings, timeout_s: float) -> dict[str, Any]:
    from jobwheel.consumers.status.pools import read_pools

    return {p.queue: p for p in read_pools(settings, timeout_s)}


def _check_pool(
    settings: Settings, queue: str, pools: Callable[[], dict[str, Any]], timeout_s: float
) -> tuple[bool, str]:
    """The pool's group has members; and what it has not finished, to scale it on (the
    same signals as GET /queues; informational: a backlog is no failure)."""
    ok, detail = _check_group(settings, settings.worker_group_for(queue), timeout_s)
    found = pools().get(queue)
    if found is None or found.unfinished is None:
        why = found.error if found is not None else "not read"
        return ok, f"{detail}; backlog unknown: {why}"
    return ok, (
        f"{detail}; {found.unfinished} unfinished ({found.inflight} running, "
        f"{found.waiting} waiting), oldest {found.oldest_unfinished_age_s:.0f} s, "
        f"{found.finished_per_s:g} finished/s"
    )


def _check_scheduler_partitions(settings: Settings, timeout_s: float) -> tuple[bool, str]:
    """Stuck partitions: no commit for 30 s while input has waited as long (timed from the
    oldest unread record's broker timestamp, so a record that arrived on an idle partition
    just now is no stall) or a timer is overdue (the scheduler's progress notes in its
    committed offsets, see schemas/progress.py)."""

    from jobwheel.kafka.admin import scheduler_progress

    found = scheduler_progress(settings, timeout_s, "jobwheel.consumers.status")
    now = int(time.time() * 1000)
    suspects = {
        p: reason
        for p, f in found.items()
        if (
            reason := progress.stuck_reason(
                f.note,
                now,
                f.unread,
                stuck_after_ms=settings.health_stuck_after_ms,
                waiting_since_ms=f.waiting_since_ms,
            )
        )
        is not None
    }
    if suspects:
        return False, "; ".join(
            f"partition {p}: {reason}" for p, reason in sorted(suspects.items())
        )
    return True, f"{settings.partitions} partitions: none stuck"


def _check_api(settings: Settings, timeout_s: float) -> tuple[bool, str]:
    api = _Api(settings, timeout_s=timeout_s)
    code, payload = api.call("GET", "/health")
    if code != 200:
        return False, f"{api.base}/health answered {code}: {payload}"
    sink_stats = payload.get("sink") if isinstance(payload, dict) else None
    extra = f", sink inserted {sink_stats['inserted']}" if sink_stats else ""
    return True, f"{api.base} ok{extra}"
