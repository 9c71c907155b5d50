# ruff: noqa: E501 - HTML templates: their lines follow the markup, not the column limit
"""The console's pages as HTML: pure functions of the data they show (no I/O here).

Every value from the store or Kafka is escaped; links are built from the request's root path,
so the console also works behind a proxy that serves it under a prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from jobwheel.consumers.status.console import charts
from jobwheel.errors import ValidationError
from jobwheel.schemas import cron, deadletter

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

JOB_STATES = ("SCHEDULED", "PAUSED", "COMPLETED", "DEAD", "CANCELLED")
RANGES = {"15m": 15 * 60_000, "1h": 3_600_000, "6h": 6 * 3_600_000, "24h": 24 * 3_600_000}
#: Which buttons a job in each state gets (what the scheduler accepts; README "Job states").
ACTIONS = {
    "SCHEDULED": ("pause", "trigger", "cancel"),
    "PAUSED": ("resume", "trigger", "cancel"),
    "COMPLETED": ("trigger",),
    "DEAD": ("trigger",),
    "CANCELLED": (),
}


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def job_zone(spec: Mapping[str, Any] | None) -> ZoneInfo | None:
    """The time zone a job's times mean something in: a cron job's own, where its expression
    is read (``0 9 * * *`` in Europe/Berlin fires at 09:00 there, 08:00Z in winter). None for
    UTC, another trigger, or a zone this host's tzdata lacks."""
    trigger = (spec or {}).get("trigger") or {}
    name = trigger.get("timezone") if trigger.get("type") == "Cron" else None
    if not name or name == "UTC":
        return None
    try:
        return cron.zone(str(name))
    except ValidationError:
        return None


def when_in(ms: int | None, tz: ZoneInfo | None) -> str:
    """A time in UTC, the console's one clock, and beside it the wall time in ``tz`` (a cron
    job's zone): a user reading a Berlin job's fires should not have to add the offset."""
    text = when(ms)
    if ms is None or tz is None:
        return text
    local = datetime.fromtimestamp(ms / 1000, tz)
    return f"{text} ({local:%Y-%m-%d %H:%M:%S %Z} {tz.key})"


def ago(ms: int | None, now_ms: int) -> str:
    if ms is None:
        return "-"
    seconds = (now_ms - ms) / 1000
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 90:
        text = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        text = f"{seconds / 60:.0f} min"
    elif seconds < 36 * 3600:
        text = f"{seconds / 3600:.1f} h"
    else:
        text = f"{seconds / 86400:.1f} d"
    return f"in {text}" if future else f"{text} ago"


def millis(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value} ms" if abs(value) < 10_000 else f"{value / 1000:.1f} s"


def duration(ms: Any) -> str:
    """``5400000`` -> ``1h30m``: how a user wrote it (``--every 1h30m``)."""
    if not isinstance(ms, int) or ms <= 0:
        return str(ms)
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def badge(state: str | None) -> str:
    state = state or "-"
    return f'<span class="badge s-{escape(state.lower())}">{escape(state)}</span>'


class Page:
    """Links and the frame of a page, for one request (root path, who is logged in)."""

    def __init__(self, root: str, *, auth: bool, grant: str | None, now_ms: int) -> None:
        self.root = root.rstrip("/")
        self.auth = auth
        self.grant = grant
        self.now_ms = now_ms

    def url(self, path: str, **params: Any) -> str:
        query = {k: v for k, v in params.items() if v not in (None, "")}
        return self.root + path + (f"?{urlencode(query)}" if query else "")

    def job_url(self, job_id: str) -> str:
        return self.url(f"/console/jobs/{quote(job_id, safe='')}")

    def job_link(self, job_id: str) -> str:
        return f'<a href="{escape(self.job_url(job_id))}">{escape(job_id)}</a>'

    def frame(self, title: str, current: str, body: str) -> str:
        nav = [
            ("overview", "/", "Overview"),
            ("jobs", "/console/jobs", "Jobs"),
            ("cluster", "/console/cluster", "Workers & schedulers"),
            ("dead-letters", "/console/dead-letters", "Dead letters"),
        ]
        links = "".join(
            f'<a href="{escape(self.url(path))}"{" aria-current=page" if key == current else ""} '
            f'id="nav-{key}">{label}</a>'
            for key, path, label in nav
        )
        who = ""
        if self.auth:
            who = (
                f'<form method="post" action="{escape(self.url("/console/logout"))}" '
                f'class="logout"><span>{escape(self.grant or "")} token</span> '
                '<button type="submit">Log out</button></form>'
            )
        return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · jobwheel</title>
