"""What a scheduler writes beside each committed offset, and when a partition counts as stuck.

Every scheduler transaction commits the consumed offsets of the partitions the scheduler owns
(requests and acks) with a small JSON document as the offset's metadata: when it committed, when
the partition's next timer is due, and which instance committed. Anyone who can read the
scheduler group's offsets (``jobwheel health``, an operator's script, another language) can then
tell a partition that is idle from one that is stuck, without asking the scheduler process::

    {"v": 1, "t": <commit time, epoch ms>, "n": <next due timer, epoch ms, or null>,
     "o": "<instance id>"}

A partition is stuck when its last commit is older than :data:`STUCK_AFTER_MS` while it has
work waiting: unread input, or a timer that has been due for that long.
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
) -> str | None:
    """Why the partition is stuck, or None when it is fine (idle counts as fine)."""
    if progress is None:
        return "no commit recorded yet" if unread > 0 else None
    silent = now_ms - progress.committed_at_ms
    if silent < stuck_after_ms:
        return None
    if unread > 0:
        return f"{unread} unread input records and no commit for {silent // 1000} s"
    if progress.next_due_ms is not None and now_ms - progress.next_due_ms >= stuck_after_ms:
        late = (now_ms - progress.next_due_ms) // 1000
        return f"a timer due {late} s ago and no commit for {silent // 1000} s"
    return None
