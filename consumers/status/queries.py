"""The reads behind the status API, the CLI and the dashboards, in one place.

Everything reads the ``jobs`` and ``runs`` views or ``status_events FINAL`` (migrations 0001 and
0008), so a redelivered event never counts twice and the answer never depends on arrival order
or on the store's merges: each field of a job or a run is the value of its latest event that
sets it (by the ordering token), never "any" one.
Times are epoch milliseconds UTC, as in the contract.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobwheel.consumers.status.sql import SQL_MAX_ROWS, SqlResult, SqlRunner
from jobwheel.consumers.status.store import StatusStore
from jobwheel.errors import ValidationError, clip
from jobwheel.schemas import timetext, validation
from jobwheel.schemas.models import State

#: How state ties are broken inside one (seq, source): the order a run or job goes through.
#: Mirrors ``state_rank`` in migrations/0001 (a unit test keeps the two equal).
STATE_ORDER: tuple[State, ...] = (
    State.SCHEDULED,
    State.RESUMED,
    State.PAUSED,
    State.DISPATCHED,
    State.STARTED,
    State.HEARTBEAT,
    State.FAILED,
    State.RETRYING,
    State.SUCCEEDED,
    State.STALE,
    State.MISSED,
    State.SKIPPED,
    State.DEAD,
    State.COMPLETED,
    State.CANCELLED,
    State.REJECTED,
)

JOB_COLUMNS = (
    "job_id",
    "task",
    "queue",
    "state",
    "state_time_ms",
    "last_run_id",
    "attempts",
    "next_fire_ms",
    "last_error",
    "last_reason",
    "seq",
    "created_ms",
    "updated_ms",
)
RUN_COLUMNS = (
    "job_id",
    "run_id",
    "task",
    "queue",
    "state",
    "scheduled_time_ms",
    "dispatched_ms",
    "started_ms",
    "finished_ms",
    "lateness_ms",
    "duration_ms",
    "attempts",
    "worker",
    "error",
    "reason",
    "deadline_ms",
    "last_heartbeat_ms",
    "updated_ms",
)

MAX_LIST_LIMIT = 1000
#: The SQL parameter is a UInt32; a larger offset would wrap around to another page.
MAX_LIST_OFFSET = 2**32 - 1


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def parse_time(value: str | int, field_name: str, *, now: int | None = None) -> int:
    """A point in time of a filter as epoch ms: epoch ms, an ISO 8601 time with an offset, or
    an age ("15m", "2h": that long before now), by the one grammar of
    :func:`jobwheel.schemas.timetext.instant_ms`."""
    return timetext.instant_ms(value, field_name, now=now if now is not None else now_ms())


#: A job's own states (README, "Job states"): what ``jobs.state``, ``list --state`` and
#: ``GET /jobs?state=`` speak. Runs have theirs (``runs.state``); REJECTED is the answer to a
#: command, an event on the job.
JOB_STATES: tuple[State, ...] = (
    State.SCHEDULED,
    State.PAUSED,
    State.COMPLETED,
    State.DEAD,
    State.CANCELLED,
)
RUN_STATES: tuple[State, ...] = (
    State.DISPATCHED,
    State.STARTED,
    State.FAILED,
    State.RETRYING,
    State.SUCCEEDED,
    State.DEAD,
    State.MISSED,
    State.SKIPPED,
    State.STALE,
    State.CANCELLED,
)


def parse_state(value: str) -> State:
    """A job state for a filter; a run state or a command outcome is refused with a pointer to
    where those are."""
    names = ", ".join(s.value for s in JOB_STATES)
    try:
        state = State(value.strip().upper())
    except ValueError:
        raise ValidationError(
            "state", f"{clip(value)} is not a job state; one of {names}"
        ) from None
    if state in JOB_STATES:
        return state
    if state is State.REJECTED:
        why = "the scheduler's answer to a command (an event on the job, see `jobwheel status ID`)"
    elif state is State.RESUMED:
        why = "an event: a resumed job is SCHEDULED again"
    else:
        why = (
            f'the state of a run; runs are in the runs table, e.g. `jobwheel sql "SELECT job_id, '
            f"run_id FROM runs WHERE state = '{state.value}'\"`"
        )
    raise ValidationError("state", f"{state.value} is not a job state but {why}; one of {names}")


# --- jobs and runs --------------------------------------------------------------------------


def get_job(store: StatusStore, job_id: str) -> dict[str, Any] | None:
    rows = store.dicts(
        f"SELECT {', '.join(JOB_COLUMNS)} FROM jobs WHERE job_id = {{job_id:String}}",
        {"job_id": job_id},
    )
    return rows[0] if rows else None


#: The shortest job id prefix that stands for a job (git's shortest abbreviation): a shorter
#: one would too often pick a job the user did not mean, which a cancel cannot take back.
MIN_JOB_ID_PREFIX = 4
#: How many jobs an ambiguous prefix names.
PREFIX_CANDIDATES = 5


class AmbiguousJobId(ValidationError):
    """A job id prefix that starts the ids of several jobs; ``candidates`` are some of them."""

    def __init__(self, prefix: str, candidates: list[str], more: bool) -> None:
        self.candidates = candidates
        named = ", ".join(candidates) + (", ..." if more else "")
        super().__init__(
            "job_id",
            f"{clip(prefix)} is the start of {'more than ' if more else ''}"
            f"{len(candidates)} job ids ({named}); give more of the id",
        )


def find_job(store: StatusStore, text: str) -> dict[str, Any] | None:
    """The job ``text`` names: the job with that id, else the one job whose id starts with it
    (at least :data:`MIN_JOB_ID_PREFIX` characters), else None. Ids are long (32 hex
    characters by default) and people copy their start, as the README's sample output shortens
    them. Raises :class:`AmbiguousJobId` naming the candidates when several ids start so."""
    job = get_job(store, text)
    if job is not None or len(text) < MIN_JOB_ID_PREFIX:
        return job
    rows = store.query(
        "SELECT job_id FROM jobs WHERE startsWith(job_id, {prefix:String}) "
        "ORDER BY job_id LIMIT {limit:UInt32}",
        {"prefix": text, "limit": PREFIX_CANDIDATES + 1},
    )[2]
    ids = [str(row[0]) for row in rows]
    if len(ids) > 1:
        raise AmbiguousJobId(text, ids[:PREFIX_CANDIDATES], more=len(ids) > PREFIX_CANDIDATES)
    return get_job(store, ids[0]) if ids else None


def job_runs(store: StatusStore, job_id: str, *, limit: int = 100) -> list[dict[str, Any]]:
    """The job's runs, newest scheduled first, each with its result (:func:`with_results`)."""
    runs = store.dicts(
        f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE job_id = {{job_id:String}} "
        "ORDER BY coalesce(scheduled_time_ms, dispatched_ms, updated_ms) DESC, run_id DESC "
        "LIMIT {limit:UInt32}",
        {"job_id": job_id, "limit": limit},
    )
    return with_results(store, job_id, runs)