<link rel="stylesheet" href="{escape(self.url("/console/static/console.css"))}">
<script src="{escape(self.url("/console/static/console.js"))}" defer></script>
</head>
<body data-root="{escape(self.root)}">
<header><a class="brand" href="{escape(self.url("/"))}">jobwheel</a><nav>{links}</nav>
<a class="docs" href="{escape(self.url("/docs"))}">API docs</a>{who}</header>
<main>
<p id="flash" role="status" hidden></p>
{body}
</main>
<footer>Times are UTC. Data: the status store (ClickHouse) and Kafka's group and offset
metadata. Every button sends the API call the CLI sends.</footer>
</body>
</html>
"""


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, empty: str, cls: str = ""
) -> str:
    """A table of cells that are HTML already (callers escape values)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{escape(empty)}</td></tr>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# --- overview -------------------------------------------------------------------------------


def overview(
    page: Page,
    *,
    counts: Mapping[str, int],
    range_key: str,
    start_ms: int,
    end_ms: int,
    runs_per_minute: list[dict[str, Any]],
    lateness: list[dict[str, Any]],
    schedulers: Any,
    workers: Any,
) -> str:
    cards = "".join(
        f'<a class="card s-{state.lower()}" href="{escape(page.url("/console/jobs", state=state))}"'
        f' id="count-{state.lower()}"><span class="n">{counts.get(state, 0)}</span>'
        f'<span class="label">{state}</span></a>'
        for state in JOB_STATES
    )
    ranges = " ".join(
        f'<a href="{escape(page.url("/", range=key))}"'
        f"{' aria-current=true' if key == range_key else ''}>{key}</a>"
        for key in RANGES
    )
    by_state: dict[str, list[tuple[int, float]]] = {}
    for row in runs_per_minute:
        by_state.setdefault(str(row["state"]), []).append((_ms(row["time"]), float(row["events"])))
    bars = charts.stacked_bars(
        by_state,
        start_ms=start_ms,
        end_ms=end_ms,
        bucket_ms=60_000,
        title="Run events per minute by state",
    )
    late: dict[str, list[tuple[int, float]]] = {k: [] for k in ("p50", "p95", "p99", "max")}
    for row in lateness:
        for key in late:
            if row.get(key) is not None:
                late[key].append((_ms(row["time"]), float(row[key])))
    lines = charts.line_chart(
        late,
        start_ms=start_ms,
        end_ms=end_ms,
        title="Fire lateness percentiles per minute",
        unit=" ms",
    )
    total = sum(counts.values())
    cluster = (
        f"<p>{_group_line('Schedulers', schedulers)}<br>{_group_line('Workers', workers)} "
        f'(<a href="{escape(page.url("/console/cluster"))}">details</a>)</p>'
    )
    body = f"""<h1>Overview</h1>
<section><h2>Jobs by state <small>{total} jobs</small></h2><div class="cards">{cards}</div></section>
<section><h2>Runs <small class="ranges">last {ranges}</small></h2>
<div class="charts"><figure id="chart-runs">{bars}<figcaption>Run state changes per minute
(HEARTBEAT left out), the SQL of the dashboard's panel.</figcaption></figure>
<figure id="chart-lateness">{lines}<figcaption>Lateness = first dispatch - scheduled time, per
minute of dispatch.</figcaption></figure></div></section>
<section><h2>Pipeline</h2>{cluster}</section>"""
    return page.frame("Overview", "overview", body)


def _group_line(label: str, group: Any) -> str:
    if group.error:
        return f"{label}: <span class=warn>{escape(group.error)}</span>"
    owned = sum(len(m.partitions) for m in group.members)
    return (
        f"{label}: <b>{len(group.members)}</b> member(s) in group "
        f"<code>{escape(group.name)}</code> ({escape(group.state)}), owning {owned} "
        f"partition(s) of <code>{escape(group.topic)}</code>"
    )


