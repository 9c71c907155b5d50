"""The status sink on the real broker and the embedded engine.

Status events are produced with the codec straight to the status topic (the scheduler and the
workers are not needed to test what the sink makes of them): out of order, duplicated, mixed
with garbage. The crash test SIGKILLs a `jobwheel sink` process mid-stream and restarts the
store's owner as `jobwheel serve`, then counts through the API.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwheel.consumers.status import queries
from jobwheel.consumers.status.metrics import SinkCollector
from jobwheel.consumers.status.sink import StatusSink
from jobwheel.consumers.status.store import StatusStore
from jobwheel.deploy.broker import free_port
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.settings import Settings
from tests.stack_support import wait_for_api
from tests.status_support import committed, committed_offsets, event, lifecycle, now_ms, produce
from tests.support import (
    Procs,
    Tail,
    log_tail,
    metric,
    scaled,
    stop,
    wait_until,
)


@pytest.fixture
def running_sink(settings: Settings, store: StatusStore) -> Iterator[StatusSink]:
    sink = StatusSink(settings, store, batch_size=500, batch_ms=100)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    yield sink
    sink.stop()
    thread.join(30)
    assert not thread.is_alive()


def test_events_in_right_state_out_despite_order_duplicates_and_garbage(
    settings: Settings, store: StatusStore, running_sink: StatusSink
) -> None:
    t0 = now_ms()
    events: list[StatusEvent] = []
    for i in range(20):
        events += lifecycle(f"job-{i}", t0 + i)
    # job-x: a retry where the late worker answer for attempt 1 must not win
    events += [
        event("job-x", State.SCHEDULED, seq=0, t=t0 - 1, task="t"),
        event("job-x", State.DISPATCHED, seq=1, t=t0, run_id="job-x@1", attempt=1, task="t"),
        event("job-x", State.DISPATCHED, seq=2, t=t0 + 30_000, run_id="job-x@1", attempt=2),
        event("job-x", State.SUCCEEDED, seq=1, t=t0 + 40_000, run_id="job-x@1", attempt=1),
    ]
    stream: list[StatusEvent | bytes] = list(events) + random.Random(3).sample(events, 40)
    random.Random(5).shuffle(stream)
    stream.insert(17, b"\x00\x01not avro at all")
    stream.insert(60, b"")
    produce(settings, stream)

    wait_until(
        lambda: running_sink.stats.consumed >= len(stream) and running_sink.stats.batches > 0,
        30,
        message=f"sink consumed {running_sink.stats.consumed} of {len(stream)}",
    )
    wait_until(lambda: committed(settings) == len(stream), 15, message="offsets not committed")

    assert running_sink.stats.undecodable == 2
    assert running_sink.stats.inserted == len(stream) - 2
    (n,) = store.query("SELECT count() FROM status_events FINAL")[2][0]
    assert n == len(events)
    states = queries.state_counts(store)
    assert states == {"COMPLETED": 20, "SCHEDULED": 1}  # job-x's run is out: a run state
    job = queries.get_job(store, "job-7")
    assert job is not None and job["state"] == "COMPLETED" and job["attempts"] == 1
    (run,) = queries.job_runs(store, "job-7")
    assert (run["state"], run["lateness_ms"], run["worker"]) == ("SUCCEEDED", 7, "w:1")
    (run_x,) = queries.job_runs(store, "job-x")
    assert (run_x["state"], run_x["attempts"]) == ("DISPATCHED", 2)


def test_a_replayed_stream_changes_nothing(
    settings: Settings, store: StatusStore, running_sink: StatusSink
) -> None:
    """The same records read again (a new consumer group from the beginning, as after a lost
    commit) neither double the counts nor move any state. Merges are stopped, so the copies
    really are stored twice and it is FINAL and the idempotent aggregates that hide them."""
    store.client.command("SYSTEM STOP MERGES status_events")
    events = [e for i in range(10) for e in lifecycle(f"r-{i}", now_ms())]
    produce(settings, events)
    wait_until(lambda: running_sink.stats.inserted >= len(events), 30, message="first pass")
    before = store.dicts("SELECT * FROM jobs ORDER BY job_id")
    assert len(before) == 10

    replay = StatusSink(
        settings.model_copy(update={"status_group": settings.status_group + "-replay"}),
        store,
        batch_size=7,  # other batch boundaries than the first pass: the token does not help
        batch_ms=50,
    )
    thread = threading.Thread(target=replay.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: replay.stats.inserted >= len(events), 30, message="replay")
    finally:
        replay.stop()
        thread.join(30)
    (raw,) = store.query("SELECT count() FROM status_events")[2][0]
    (final,) = store.query("SELECT count() FROM status_events FINAL")[2][0]
    assert final == len(events)
    assert raw > final, "no copy was stored: the replay tested nothing"
    assert store.dicts("SELECT * FROM jobs ORDER BY job_id") == before
    assert queries.state_counts(store) == {"COMPLETED": 10}


# --- crash ----------------------------------------------------------------------------------


def _api_sql(settings: Settings, sql: str) -> list[list[Any]]:
    request = urllib.request.Request(
        f"{settings.status_api_url}/sql",
        data=json.dumps({"sql": sql}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())["rows"]


def test_sink_sigkilled_mid_stream_loses_and_doubles_nothing(
    settings: Settings, jobwheel_env: dict[str, str], procs: Procs, tmp_path: Path, figure: Any
) -> None:
    """Killed mid-stream, the sink loses nothing, and the one that takes over inserts exactly
    the records that were not committed at the kill, counted by its own metrics: reading the
    table cannot show a double (FINAL hides a second row with the same event id, and so do the
    table's background merges), the inserting side can. The copies of rows inserted but not
    committed before the kill are what the event-id deduplication absorbs for readers."""
    env = {**jobwheel_env, "JOBWHEEL_STATUS_BATCH_SIZE": "100", "JOBWHEEL_STATUS_BATCH_MS": "20"}
    t0 = now_ms()
    first = [e for i in range(1500) for e in lifecycle(f"k-{i}", t0 + i)]  # 9000
    second = [e for i in range(1500, 1800) for e in lifecycle(f"k-{i}", t0 + i)]  # 1800
    produce(settings, first)

    log = tmp_path / "sink.log"
    sink = procs.spawn(["jobwheel", "sink"], env, log)
    wait_until(
        lambda: committed(settings) >= 400 or sink.poll() is not None,
        60,
        interval_s=0.02,
        message="the sink committed nothing:\n" + log_tail(log),
    )
    assert sink.poll() is None, log_tail(log)
    stop(sink, 9)  # SIGKILL: no flush, no commit, no leaving the group
    at_kill = committed_offsets(settings)
    done_at_kill = sum(at_kill.values())
    assert done_at_kill < len(first), "the kill came too late to be mid-stream"

    produce(settings, second)
    ends = Tail(settings, [settings.topics.status, settings.topics.acks])
    try:
        uncommitted = sum(ends.end_offsets().values()) - done_at_kill
    finally:
        ends.close()
    metrics_port = free_port()
    serve = procs.spawn(
        ["jobwheel", "serve"],
        {**env, "JOBWHEEL_METRICS_PORT": str(metrics_port)},
        tmp_path / "serve.log",
    )
    wait_for_api(settings.status_api_url, tmp_path / "serve.log", 60)
    total = len(first) + len(second)
    wait_until(
        lambda: _api_sql(settings, "SELECT count() FROM status_events FINAL") == [[total]],
        90,
        interval_s=0.5,
        message=f"not all {total} events arrived:\n" + log_tail(tmp_path / "serve.log"),
    )
    ids: set[str] = set()
    for offset in range(0, total, 5000):  # the API caps a result at 10 000 rows
        ids |= {
            r[0]
            for r in _api_sql(
                settings,
                "SELECT event_id FROM status_events FINAL ORDER BY event_id "
                f"LIMIT 5000 OFFSET {offset}",
            )
        }
    assert ids == {e.event_id for e in first + second}
    # The second sink read and inserted exactly what was not committed at the kill: one row
    # per record, none of the records the first one had committed.
    base = f"http://127.0.0.1:{metrics_port}"
    wait_until(
        lambda: metric(base, "jobwheel_sink_records_total") >= uncommitted,
        30,
        message="the second sink did not read every uncommitted record",
    )
    wait_until(
        lambda: (
            metric(base, "jobwheel_sink_rows_total") == metric(base, "jobwheel_sink_records_total")
        ),
        30,
        message="the second sink did not insert what it read",
    )
    assert metric(base, "jobwheel_sink_records_total") == uncommitted
    assert metric(base, "jobwheel_sink_rows_total") == uncommitted
    wait_until(lambda: committed(settings) == done_at_kill + uncommitted, 30)
    figure(
        f"sink SIGKILL: {done_at_kill} of {len(first)} records committed at the kill; the next "
        f"sink read and inserted {uncommitted}: the rest and the {len(second)} sent later"
    )
    assert _api_sql(settings, "SELECT state, count() FROM jobs GROUP BY state") == [
        ["COMPLETED", 1800]
    ]
    assert _api_sql(
        settings,
        "SELECT count(), countIf(state = 'SUCCEEDED'), countIf(attempts = 1) FROM runs",
    ) == [[1800, 1800, 1800]]
    stop(serve)


def test_offsets_are_committed_only_after_a_successful_insert(
    settings: Settings, store: StatusStore, running_sink: StatusSink
) -> None:
    """While the table cannot be written the sink retries and commits nothing; once it can,
    everything read meanwhile arrives, once."""
    first = [e for i in range(3) for e in lifecycle(f"o-{i}", now_ms())]
    produce(settings, first)
    wait_until(lambda: committed(settings) == len(first), 30, message="first batch")

    store.client.command("DETACH TABLE status_events")  # inserts now fail
    try:
        later = [e for i in range(3, 8) for e in lifecycle(f"o-{i}", now_ms())]
        produce(settings, later)
        wait_until(lambda: running_sink.stats.insert_failures >= 2, 30, message="no failures")
        assert committed(settings) == len(first)
    finally:
        store.client.command("ATTACH TABLE status_events")
    wait_until(lambda: committed(settings) == len(first) + len(later), 30, message="not committed")
    (n,) = store.query("SELECT count() FROM status_events FINAL")[2][0]
    assert n == len(first) + len(later)
    assert queries.state_counts(store) == {"COMPLETED": 8}


def test_a_forged_event_with_an_absurd_seq_cannot_rewrite_the_job_view(
    settings: Settings, store: StatusStore, running_sink: StatusSink
) -> None:
    """A scheduler CANCELLED with ``seq`` 2^62, written to the status topic by anyone (no
    ACLs), would be the job's latest event for good: the job view would say CANCELLED while
    its run succeeds. The sink refuses it and counts it; a legitimate jump (a job recreated for
    a replay continues its ``seq`` from the command's issue time) still goes in."""
    t0 = now_ms()
    forged = event("victim", State.CANCELLED, seq=2**62, t=t0 + 5, event_id="forged")
    recreated = event(
        "recreated", State.DISPATCHED, seq=t0, t=t0, run_id="recreated@1", attempt=2, task="t"
    )
    life = lifecycle("victim", t0)
    stream = [life[0], forged, *life[1:], *lifecycle("recreated", t0)[:1], recreated]
    produce(settings, stream)
    wait_until(lambda: committed(settings) == len(stream), 30, message="not committed")

    job = queries.get_job(store, "victim")
    assert job is not None and job["state"] == "COMPLETED", job
    rows = store.query("SELECT event_id, seq FROM status_events FINAL WHERE job_id = 'victim'")
    assert "forged" not in {r[0] for r in rows[2]}
    assert running_sink.stats.seq_refused == 1
    assert running_sink.stats.undecodable == 0
    metrics = {m.name: m for m in SinkCollector(running_sink).collect()}
    assert metrics["jobwheel_sink_seq_refused"].samples[0].value == 1
    (run,) = queries.job_runs(store, "recreated")
    assert run["state"] == "DISPATCHED" and run["attempts"] == 2


def test_a_busy_sink_inserts_less_often_and_a_light_one_at_batch_ms(
    settings: Settings, store: StatusStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch still smaller than ``status_busy_rows`` when it is ``batch_ms`` old is
    inserted then; one that is larger waits for ``status_busy_batch_ms``, taking in what comes
    meanwhile, because each embedded insert costs about 40 ms of CPU however few its rows.
    Either way every event is stored once."""
    insert = store.insert_events
    calls: list[int] = []

    def counted(rows: Any, **kwargs: Any) -> int:
        calls.append(len(rows))
        return insert(rows, **kwargs)

    monkeypatch.setattr(store, "insert_events", counted)
    batch_ms = int(scaled(1) * 1000)  # long enough for a burst to be read whole
    busy = settings.model_copy(
        update={"status_busy_rows": 40, "status_busy_batch_ms": int(scaled(60) * 1000)}
    )
    sink = StatusSink(busy, store, batch_size=10_000, batch_ms=batch_ms)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        light = [e for i in range(2) for e in lifecycle(f"light-{i}", now_ms())]  # 12 rows
        produce(busy, light)
        wait_until(
            lambda: committed(busy) == len(light), 30, message="a light batch was not inserted"
        )
        light_inserts = len(calls)
        first = [e for i in range(20) for e in lifecycle(f"busy-{i}", now_ms())]  # 120 rows
        produce(busy, first)
        read = len(light) + len(first)
        wait_until(lambda: sink.stats.consumed >= read, 30, message="the sink stopped reading")
        time.sleep(2 * batch_ms / 1000)  # a light batch would have been inserted by now
        later = [e for i in range(3) for e in lifecycle(f"later-{i}", now_ms())]
        produce(busy, later)
        read += len(later)
        wait_until(lambda: sink.stats.consumed >= read, 30, message="the sink stopped reading")
    finally:
        sink.stop()  # its last batch is inserted as it stops: the end this test reads to
        thread.join(30)
    assert not thread.is_alive()
    assert all(n < 40 for n in calls[:light_inserts]), calls
    assert len(calls) == light_inserts + 1, calls  # everything read since the light ones: one
    assert calls[-1] >= 40
    (n,) = store.query("SELECT count() FROM status_events FINAL")[2][0]
    assert n == sum(calls)
    assert committed(settings) == read


def test_a_slow_insert_lets_the_next_batch_grow_instead_of_stalling_the_consumer(
    settings: Settings, store: StatusStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events that arrive while an insert is running go into one batch, inserted when that
    insert returns, not into a batch per ``batch_ms`` queued behind it: under load the
    batches grow to the insert time (an embedded insert costs much less per row in big
    batches), and everything still arrives once."""
    insert = store.insert_events
    release = threading.Event()
    calls: list[int] = []

    def slow_first_insert(rows: Any, **kwargs: Any) -> int:
        calls.append(len(rows))
        if len(calls) == 1:
            release.wait(30)  # the first insert runs until the test has produced the rest
        return insert(rows, **kwargs)

    monkeypatch.setattr(store, "insert_events", slow_first_insert)
    sink = StatusSink(settings, store, batch_size=10_000, batch_ms=50)
    thread = threading.Thread(target=sink.run, daemon=True)
    thread.start()
    try:
        first = lifecycle("grow-0", now_ms())
        produce(settings, first)
        wait_until(lambda: len(calls) == 1, 30, message="the first insert never started")
        later: list[StatusEvent] = []
        for burst in range(1, 6):  # five bursts, each well past batch_ms after the last
            events = [e for i in range(3) for e in lifecycle(f"grow-{burst}-{i}", now_ms())]
            produce(settings, events)
            later += events
            read = len(first) + len(later)
            wait_until(
                lambda read=read: sink.stats.consumed >= read,
                30,
                message="the sink stopped reading while an insert was running",
            )
        release.set()
        wait_until(lambda: committed(settings) == len(first) + len(later), 30, message="commit")
    finally:
        release.set()
        sink.stop()
        thread.join(30)
    assert calls == [len(first), len(later)]  # one batch for everything read meanwhile
    (n,) = store.query("SELECT count() FROM status_events FINAL")[2][0]
    assert n == len(first) + len(later)