def job_spec(store: StatusStore, job_id: str) -> dict[str, Any] | None:
    """The job's definition (task, trigger, arguments, limits) from its latest SCHEDULED event
    (``spec_json``, status_event.v3); None for a job scheduled before schedulers wrote it."""
    rows = store.query(
        "SELECT spec_json FROM status_events FINAL WHERE job_id = {job_id:String} "
        "AND state = 'SCHEDULED' AND spec_json IS NOT NULL ORDER BY seq DESC LIMIT 1",
        {"job_id": job_id},
    )[2]
    if not rows:
        return None
    try:
        spec = json.loads(rows[0][0])
    except ValueError:
        return None
    return spec if isinstance(spec, dict) else None


def next_fires(job: dict[str, Any], spec: dict[str, Any] | None, count: int) -> list[int]:
    """Up to ``count`` upcoming fires of a SCHEDULED job: its next fire (the scheduler's own
    number), then, for an interval or cron trigger, the ones after it, computed with the
    scheduler's cron rules (schemas/cron.py) as `jobwheel next` does."""
    if job.get("state") != State.SCHEDULED.value or job.get("next_fire_ms") is None:
        return []
    fires = [int(job["next_fire_ms"])]
    trigger = (spec or {}).get("trigger") or {}
    try:
        if trigger.get("type") == "Every" and int(trigger["interval_ms"]) > 0:
            step = int(trigger["interval_ms"])
            fires += [fires[0] + step * k for k in range(1, count)]
        elif trigger.get("type") == "Cron":
            from jobwheel.schemas.cron import parse_cron, zone

            schedule = parse_cron(str(trigger["expression"]))
            tz = zone(str(trigger.get("timezone") or "UTC"))
            while len(fires) < count:
                fires.append(schedule.next_after(fires[-1], tz))
    except (KeyError, TypeError, ValueError):
        pass  # a definition this reader does not understand: the scheduler's next fire only
    return fires[:count]