def _ms(value: Any) -> int:
    if isinstance(value, datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(stamp.timestamp() * 1000)
    return int(value)


# --- jobs -----------------------------------------------------------------------------------


def jobs(
    page: Page,
    *,
    jobs: list[dict[str, Any]],
    total: int,
    counts: Mapping[str, int],
    state: str | None,
    task: str | None,
    since: str | None,
    limit: int,
    queue: str | None = None,
    offset: int,
    error: str | None = None,
) -> str:
    tabs = [
        f'<a href="{escape(page.url("/console/jobs", task=task, queue=queue, since=since))}"'
        f"{' aria-current=true' if state is None else ''}>all "
        f"<small>{sum(counts.values())}</small></a>"
    ]
    for s in JOB_STATES:
        tabs.append(
            f'<a href="{escape(page.url("/console/jobs", state=s, task=task, queue=queue, since=since))}" '
            f'id="tab-{s.lower()}"{" aria-current=true" if state == s else ""}>{s} '
            f"<small>{counts.get(s, 0)}</small></a>"
        )
    form = f"""<form class="filters" method="get" action="{escape(page.url("/console/jobs"))}">
<input type="hidden" name="state" value="{escape(state or "")}">
<label>Task <input name="task" value="{escape(task or "")}" placeholder="demo.echo"></label>
<label>Queue <input name="queue" value="{escape(queue or "")}" placeholder="default"></label>
<label>Updated since <input name="since" value="{escape(since or "")}" placeholder="1h, 2026-01-31T12:00Z"></label>
<button type="submit">Filter</button></form>"""
    rows = [
        [
            page.job_link(j["job_id"]),
            badge(j["state"]),
            escape(j.get("task") or "-"),
            escape(j.get("queue") or "-"),
            f'<span title="{escape(when(j.get("next_fire_ms")))}">'
            f"{ago(j.get('next_fire_ms'), page.now_ms)}</span>",
            str(j.get("attempts", 0)),
            f'<span title="{escape(when(j["updated_ms"]))}">{ago(j["updated_ms"], page.now_ms)}</span>',
            escape(_short(j.get("last_error") or j.get("last_reason") or "")),
        ]
        for j in jobs
    ]
    shown = table(
        [
            "job",
            "state",
            "task",
            "queue",
            "next fire",
            "attempts",
            "updated",
            "last error / reason",
        ],  # fmt: skip
        rows,
        empty="no jobs match",
        cls="jobs",
    )
    nav = []
    if offset > 0:
        back = max(0, offset - limit)
        nav.append(
            f'<a href="{escape(page.url("/console/jobs", state=state, task=task, queue=queue, since=since, offset=back))}">'
            "&larr; newer</a>"
        )
    if offset + len(jobs) < total:
        nav.append(
            f'<a href="{escape(page.url("/console/jobs", state=state, task=task, queue=queue, since=since, offset=offset + limit))}">'
            "older &rarr;</a>"
        )
    problem = f'<p class="warn">{escape(error)}</p>' if error else ""
    body = f"""<h1>Jobs</h1><div class="tabs">{"".join(tabs)}</div>{form}{problem}
<p class="count">{len(jobs)} of {total} jobs, most recently updated first (from {offset + 1 if jobs else 0})</p>
{shown}<p class="pager">{" ".join(nav)}</p>"""
    return page.frame("Jobs", "jobs", body)


def _short(text: str, limit: int = 140) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def result_cell(run: Mapping[str, Any]) -> str:
    if run.get("result_json") is not None:
        text = json.dumps(run.get("result"), ensure_ascii=False)
        return f'<code class="result">{escape(_short(text, 300))}</code>'
    if run.get("error"):
        return f'<span class="error">{escape(_short(str(run["error"]), 300))}</span>'
    if run.get("reason"):
        return f'<span class="reason">{escape(_short(str(run["reason"]), 300))}</span>'
    return "-"


def job(
    page: Page,
    *,
    job: dict[str, Any],
    runs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    spec: dict[str, Any] | None,
    next_fires: list[int],
) -> str:
    job_id = job["job_id"]
    buttons = "".join(
        f'<button type="button" class="action" data-command="{kind}" '
        f'data-job="{escape(job_id)}" id="action-{kind}">{kind.capitalize()}</button>'
        for kind in ACTIONS.get(job["state"], ())
    )
    if page.grant == "read":
        buttons = '<span class="muted">read-only token: no commands</span>'
    tz = job_zone(spec)
    facts = [
        ("state", f"{badge(job['state'])} since {escape(when_in(job['state_time_ms'], tz))}"),
        ("task", f"<code>{escape(job.get('task') or '-')}</code>"),
        ("queue", f"<code>{escape(job.get('queue') or '-')}</code>"),
        ("next fire", escape(when_in(job.get("next_fire_ms"), tz))),
        ("created", escape(when_in(job["created_ms"], tz))),
        ("updated", escape(when_in(job["updated_ms"], tz))),
        ("attempts (last run)", str(job.get("attempts", 0))),
    ]
    if job.get("last_error"):
        facts.append(("last error", f'<span class="error">{escape(job["last_error"])}</span>'))
    if job.get("last_reason"):
        facts.append(("last reason", escape(job["last_reason"])))
    if spec:
        facts.append(("trigger", f"<code>{escape(describe_trigger(spec))}</code>"))
        facts.append(
            ("arguments", f"<code>{escape(_short(str(spec.get('args_json')), 500))}</code>")
        )
        if spec.get("max_attempts") is not None:
            facts.append(("max attempts", escape(str(spec["max_attempts"]))))
        for key in ("timeout_ms", "visibility_timeout_ms", "starting_deadline_ms"):
            if spec.get(key) is not None:
                name = key.removesuffix("_ms").replace("_", " ")
                facts.append((name, escape(duration(spec[key]))))
        facts.append(("concurrency policy", escape(str(spec.get("concurrency_policy")))))
    if next_fires:
        facts.append(("next fires", "<br>".join(escape(when_in(t, tz)) for t in next_fires)))
    definition = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in facts)
    run_rows = [
        [
            f'<code id="run-{escape(r["run_id"])}">{escape(r["run_id"])}</code>',
            badge(r["state"]),
            escape(when_in(r.get("scheduled_time_ms"), tz)),
            escape(millis(r.get("lateness_ms"))),
            escape(millis(r.get("duration_ms"))),
            str(r.get("attempts", 0)),
            escape(r.get("worker") or "-"),
            result_cell(r),
        ]
        for r in runs
    ]
    event_rows = [
        [
            escape(when(e["event_time_ms"])),
            badge(e["state"]),
            escape(e.get("source") or ""),
            escape(e.get("run_id") or "") + (f" #{e['attempt']}" if e.get("run_id") else ""),
            escape(e.get("worker") or ""),
            escape(_short(e.get("reason") or e.get("error") or "", 300)),
        ]
        for e in events
    ]
    body = f"""<h1>Job <code>{escape(job_id)}</code> {badge(job["state"])}</h1>
<div class="actions">{buttons}</div>
<section><h2>Definition</h2><dl class="facts">{definition}</dl>
{"" if spec else '<p class="muted">Its trigger and arguments are not in the status store: it was scheduled by a scheduler older than status_event.v3, whose events do not carry them.</p>'}</section>
<section><h2>Runs <small>{len(runs)}</small></h2>
{table(["run", "state", "scheduled", "lateness", "duration", "attempts", "worker", "result or error"], run_rows, empty="no runs yet", cls="runs")}</section>
<section><h2>Events <small>{len(events)}</small></h2>
{table(["time", "state", "by", "run", "worker", "reason / error"], event_rows, empty="no events", cls="events")}</section>"""
    return page.frame(f"Job {job_id}", "jobs", body)


