"""Who runs the pipeline right now, as Kafka sees it: the console's workers and schedulers page.

Schedulers and workers are consumer groups (``JOBWHEEL_SCHEDULER_APP_ID`` on the requests
topic, ``JOBWHEEL_WORKER_GROUP`` on the runs topic): the group coordinator knows each member,
its host and the partitions it owns. Each scheduler commit also leaves a progress note in the
group's committed offsets (``schemas/progress.py``: commit time, next due timer, instance), so
per partition we can show when its owner last committed, what it waits for, how much input is
unread, and whether it looks stuck by the rule ``jobwheel health`` uses.

Reads only (describe groups, list committed and end offsets); each call is bounded by a
timeout and an error is returned as text on the page instead of failing it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jobwheel.schemas import progress

if TYPE_CHECKING:
    from jobwheel.settings import Settings


@dataclass
class Member:
    client_id: str
    host: str
    member_id: str
    partitions: list[int]


@dataclass
class Group:
    name: str
    topic: str
    state: str = "unknown"
    members: list[Member] = field(default_factory=list)
    error: str | None = None


@dataclass
class PartitionProgress:
    partition: int
    owner: str | None
    committed_at_ms: int | None
    next_due_ms: int | None
    unread: int
    stuck: str | None


_PACKAGE = "jobwheel.consumers.status.cluster"


def describe_group(settings: Settings, group: str, topic: str, timeout_s: float = 5.0) -> Group:
    """The group's members and the partitions of ``topic`` each owns (an error as text)."""
    from jobwheel.kafka import admin
    from jobwheel.kafka.errors import error_text

    out = Group(group, topic)
    out.error = _unreachable(settings)
    if out.error:
        return out
    try:
        out.state, members = admin.describe_group(settings, group, timeout_s, _PACKAGE)
    except Exception as exc:
        out.error = error_text(exc)
        return out
    for m in members:
        parts = sorted(p for t, p in m.assigned if t == topic)
        out.members.append(Member(m.client_id, m.host, m.member_id, parts))
    out.members.sort(key=lambda m: (m.partitions[:1] or [1 << 30], m.client_id))
    return out


def scheduler_progress(
    settings: Settings, timeout_s: float = 5.0
) -> tuple[list[PartitionProgress], str | None]:
    """Per partition: the scheduler's last progress note and unread input (requests + acks)."""
    from jobwheel.kafka import admin
    from jobwheel.kafka.errors import error_text

    down = _unreachable(settings)
    if down:
        return [], down
    try:
        found = admin.scheduler_progress(settings, timeout_s, _PACKAGE)
    except Exception as exc:
        return [], error_text(exc)
    now = time.time_ns() // 1_000_000
    out = []
    for p, found_p in sorted(found.items()):
        latest = found_p.note
        out.append(
            PartitionProgress(
                partition=p,
                owner=latest.owner if latest else None,
                committed_at_ms=latest.committed_at_ms if latest else None,
                next_due_ms=latest.next_due_ms if latest else None,
                unread=found_p.unread,
                stuck=progress.stuck_reason(
                    latest,
                    now,
                    found_p.unread,
                    stuck_after_ms=settings.health_stuck_after_ms,
                    waiting_since_ms=found_p.waiting_since_ms,
                ),
            )
        )
    return out, None


def _unreachable(settings: Settings) -> str | None:
    """A quick TCP probe first: with Kafka down a page says so at once instead of waiting out
    the admin client's timeouts."""
    from jobwheel.reach import unreachable

    why = unreachable(settings.bootstrap_servers, 0.5)
    return None if why is None else f"cannot reach Kafka at {settings.bootstrap_servers}: {why}"