def job_of_run(run_id: str) -> str:
    """The job id in a run id (``<job id>@<scheduled ms>`` or ``<job id>@trigger-<ms>``; a job
    id may hold ``@`` itself, the scheduler's suffix never does)."""
    job_id, at, _ = run_id.rpartition("@")
    if not at or not job_id:
        raise ValidationError(
            "run_id", f"{clip(run_id)} is not a run id (<job id>@<scheduled time>)"
        )
    return job_id


def get_run(store: StatusStore, run_id: str) -> dict[str, Any] | None:
    """One run with its result, or None if the store has never heard of it."""
    job_id = job_of_run(run_id)
    rows = store.dicts(
        f"SELECT {', '.join(RUN_COLUMNS)} FROM runs "
        "WHERE job_id = {job_id:String} AND run_id = {run_id:String}",
        {"job_id": job_id, "run_id": run_id},
    )
    return with_results(store, job_id, rows)[0] if rows else None


def run_events(store: StatusStore, run_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """A run's status events in lifecycle order (no HEARTBEATs), latest ``limit``."""
    return store.dicts(
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM ("
        f"SELECT {', '.join(EVENT_COLUMNS)}, source_rank, state_rank FROM status_events FINAL "
        "WHERE job_id = {job_id:String} AND run_id = {run_id:String} AND state != 'HEARTBEAT' "
        "ORDER BY seq DESC, source_rank DESC, state_rank DESC, event_time_ms DESC "
        "LIMIT {limit:UInt32}) "
        "ORDER BY seq, source_rank, state_rank, event_time_ms",
        {"job_id": job_of_run(run_id), "run_id": run_id, "limit": limit},
    )


def with_results(
    store: StatusStore, job_id: str, runs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``runs`` with ``result_json`` (the task's return value as JSON text, from the run's
    SUCCEEDED event) and ``result`` (that value, parsed); both None for a run that has not
    succeeded (its ``error`` says what went wrong)."""
    ids = [r["run_id"] for r in runs if r.get("state") == State.SUCCEEDED.value]
    found: dict[str, str | None] = {}
    if ids:
        rows = store.query(
            "SELECT run_id, argMax(result_json, tuple(seq, source_rank, state_rank, "
            "event_time_ms)) FROM status_events FINAL WHERE job_id = {job_id:String} "
            "AND state = 'SUCCEEDED' AND run_id IN {ids:Array(String)} GROUP BY run_id",
            {"job_id": job_id, "ids": ids},
        )[2]
        found = {str(run_id): text for run_id, text in rows}
    for run in runs:
        text = found.get(run["run_id"])
        run["result_json"] = text
        run["result"] = _parsed(text)
    return runs


def replayed_already(store: StatusStore, letter: Any) -> str | None:
    """Why a dead letter need not be replayed, as the store sees it: its run is no longer
    DEAD, or its command was applied since (None: replay it)."""
    if letter.run_id is not None:
        run = get_run(store, letter.run_id)
        if run is not None and run["state"] != State.DEAD.value:
            return f"replayed already: the run is {run['state']} now, not DEAD"
    elif letter.command is not None:
        verdict = command_verdict(store, letter.command.job_id, letter.command.command_id)
        if verdict is not None and verdict["state"] != State.REJECTED.value:
            return f"replayed already: the scheduler applied it ({verdict['state']})"
    return None


def _parsed(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON after all: shown as the text it is


EVENT_COLUMNS = (
    "event_time_ms",
    "state",
    "source",
    "run_id",
    "attempt",
    "seq",
    "worker",
    "reason",
    "error",
)


def job_events(store: StatusStore, job_id: str, *, limit: int = 200) -> list[dict[str, Any]]:
    """The job's status events in lifecycle order (the ordering token, never arrival), latest
    ``limit``. HEARTBEATs are left out: they say only that a run is still alive."""
    return store.dicts(
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM ("
        f"SELECT {', '.join(EVENT_COLUMNS)}, source_rank, state_rank FROM status_events FINAL "
        "WHERE job_id = {job_id:String} AND state != 'HEARTBEAT' "
        "ORDER BY seq DESC, source_rank DESC, state_rank DESC, event_time_ms DESC "
        "LIMIT {limit:UInt32}) "
        "ORDER BY seq, source_rank, state_rank, event_time_ms",
        {"job_id": job_id, "limit": limit},
    )


def command_verdict(store: StatusStore, job_id: str, command_id: str) -> dict[str, Any] | None:
    """The scheduler's answer to one command, if the store has it: the first event the command
    caused (its id is ``<command id>:<STATE>``): the job's new state, or REJECTED and why. A
    manual trigger's verdict is its run (``<job id>@trigger-<issued ms>``) or a REJECTED."""
    rows = store.dicts(
        "SELECT state, reason, event_time_ms FROM status_events FINAL "
        "WHERE job_id = {job_id:String} AND startsWith(event_id, {prefix:String}) "
        "ORDER BY seq, state_rank LIMIT 1",
        {"job_id": job_id, "prefix": f"{command_id}:"},
    )
    if not rows:
        return None
    verdict = rows[0]
    if verdict["state"] == State.RESUMED.value:
        # RESUMED names the event, not a state a job is in (`jobwheel resume` said "the job is
        # RESUMED"): a resumed job is SCHEDULED again, or already COMPLETED or DEAD when its
        # runs ended while it was paused (the scheduler settles it with the resume).
        job = get_job(store, job_id)
        settled = job is not None and job["state"] in (State.COMPLETED.value, State.DEAD.value)
        verdict["state"] = job["state"] if job is not None and settled else State.SCHEDULED.value
    return verdict


@dataclass(frozen=True)
class JobFilter:
    """``since``/``until`` bound the job's last update (``updated_ms``), inclusive."""

    state: State | None = None
    task: str | None = None
    #: The job's queue (worker pool), as its latest definition names it.
    queue: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    limit: int = 100
    offset: int = 0

    def __post_init__(self) -> None:
        if self.queue is not None:
            validation.queue(self.queue)  # the one rule: a name no job can have is an error
        if not 1 <= self.limit <= MAX_LIST_LIMIT:
            raise ValidationError("limit", f"must be between 1 and {MAX_LIST_LIMIT}")
        if not 0 <= self.offset <= MAX_LIST_OFFSET:
            raise ValidationError("offset", f"must be between 0 and {MAX_LIST_OFFSET}")
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.since_ms > self.until_ms
        ):
            raise ValidationError("since", "is after until")


@dataclass
class JobPage:
    jobs: list[dict[str, Any]]
    total: int
    limit: int
    offset: int
    filter: Mapping[str, Any] = field(default_factory=dict)


def list_jobs(store: StatusStore, flt: JobFilter) -> JobPage:
    """Jobs matching the filter, most recently updated first; ``total`` counts all matches."""
    where, params = [], {}
    if flt.state is not None:
        where.append("state = {state:String}")
        params["state"] = flt.state.value
    if flt.task is not None:
        where.append("task = {task:String}")
        params["task"] = flt.task
    if flt.queue is not None:
        where.append("queue = {queue:String}")
        params["queue"] = flt.queue
    if flt.since_ms is not None:
        where.append("updated_ms >= {since:Int64}")
        params["since"] = flt.since_ms
    if flt.until_ms is not None:
        where.append("updated_ms <= {until:Int64}")
        params["until"] = flt.until_ms
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    params.update(limit=flt.limit, offset=flt.offset)
    rows = store.dicts(
        f"SELECT {', '.join(JOB_COLUMNS)}, count() OVER () AS _total FROM jobs {clause} "
        "ORDER BY updated_ms DESC, job_id LIMIT {limit:UInt32} OFFSET {offset:UInt32}",
        params,
    )
    total = int(rows[0]["_total"]) if rows else 0
    if not rows and flt.offset:
        total = int(store.query(f"SELECT count() FROM jobs {clause}", params)[2][0][0])
    for row in rows:
        row.pop("_total")
    return JobPage(rows, total, flt.limit, flt.offset)


def state_counts(store: StatusStore) -> dict[str, int]:
    """Jobs per current state (only states that occur)."""
    _, _, rows = store.query(STATE_COUNTS_SQL)
    return {str(state): int(n) for state, n in rows}


STATE_COUNTS_SQL = "SELECT state, count() AS jobs FROM jobs GROUP BY state ORDER BY state"


# --- ad-hoc read-only SQL -------------------------------------------------------------------


def run_read_only(store: StatusStore, sql: str, *, max_rows: int = SQL_MAX_ROWS) -> SqlResult:
    """One read-only statement on ``store``'s own connection (tools, tests, dashboards); the
    API runs them on connections of their own (:class:`jobwheel.consumers.status.sql.SqlRunner`)."""
    return SqlRunner(store.dsn, store.database, max_rows=max_rows).run_on(store, sql)


# --- dashboards -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """One dashboard panel: its SQL is shown verbatim in DASHBOARDS.md and in Grafana.

    The SQL may use the Grafana ClickHouse data source macros ``$__timeFilter_ms(col)``,
    ``$__fromTime_ms`` and ``$__toTime_ms`` (the dashboard's time range);
    :func:`expand_macros` replaces them for running the SQL anywhere else.
    """

    key: str
    title: str
    kind: str  # grafana panel type: timeseries | table | barchart | piechart
    description: str
    sql: str


PANELS: tuple[Panel, ...] = (
    Panel(
        "runs_per_minute",
        "Run events per minute by state",
        "timeseries",
        "Run state changes per minute (HEARTBEAT excluded). FINAL collapses redelivered "
        "copies of an event, so a replayed batch does not show as a spike.",
        """SELECT
    toStartOfMinute(event_time) AS time,
    state,
    count() AS events
FROM status_events FINAL
WHERE $__timeFilter_ms(event_time)
  AND run_id IS NOT NULL
  AND state != 'HEARTBEAT'
GROUP BY time, state
ORDER BY time, state""",
    ),
    Panel(
        "lateness",
        "Fire lateness percentiles (ms)",
        "timeseries",
        "Lateness = first dispatch - scheduled time, per minute of dispatch. The scheduler's "
        "target is p99 < 100 ms and never more than 2 s.",
        """SELECT
    toStartOfMinute(event_time) AS time,
    quantileExact(0.5)(event_time_ms - scheduled_time_ms) AS p50,
    quantileExact(0.95)(event_time_ms - scheduled_time_ms) AS p95,
    quantileExact(0.99)(event_time_ms - scheduled_time_ms) AS p99,
    max(event_time_ms - scheduled_time_ms) AS max
FROM status_events FINAL
WHERE $__timeFilter_ms(event_time)
  AND state = 'DISPATCHED'
  AND attempt <= 1
  AND scheduled_time_ms IS NOT NULL
GROUP BY time
ORDER BY time""",
    ),
    Panel(
        "failure_rate",
        "Failure rate by task",
        "table",
        "Runs that finished in the time range, by outcome (a run's outcome is its last state, "
        "so a run that failed and then succeeded on retry counts as a success).",
        """SELECT
    task,
    countIf(state = 'SUCCEEDED') AS succeeded,
    countIf(state IN ('FAILED', 'DEAD')) AS failed,
    countIf(state IN ('MISSED', 'SKIPPED', 'STALE')) AS not_run,
    round(failed / greatest(succeeded + failed, 1), 4) AS failure_rate
FROM runs
WHERE finished_ms BETWEEN toUnixTimestamp64Milli($__fromTime_ms)
                      AND toUnixTimestamp64Milli($__toTime_ms)
GROUP BY task
ORDER BY failure_rate DESC, task""",
    ),
    Panel(
        "stuck_runs",
        "Stuck runs (no finish past their deadline)",
        "table",
        "Runs still DISPATCHED or STARTED whose visibility deadline (moved by heartbeats) has "
        "passed: the scheduler should have redelivered them. Not bound to the time range.",
        """SELECT
    job_id,
    run_id,
    task,
    state,
    attempts,
    worker,
    fromUnixTimestamp64Milli(deadline_ms) AS deadline,
    toUnixTimestamp64Milli(now64(3)) - deadline_ms AS overdue_ms
FROM runs
WHERE state IN ('DISPATCHED', 'STARTED')
  AND deadline_ms < toUnixTimestamp64Milli(now64(3))
ORDER BY overdue_ms DESC
LIMIT 100""",
    ),
    Panel(
        "upcoming_fires",
        "Upcoming fires",
        "table",
        "The next fires of SCHEDULED jobs, soonest first (a paused job has none until it is "
        "resumed). Not bound to the time range.",
        """SELECT
    job_id,
    task,
    fromUnixTimestamp64Milli(next_fire_ms) AS next_fire,
    next_fire_ms - toUnixTimestamp64Milli(now64(3)) AS in_ms
FROM jobs
WHERE state = 'SCHEDULED'
  AND next_fire_ms >= toUnixTimestamp64Milli(now64(3))
ORDER BY next_fire_ms
LIMIT 100""",
    ),
    Panel(
        "runs_by_queue",
        "Runs finished per minute by queue",
        "timeseries",
        "Verdicts (SUCCEEDED, FAILED) the workers of each pool sent, per minute: each pool's "
        "throughput. Runs finished by workers older than status_event.v4 name no queue.",
        """SELECT
    toStartOfMinute(event_time) AS time,
    ifNull(queue, '(not named)') AS pool,
    count() AS runs
FROM status_events FINAL
WHERE $__timeFilter_ms(event_time)
  AND source = 'worker'
  AND state IN ('SUCCEEDED', 'FAILED')
GROUP BY time, pool
ORDER BY time, pool""",
    ),
    Panel(
        "jobs_by_state",
        "Jobs by current state",
        "piechart",
        "Jobs by their own state (SCHEDULED, PAUSED, COMPLETED, DEAD, CANCELLED); the same "
        "numbers as GET /stats/states.",
        STATE_COUNTS_SQL,
    ),
)


def panel(store: StatusStore, key: str, from_ms: int, to_ms: int) -> list[dict[str, Any]]:
    """The rows of the dashboard panel ``key`` over a time range: the console draws the same
    SQL that DASHBOARDS.md documents and Grafana runs."""
    sql = expand_macros(next(p.sql for p in PANELS if p.key == key), from_ms, to_ms)
    return store.dicts(sql)


def worker_activity(store: StatusStore, since_ms: int) -> list[dict[str, Any]]:
    """Workers seen in the status events since ``since_ms``: when last, and what they did."""
    return store.dicts(
        "SELECT worker, max(event_time_ms) AS last_seen_ms, "
        "uniqExactIf(run_id, state = 'STARTED') AS started, "
        "countIf(state = 'SUCCEEDED') AS succeeded, countIf(state = 'FAILED') AS failed, "
        "uniqExactIf(run_id, state IN ('STARTED', 'HEARTBEAT')) - "
        "uniqExactIf(run_id, state IN ('SUCCEEDED', 'FAILED')) AS open_runs "
        "FROM status_events FINAL WHERE source = 'worker' AND worker IS NOT NULL "
        "AND event_time_ms >= {since:Int64} GROUP BY worker ORDER BY last_seen_ms DESC "
        "LIMIT 200",
        {"since": since_ms},
    )


def expand_macros(sql: str, from_ms: int, to_ms: int) -> str:
    """Replace the Grafana macros the panels use with literal times (what Grafana does)."""
    start, end = f"fromUnixTimestamp64Milli({from_ms})", f"fromUnixTimestamp64Milli({to_ms})"
    sql = re.sub(r"\$__timeFilter_ms\(([^)]+)\)", rf"\1 >= {start} AND \1 <= {end}", sql)
    return sql.replace("$__fromTime_ms", start).replace("$__toTime_ms", end)


GRAFANA_DATASOURCE = {"type": "grafana-clickhouse-datasource", "uid": "jobwheel-clickhouse"}
_GRID = {
    "runs_per_minute": (0, 0, 12, 9),
    "lateness": (12, 0, 12, 9),
    "failure_rate": (0, 9, 16, 8),
    "jobs_by_state": (16, 9, 8, 8),
    "stuck_runs": (0, 17, 24, 8),
    "upcoming_fires": (0, 25, 24, 8),
    "runs_by_queue": (0, 33, 24, 8),
}


def grafana_dashboard() -> dict[str, Any]:
    """The provisioned dashboard (deploy/compose/grafana/dashboards/jobwheel.json) built from
    :data:`PANELS`, so Grafana runs exactly the SQL that DASHBOARDS.md documents. Regenerate
    with ``python -m jobwheel.consumers.status.queries >
    deploy/compose/grafana/dashboards/jobwheel.json``.
    """
    panels = []
    for number, panel in enumerate(PANELS, start=1):
        x, y, w, h = _GRID[panel.key]
        timeseries = panel.kind == "timeseries"
        panels.append(
            {
                "id": number,
                "type": panel.kind,
                "title": panel.title,
                "description": panel.description,
                "datasource": GRAFANA_DATASOURCE,
                "gridPos": {"x": x, "y": y, "w": w, "h": h},
                "targets": [
                    {
                        "refId": "A",
                        "datasource": GRAFANA_DATASOURCE,
                        "editorType": "sql",
                        "queryType": "timeseries" if timeseries else "table",
                        "format": 0 if timeseries else 1,  # plugin enum: 0 time series, 1 table
                        "rawSql": panel.sql,
                    }
                ],
                "fieldConfig": {"defaults": {"unit": "ms" if panel.key == "lateness" else ""}},
                "options": {},
            }
        )
    return {
        "uid": "jobwheel-status",
        "title": "jobwheel: jobs and runs",
        "description": "Status events in ClickHouse; the SQL of every panel is in "
        "consumers/status/DASHBOARDS.md.",
        "tags": ["jobwheel"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "panels": panels,
    }


if __name__ == "__main__":
    import json
    import sys

    json.dump(grafana_dashboard(), sys.stdout, indent=2)
    sys.stdout.write("\n")