def describe_trigger(spec: Mapping[str, Any]) -> str:
    trigger = spec.get("trigger") or {}
    kind = trigger.get("type")
    if kind == "Cron":
        return f"cron {trigger.get('expression')} ({trigger.get('timezone')})"
    if kind == "Every":
        return f"every {duration(trigger.get('interval_ms'))}"
    if kind == "At":
        return f"at {when(trigger.get('at_ms'))}"
    if kind == "After":
        return f"after {duration(trigger.get('delay_ms'))}"
    return str(kind or "-")


# --- cluster --------------------------------------------------------------------------------


def cluster(
    page: Page,
    *,
    schedulers: Any,
    progress: list[Any],
    progress_error: str | None,
    workers: Any,
    activity: list[dict[str, Any]],
    roster: Any = None,
    roster_error: str | None = None,
    pools: list[Any] | None = None,
) -> str:
    """``roster``: the workers topic as read (:class:`jobwheel.producers.workers.Roster`), or
    ``roster_error`` saying why it could not be; ``pools``: each queue's signals
    (:class:`jobwheel.consumers.status.pools.PoolSignals`)."""
    progress_table = _progress_table(page, progress, progress_error)
    activity_rows = _activity_rows(page, activity)
    tasks_table = _tasks_table(roster, roster_error)
    body = f"""<h1>Workers &amp; schedulers</h1>
<section id="schedulers"><h2>Schedulers</h2>{members(schedulers, "requests")}
<h3>Partitions (progress notes in the group's committed offsets)</h3>{progress_table}</section>
<section id="workers"><h2>Workers</h2>{members(workers, "runs")}
<h3>Pools (queues): what each has not finished</h3>{_pools_table(pools or [])}
<h3>Tasks they serve (their announcements on the workers topic)</h3>{tasks_table}
<h3>Activity in the last hour (status events)</h3>
{table(["worker", "last event", "runs started", "succeeded", "failed", "running"], activity_rows, empty="no worker events in the last hour", cls="activity")}</section>"""
    return page.frame("Workers & schedulers", "cluster", body)


