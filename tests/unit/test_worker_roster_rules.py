"""The workers topic's records and the rules read from them (pure): when a worker is live, and
what is said about a task the live workers do not all serve."""

from __future__ import annotations

from typing import Any

import pytest

from jobwheel.errors import UnknownTaskWarning, UnservedTaskError
from jobwheel.producers.workers import Roster, TaskCheck
from jobwheel.schemas import workers as roster
from jobwheel.settings import Settings

TOPIC = "jw.workers"


def _worker(worker_id: str, tasks: tuple[str, ...], announced_ms: int = 1_000) -> Any:
    return roster.WorkerRecord(worker_id, "g", tasks, "h", 1, 0, announced_ms, 5_000)


def test_a_record_round_trips_and_a_damaged_one_is_skipped() -> None:
    record = _worker("h:1", ("b", "a"))
    table = {b"h:1": roster.encode(record), b"h:2": b"not json", b"h:3": b'{"v": 1}'}
    assert roster.latest(table) == [roster.decode("h:1", roster.encode(record))]
    assert roster.latest(table)[0].tasks == ("a", "b")  # sorted on reading


def test_live_is_judged_by_the_records_own_interval() -> None:
    record = _worker("h:1", ("a",), announced_ms=10_000)
    assert record.is_live(10_000 + 3 * 5_000)
    assert not record.is_live(10_000 + 3 * 5_000 + 1)


def test_a_typo_names_the_served_tasks_and_the_closest() -> None:
    live = [_worker("h:1", ("demo.echo", "demo.fail"))]
    said = roster.task_problem("demo.ecko", live, TOPIC)
    assert said is not None
    assert "no live worker serves task 'demo.ecko'" in said
    assert "did you mean 'demo.echo'?" in said and "serve demo.echo, demo.fail;" in said
    assert roster.task_problem("demo.echo", live, TOPIC) is None


def test_a_worker_lacking_the_task_is_named() -> None:
    live = [_worker("h:1", ("a", "b")), _worker("h:2", ("a",))]
    said = roster.task_problem("b", live, TOPIC)
    assert said is not None and "1 of 2 live workers lack task 'b' (h:2)" in said


def test_no_live_worker_is_said_once_not_per_task() -> None:
    empty = Roster(TOPIC, (), 0)
    check = TaskCheck(Settings(_env_file=None), read=lambda _s: empty)  # type: ignore[call-arg]
    with pytest.warns(UnknownTaskWarning) as said:
        problems = check.check(["a", "b", "c"])
    assert len(problems) == 1 and len(said) == 1
    assert "no live worker announces itself on jw.workers" in problems[0]
    with pytest.raises(UnservedTaskError, match="nothing was sent"):
        check.check(["a"], mode="refuse")
