"""What a scheduler writes beside each committed offset, and when a partition counts as stuck.

Every scheduler transaction commits the consumed offsets of the partitions the scheduler owns
(requests and acks) with a small JSON document as the offset's metadata: when it committed, when
the partition's next timer is due, and which instance committed. Anyone who can read the
scheduler group's offsets (``jobwheel health``, an operator's script, another language) can then
tell a partition that is idle from one that is stuck, without asking the scheduler process::

    {"v": 1, "t": <commit time, epoch ms>, "n": <next due timer, epoch ms, or null>,
     "o": "<instance id>"}

A partition is stuck when its last commit is older than :data:`STUCK_AFTER_MS` while it has
work waiting that long: input whose oldest unread record has been on the topic that long (its
broker timestamp), or a timer that has been due that long.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

VERSION = 1
STUCK_AFTER_MS = 30_000


@dataclass(frozen=True, slots=True)
class Progress:
    committed_at_ms: int
    next_due_ms: int | None
    owner: str

    def encode(self) -> str:
        return json.dumps(
            {"v": VERSION, "t": self.committed_at_ms, "n": self.next_due_ms, "o": self.owner},
            separators=(",", ":"),
        )


def decode(metadata: str | None) -> Progress | None:
    """The progress in an offset's metadata, or None if it holds none (another writer)."""
    if not metadata:
        return None
    try:
        raw = json.loads(metadata)
        if raw.get("v") != VERSION:
            return None
        due = raw.get("n")
        return Progress(int(raw["t"]), None if due is None else int(due), str(raw.get("o", "")))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def stuck_reason(
    progress: Progress | None,
    now_ms: int,
    unread: int,
    *,
    stuck_after_ms: int = STUCK_AFTER_MS,
    waiting_since_ms: int | None = None,
) -> str | None:
    """Why the partition is stuck, or None when it is fine (idle counts as fine).

    ``waiting_since_ms`` is the broker timestamp of the oldest unread input record. Input is
    stuck once that record has waited ``stuck_after_ms`` and nothing was committed for as long:
    a partition no scheduler has committed yet is not stuck the moment its first record arrives
    (a scheduler that just started claims it within seconds), nor is one idle for an hour the
    moment a record comes. Unknown (None), the input is taken to wait since the last commit;
    with no commit either there is nothing to time it from, and no guess is reported."""
    silent = None if progress is None else now_ms - progress.committed_at_ms
    if unread > 0:
        if waiting_since_ms is None:
            waiting = f"{unread} unread input records"
            waited = silent
        else:
            waited = now_ms - waiting_since_ms
            waiting = f"{unread} unread input records, the oldest waiting {waited // 1000} s,"
        if waited is not None and waited >= stuck_after_ms:
            if silent is None:
                return f"{waiting} and no commit recorded yet"
            if silent >= stuck_after_ms:
                return f"{waiting} and no commit for {silent // 1000} s"
    if progress is None or silent is None or silent < stuck_after_ms:
        return None
    if progress.next_due_ms is not None and now_ms - progress.next_due_ms >= stuck_after_ms:
        late = (now_ms - progress.next_due_ms) // 1000
        return f"a timer due {late} s ago and no commit for {silent // 1000} s"
    return None