def _pools_table(pools: list[Any]) -> str:
    """Each queue's pool: its workers and the runs it has not finished (to scale it on)."""

    def count(value: int | None) -> str:
        return "?" if value is None else str(value)

    rows = [
        [
            f"<code>{escape(p.queue)}</code>",
            f"<code>{escape(p.group)}</code>",
            f"{p.workers} ({p.concurrency} slots)",
            str(p.inflight),
            count(p.waiting),
            count(p.unfinished),
            "?" if p.oldest_unfinished_age_s is None else f"{p.oldest_unfinished_age_s:.0f} s",
            f"{p.finished_per_s:g}",
            f'<span class="warn">{escape(p.error)}</span>' if p.error else "ok",
        ]
        for p in pools
    ]
    return table(
        ["queue", "group", "live workers", "running", "waiting", "unfinished", "oldest",
         "finished/s", "read"],
        rows,
        empty="no queues declared",
        cls="pools",
    )  # fmt: skip


def members(group: Any, what: str) -> str:
    """A consumer group's members and their partitions of ``what``, or why it was not read."""
    if group.error:
        return (
            f'<p class="warn">cannot describe group {escape(group.name)}: {escape(group.error)}</p>'
        )
    rows = [
        [
            f"<code>{escape(m.client_id)}</code>",
            escape(m.host),
            escape(", ".join(str(p) for p in m.partitions) or "none"),
        ]
        for m in group.members
    ]
    return (
        f"<p>group <code>{escape(group.name)}</code>: {escape(group.state)}, "
        f"{len(group.members)} member(s)</p>"
        + table(
            ["member (client id)", "host", f"{what} partitions"],
            rows,
            empty="no members: is one running?",
            cls="members",
        )
    )


def _progress_table(page: Page, progress: list[Any], progress_error: str | None) -> str:
    """Each requests partition: who committed last, when, its next timer, what is unread."""
    progress_rows = [
        [
            str(p.partition),
            f"<code>{escape(p.owner or '-')}</code>",
            f'<span title="{escape(when(p.committed_at_ms))}">{ago(p.committed_at_ms, page.now_ms)}</span>',
            escape(ago(p.next_due_ms, page.now_ms)),
            str(p.unread),
            f'<span class="warn">stuck: {escape(p.stuck)}</span>' if p.stuck else "ok",
        ]
        for p in progress
    ]
    progress_table = (
        f'<p class="warn">{escape(progress_error)}</p>'
        if progress_error
        else table(
            [
                "partition",
                "last committed by",
                "last commit",
                "next timer",
                "unread input",
                "health",
            ],
            progress_rows,
            empty="no partitions",
            cls="progress",
        )
    )
    return progress_table


def _activity_rows(page: Page, activity: list[dict[str, Any]]) -> list[list[str]]:
    """Each worker's runs in the last hour, from its status events."""
    activity_rows = [
        [
            f"<code>{escape(a['worker'])}</code>",
            f'<span title="{escape(when(a["last_seen_ms"]))}">{ago(a["last_seen_ms"], page.now_ms)}</span>',
            str(a["started"]),
            str(a["succeeded"]),
            str(a["failed"]),
            str(max(0, int(a["open_runs"]))),
        ]
        for a in activity
    ]
    return activity_rows


