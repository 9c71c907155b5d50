"""Which tasks the live workers serve: the records of the compacted ``<prefix>.workers`` topic
and the rules read from them.

Nothing else in Kafka says which task names a worker registers: a run of a name no worker has
(a typo, a worker started with other ``--tasks``) is FAILED by the worker that gets it, without
retry, and ends DEAD a moment after ``submit`` exited 0. So each worker announces itself on
this topic, keyed by its worker id: one record when it starts and again every
``JOBWHEEL_WORKER_ANNOUNCE_INTERVAL_MS``, and a tombstone (a null value) when it exits cleanly.
The topic is compacted, so a reader that reads it from the beginning to its end holds each
worker's latest record; a worker killed without its tombstone is told apart by the age of its
last record (:func:`live`), which the record's own announce interval bounds, so readers need no
setting of their own.

A record is JSON (``{"v": 1, ...}``), not Avro: it is read by people (``kafka-console-consumer``)
as much as by jobwheel, it is small and rare (one per worker every few seconds), and a reader
ignores keys it does not know, so fields can be added without a schema version. Pure: no Kafka,
time passed in.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: A worker whose last record is older than this many of its announce intervals is not live
#: (missed two announcements: killed, stopped, or cut off from the broker).
LIVE_INTERVALS = 3
#: The record format this module writes; readers take any version and the keys they know.
VERSION = 1


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker as it announced itself: what it serves, where it runs, when it said so."""

    worker_id: str
    group: str
    tasks: tuple[str, ...]
    host: str
    pid: int
    started_ms: int
    announced_ms: int
    #: How often the worker announces itself: readers judge its record's age by it.
    interval_ms: int
    #: Load at ``announced_ms`` (absent from records of older workers: read as 0): runs
    #: executing, runs that may execute at once, and runs finished per second over the last
    #: interval. Summed over a pool's live workers they are its scaling signals
    #: (consumers/status/pools.py), which the group's offsets alone cannot give.
    inflight: int = 0
    concurrency: int = 0
    finished_per_s: float = 0.0

    def age_ms(self, now_ms: int) -> int:
        return max(0, now_ms - self.announced_ms)

    def is_live(self, now_ms: int) -> bool:
        return self.age_ms(now_ms) <= LIVE_INTERVALS * self.interval_ms

    def as_dict(self) -> dict[str, object]:
        return {
            "worker_id": self.worker_id,
            "group": self.group,
            "tasks": list(self.tasks),
            "host": self.host,
            "pid": self.pid,
            "started_ms": self.started_ms,
            "announced_ms": self.announced_ms,
            "interval_ms": self.interval_ms,
            "inflight": self.inflight,
            "concurrency": self.concurrency,
            "finished_per_s": self.finished_per_s,
        }


def encode(record: WorkerRecord) -> bytes:
    return json.dumps({"v": VERSION, **record.as_dict()}, separators=(",", ":")).encode()


def decode(worker_id: str, value: bytes) -> WorkerRecord | None:
    """The record of ``value``, or None when it is not one (damaged, hand-written): such a
    record says nothing about any worker, so readers skip it rather than fail."""
    try:
        body = json.loads(value)
        return WorkerRecord(
            worker_id=worker_id,
            group=str(body["group"]),
            tasks=tuple(sorted(str(t) for t in body["tasks"])),
            host=str(body.get("host", "")),
            pid=int(body.get("pid", 0)),
            started_ms=int(body["started_ms"]),
            announced_ms=int(body["announced_ms"]),
            interval_ms=max(1, int(body["interval_ms"])),
            inflight=max(0, int(body.get("inflight", 0))),
            concurrency=max(0, int(body.get("concurrency", 0))),
            finished_per_s=_rate(body.get("finished_per_s", 0.0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _rate(value: object) -> float:
    """A rate as announced; a negative or non-finite one (JSON admits NaN) reads as 0."""
    rate = float(value)  # type: ignore[arg-type]
    return rate if math.isfinite(rate) and rate > 0 else 0.0


def latest(records: Mapping[bytes, bytes]) -> list[WorkerRecord]:
    """The workers of a compacted read (key -> latest non-null value), sorted by id."""
    out = []
    for key, value in records.items():
        try:
            worker_id = key.decode()
        except UnicodeDecodeError:
            continue
        found = decode(worker_id, value)
        if found is not None:
            out.append(found)
    return sorted(out, key=lambda r: r.worker_id)


def live(records: Iterable[WorkerRecord], now_ms: int) -> list[WorkerRecord]:
    return [r for r in records if r.is_live(now_ms)]


def served(workers: Iterable[WorkerRecord]) -> list[str]:
    """Every task name some of ``workers`` serve, sorted."""
    return sorted({t for w in workers for t in w.tasks})


def did_you_mean(task: str, names: Sequence[str]) -> str | None:
    """The served name closest to ``task`` when one is close (a typo), else None."""
    close = difflib.get_close_matches(task, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _listed(names: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def no_live_worker(topic: str) -> str:
    """What is said when no worker is live: not an unknown task (the runs wait on the runs
    topic for a worker, within the scheduler's acks silence), and the same for every task
    (said once)."""
    return (
        f"no live worker announces itself on {topic} (none started, or none announced "
        "within its last intervals): the runs wait on the runs topic for one (a run none "
        "answers within the scheduler's JOBWHEEL_SCHEDULER_ACKS_SILENCE_MS is tried again, up "
        "to its attempts); start one with `jobwheel worker --tasks MODULE`"
    )


def task_problem(task: str, live_workers: Sequence[WorkerRecord], topic: str) -> str | None:
    """What is wrong with sending a run of ``task`` to the live workers, in one sentence, or
    None when every live worker serves it.

    Every live worker must serve it, not just one: the runs topic's partitions are spread over
    a group's workers, and a worker that lacks the task fails its share of the runs without
    retrying (DEAD). With no live worker at all: :func:`no_live_worker`."""
    if not live_workers:
        return no_live_worker(topic)
    lacking = [w for w in live_workers if task not in w.tasks]
    if not lacking:
        return None
    names = served(live_workers)
    if len(lacking) == len(live_workers):
        guess = did_you_mean(task, names)
        hint = f"did you mean {guess!r}? " if guess else ""
        return (
            f"no live worker serves task {task!r}: {hint}the {len(live_workers)} live "
            f"worker(s) serve {_listed(names)}; a worker that gets its run fails it without "
            "retrying, so the run ends DEAD. Check the name, or start a worker whose --tasks "
            "modules register it"
        )
    ids = _listed([w.worker_id for w in lacking], 5)
    return (
        f"{len(lacking)} of {len(live_workers)} live workers lack task {task!r} ({ids}): "
        "the runs that reach them end DEAD without retrying; start every worker of a group "
        "with the same --tasks modules"
    )
