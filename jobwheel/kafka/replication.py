"""The replication state of jobwheel's topics: each partition's leader, replicas and in-sync
replicas (ISR), for ``jobwheel health`` and as metrics.

Why it is watched: with ``acks=all`` and ``min.insync.replicas=2`` a record is acknowledged
only once two replicas hold it. A partition whose ISR has shrunk below its replicas
(under-replicated) still takes writes but is one broker away from refusing them; one without a
leader (offline) takes none, so its jobs neither fire nor finish until a replica returns. Both
are invisible to jobwheel's own processes, which just wait, so an operator needs to see them.

The state comes from a metadata request (``list_topics``), not ``describe_topics``: librdkafka
sends the latter to the broker it takes for the controller, and a long-lived client keeps
asking a dead one (timeouts for minutes after a broker is killed), while any live broker
answers metadata.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric

from jobwheel.metrics import Collector, gauge
from jobwheel.schemas.topics import queue_of_topic
from jobwheel.settings import Settings

#: Partitions named in a one-line health detail at most (the rest are counted).
SHOWN = 6


@dataclass(frozen=True, slots=True)
class PartitionReplicas:
    topic: str
    partition: int
    #: -1: no leader (offline).
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def offline(self) -> bool:
        return self.leader < 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    def describe(self) -> str:
        leader = "none" if self.offline else str(self.leader)
        return (
            f"{self.topic}[{self.partition}] leader {leader}, ISR {list(self.isr)} of "
            f"replicas {list(self.replicas)}"
        )


@dataclass(frozen=True)
class ReplicationReport:
    """The partitions of the topics asked about, as one metadata answer showed them."""

    brokers: frozenset[int]
    partitions: tuple[PartitionReplicas, ...]
    #: Topics asked about that the metadata lacks (not created, or deleted).
    missing: tuple[str, ...] = ()

    @property
    def under_replicated(self) -> list[PartitionReplicas]:
        return [p for p in self.partitions if p.under_replicated and not p.offline]

    @property
    def offline(self) -> list[PartitionReplicas]:
        return [p for p in self.partitions if p.offline]

    @property
    def ok(self) -> bool:
        return not self.offline and not self.under_replicated and not self.missing

    def detail(self) -> str:
        """One line for ``jobwheel health``: what is wrong, else what was checked."""
        topics = len({p.topic for p in self.partitions})
        head = (
            f"{len(self.partitions)} partitions of {topics} topics on {len(self.brokers)} broker(s)"
        )
        if self.ok:
            factors = sorted({len(p.replicas) for p in self.partitions})
            shown = "/".join(map(str, factors)) or "-"
            return f"{head}: every one led and in full ISR (replicas: {shown})"
        parts = []
        for what, found in (("offline", self.offline), ("under-replicated", self.under_replicated)):
            if found:
                listed = "; ".join(p.describe() for p in found[:SHOWN])
                more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
                parts.append(f"{len(found)} {what}: {listed}{more}")
        if self.missing:
            parts.append(f"missing topics {', '.join(self.missing)} (`jobwheel topics ensure`)")
        return f"{head}: " + "; ".join(parts)


def jobwheel_topics(settings: Settings) -> list[str]:
    """Every topic jobwheel creates (``topics ensure``): the five and the changelog."""
    t = settings.topics
    return [s.name for s in (*t.specs(), *t.changelog_specs(settings.scheduler_app_id))]


def replication_report(
    settings: Settings, timeout_s: float, topics: Iterable[str] | None = None
) -> ReplicationReport:
    """The replication of ``topics`` (default: jobwheel's) from one metadata answer; raises
    what the admin client raises when no broker answers within ``timeout_s``."""
    from jobwheel.kafka.admin import admin_client

    names = list(topics) if topics is not None else jobwheel_topics(settings)
    metadata = admin_client(settings).list_topics(timeout=timeout_s)
    if topics is None:  # and the runs topics of queues added at run time (`queues add`)
        prefix = settings.topic_prefix
        names += sorted(
            n for n in metadata.topics if n not in names and queue_of_topic(prefix, n) is not None
        )
    found: list[PartitionReplicas] = []
    missing: list[str] = []
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or topic.error is not None:
            missing.append(name)
            continue
        for pid, p in sorted(topic.partitions.items()):
            found.append(PartitionReplicas(name, pid, p.leader, tuple(p.replicas), tuple(p.isrs)))
    return ReplicationReport(frozenset(metadata.brokers), tuple(found), tuple(missing))


def check_replication(settings: Settings, timeout_s: float) -> tuple[bool, str]:
    """The ``replication`` check of ``jobwheel health``: ok when every partition of
    jobwheel's topics has a leader and its full ISR."""
    report = replication_report(settings, timeout_s)
    return report.ok, report.detail()


class ReplicationCollector(Collector):
    """Gauges of the replication of jobwheel's topics, asked of the broker at scrape time at
    most every ``every_s`` (a scrape a second must not send a metadata request each time):

    - ``jobwheel_kafka_partitions_under_replicated{topic}``: partitions whose ISR is short;
    - ``jobwheel_kafka_partitions_offline{topic}``: partitions without a leader;
    - ``jobwheel_kafka_partition_isr{topic,partition}``: in-sync replicas of each partition;
    - ``jobwheel_kafka_partition_replicas{topic,partition}``: its replicas, to compare with.

    A metadata request that fails leaves the families out of that scrape (``absent()`` in an
    alert), rather than showing the last answer as current.
    """

    def __init__(self, settings: Settings, every_s: float = 10.0, timeout_s: float = 5.0) -> None:
        self.settings = settings
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._report: ReplicationReport | None = None

    def _current(self) -> ReplicationReport | None:
        with self._lock:
            if time.monotonic() - self._at >= self.every_s:
                self._at = time.monotonic()
                try:
                    self._report = replication_report(self.settings, self.timeout_s)
                except Exception:
                    self._report = None
            return self._report

    def collect(self) -> Iterable[Metric]:
        report = self._current()
        if report is None:
            return []
        names = sorted({p.topic for p in report.partitions})
        under = {(t,): 0.0 for t in names}
        offline = {(t,): 0.0 for t in names}
        for p in report.under_replicated:
            under[(p.topic,)] += 1
        for p in report.offline:
            offline[(p.topic,)] += 1
        isr = {(p.topic, str(p.partition)): float(len(p.isr)) for p in report.partitions}
        replicas = {(p.topic, str(p.partition)): float(len(p.replicas)) for p in report.partitions}
        return [
            gauge(
                "jobwheel_kafka_partitions_under_replicated",
                "Partitions of the topic whose in-sync replicas are fewer than its replicas",
                under,
                ["topic"],
            ),
            gauge(
                "jobwheel_kafka_partitions_offline",
                "Partitions of the topic without a leader (no reads or writes)",
                offline,
                ["topic"],
            ),
            gauge(
                "jobwheel_kafka_partition_isr",
                "In-sync replicas of the partition",
                isr,
                ["topic", "partition"],
            ),
            gauge(
                "jobwheel_kafka_partition_replicas",
                "Replicas of the partition",
                replicas,
                ["topic", "partition"],
            ),
        ]