def _tasks_table(roster: Any, roster_error: str | None) -> str:
    """The workers' announcements: the tasks each serves and whether it is live."""
    if roster_error or roster is None:
        tasks_table = f'<p class="warn">{escape(roster_error or "not read")}</p>'
    else:
        tasks_rows = [
            [
                f"<code>{escape(w.worker_id)}</code>",
                escape(w.group),
                ", ".join(f"<code>{escape(t)}</code>" for t in w.tasks) or "none",
                f'<span title="{escape(when(w.announced_ms))}">'
                f"{ago(w.announced_ms, roster.read_at_ms)}</span>",
                "live"
                if w.is_live(roster.read_at_ms)
                else '<span class="warn">gone (no word for 3 intervals)</span>',
            ]
            for w in roster.workers
        ]
        tasks_table = table(
            ["worker", "group", "tasks it serves", "last announced", "state"],
            tasks_rows,
            empty="no worker has announced itself: is one running?",
            cls="worker-tasks",
        )
    return tasks_table


# --- dead letters ---------------------------------------------------------------------------


def dead_letters(
    page: Page,
    *,
    letters: list[dict[str, Any]],
    since: str,
    kind: str | None,
    task: str | None,
    reason: str | None,
    error: str | None,
) -> str:
    kinds = "".join(
        f'<option value="{k}"{" selected" if k == kind else ""}>{k}</option>'
        for k in ("", *deadletter.KINDS)
    )
    form = f"""<form class="filters" method="get" action="{escape(page.url("/console/dead-letters"))}">
<label>Since <input name="since" value="{escape(since)}"></label>
<label>Kind <select name="kind">{kinds}</select></label>
<label>Task <input name="task" value="{escape(task or "")}"></label>
<label>Error contains <input name="reason" value="{escape(reason or "")}"></label>
<button type="submit">Filter</button></form>"""
    rows = []
    for d in reversed(letters):
        replayable = d["kind"] in ("dead-run", "request") and page.grant != "read"
        button = (
            f'<button type="button" class="replay" data-ref="{escape(d["ref"])}">Replay</button>'
            if replayable
            else "-"
        )
        rows.append(
            [
                escape(when(d["timestamp_ms"])),
                escape(d["kind"]),
                f"<code>{escape(d['ref'])}</code>",
                page.job_link(d["job_id"]) if d["job_id"] else "-",
                escape(d["what"]),
                f'<span class="error">{escape(_short(d["error"], 300))}</span>',
                button,
            ]
        )
    problem = f'<p class="warn">{escape(error)}</p>' if error else ""
    body = f"""<h1>Dead letters</h1>
<p class="muted">Runs that ended DEAD and records the scheduler could not use, from the
dead-letter topic, newest first. <b>Replay</b> after fixing the cause: a dead run is dispatched
again as the same run (its next attempt), a rejected command is sent again only if the
scheduler would accept it now (<code>jobwheel dlq replay --help</code> says more).</p>
{form}{problem}
{table(["dead-lettered", "kind", "ref", "job", "what", "error", ""], rows, empty="no dead letters match", cls="dead-letters")}"""
    return page.frame("Dead letters", "dead-letters", body)


# --- login ----------------------------------------------------------------------------------


def login(page: Page, *, next_path: str, message: str | None, enabled: bool) -> str:
    if not enabled:
        body = (
            "<h1>No login needed</h1><p>This API has no token set (JOBWHEEL_API_TOKEN): the "
            f'console is open. <a href="{escape(page.url("/"))}">Go to the console</a>.</p>'
        )
        return page.frame("Log in", "", body)
    warn = f'<p class="warn" id="login-error">{escape(message)}</p>' if message else ""
    body = f"""<h1>Log in</h1>{warn}
<form method="post" action="{escape(page.url("/console/login"))}" class="login">
<input type="hidden" name="next" value="{escape(next_path)}">
<label>API token <input type="password" name="token" id="token" autocomplete="current-password"
required autofocus></label>
<button type="submit" id="login">Log in</button></form>
<p class="muted">The token of this API (<code>JOBWHEEL_API_TOKEN</code>, or the read-only
<code>JOBWHEEL_API_READ_TOKEN</code>). It is checked once; the browser then keeps a signed
session cookie (HttpOnly, SameSite=Strict, 12 hours), never the token itself.</p>"""
    return page.frame("Log in", "", body)


def not_found(page: Page, what: str) -> str:
    return page.frame("Not found", "", f"<h1>Not found</h1><p>{escape(what)}</p>")
