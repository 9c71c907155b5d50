"""Records and bytes per job, by topic and by process: what one job costs the broker.

Why: on this machine the record count per job, not the bytes, sets most of the broker's and the
clients' work (issue 32: the Kafka ceiling here is about 200,000 records/s each way), so every
change that claims to save records must show the count before and after. A load run takes
:func:`snapshot` when its measured span begins and again when the sink has stored every event;
:func:`account` reads the records written in between, topic by topic, and attributes them to
the processes that write and read each topic (:data:`WRITERS`, :data:`READERS`).

What each figure is:
- ``records``: data records a ``read_committed`` reader sees (what a consumer group pays for);
- ``offsets``: offsets used, which adds the transaction markers (one per partition a
  transaction wrote to) and any aborted records: broker work no consumer sees;
- ``payload_bytes``: key + value + headers of the data records;
- ``disk_bytes``: growth of the topic's log segments on the broker's disks (batch headers and
  compression included; with a broker that is not ours to read, None).
Kafka's own topics (group offsets, transaction state) are counted by offsets only: they are
what the exactly-once commits cost the broker. The generator's runs reader (a measuring
device, not part of the pipeline) is not counted as a reader.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobwheel.settings import Settings

#: Kafka's own topics whose growth the exactly-once commits cause.
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")

#: Which process writes each kind of topic (dead letters come from the scheduler and from the
#: workers; a load run writes none, so they are put on the scheduler).
WRITERS = {
    "requests": ("generator",),
    "runs": ("scheduler",),
    "acks": ("worker",),
    "status": ("scheduler",),
    "changelog": ("scheduler",),
    "dead-letter": ("scheduler",),
    "workers": ("worker",),
}
#: Which processes' consumer groups read each kind of topic (the changelog is read only to
#: restore a partition; the workers topic only by the SDK and the API on request).
READERS = {
    "requests": ("scheduler",),
    "runs": ("worker",),
    "acks": ("scheduler", "sink"),
    "status": ("sink",),
}


@dataclass(frozen=True)
class Span:
    """End offsets of every counted topic's partitions, and their log sizes on disk."""

    offsets: dict[str, dict[int, int]]
    disk: dict[str, int] | None


@dataclass
class TopicCount:
    kind: str
    records: int = 0
    offsets: int = 0
    payload_bytes: int = 0
    disk_bytes: int | None = None


def kind_of(topic: str, settings: Settings) -> str | None:
    """The kind of a run's topic (``runs`` for every queue's), None for anyone else's."""
    if topic == settings.topics.changelog(settings.scheduler_app_id):
        return "changelog"
    if topic in INTERNAL_TOPICS:
        return topic
    head = f"{settings.topic_prefix}."
    if not topic.startswith(head):
        return None
    rest = topic[len(head) :]
    return "runs" if rest.split(".", 1)[0] == "runs" else rest


def broker_log_dirs(pid: int) -> list[Path]:
    """The ``log.dirs`` of a running local broker, read from the properties file it was
    started with (its last argument); empty when that cannot be read."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        props = Path(next(a for a in reversed(args) if a.endswith(b".properties")).decode())
        for line in props.read_text().splitlines():
            name, _, value = line.partition("=")
            if name.strip() == "log.dirs":
                return [Path(d.strip()) for d in value.split(",") if d.strip()]
    except (OSError, StopIteration, UnicodeDecodeError):
        pass
    return []


def _disk(topics: list[str], log_dirs: list[Path]) -> dict[str, int] | None:
    if not log_dirs:
        return None
    sizes = dict.fromkeys(topics, 0)
    for root in log_dirs:
        for part in root.glob("*-[0-9]*"):
            topic = part.name.rsplit("-", 1)[0]
            if topic in sizes:
                sizes[topic] += sum(f.stat().st_size for f in part.glob("*.log"))
    return sizes


def snapshot(settings: Settings, broker_pids: list[int] | tuple[int, ...] = ()) -> Span:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.librdkafka())
    metadata = admin.list_topics(timeout=30).topics
    topics = sorted(t for t in metadata if kind_of(t, settings) is not None)
    consumer = Consumer(settings.librdkafka("consumer", **{"group.id": "load-records"}))
    try:
        offsets: dict[str, dict[int, int]] = {}
        for topic in topics:
            offsets[topic] = {}
            for p in metadata[topic].partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                offsets[topic][p] = high
    finally:
        consumer.close()
    dirs = [d for pid in broker_pids for d in broker_log_dirs(pid)]
    return Span(offsets, _disk(topics, dirs))


def _read(settings: Settings, before: Span, after: Span, counts: dict[str, TopicCount]) -> None:
    """Read the data records between the two spans' offsets of the pipeline's own topics."""
    from confluent_kafka import Consumer, TopicPartition

    todo = {
        (topic, p): (start, after.offsets[topic][p])
        for topic, parts in before.offsets.items()
        if topic not in INTERNAL_TOPICS
        for p, start in parts.items()
        if after.offsets.get(topic, {}).get(p, start) > start
    }
    if not todo:
        return
    consumer = Consumer(
        settings.librdkafka(
            "consumer",
            **{
                "group.id": "load-records",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            },
        )
    )
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in todo.items()])
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=0.5):
                if msg.error():
                    continue
                key = (msg.topic(), msg.partition())
                if key not in todo or msg.offset() >= todo[key][1]:
                    continue
                c = counts[msg.topic()]
                c.records += 1
                c.payload_bytes += len(msg.key() or b"") + len(msg.value() or b"")
                c.payload_bytes += sum(len(k) + len(v or b"") for k, v in msg.headers() or ())
            for key, (_, end) in list(todo.items()):
                # The position passes transaction markers too: done once it reaches the end.
                position = consumer.position([TopicPartition(*key)])[0].offset
                if position >= end:
                    del todo[key]
    finally:
        consumer.close()


def account(settings: Settings, before: Span, after: Span, jobs: int) -> dict[str, Any]:
    """Per job: each topic's records, offsets and bytes, and each process's written and read
    records and bytes (the JSON's ``records`` and the report's lines)."""
    counts: dict[str, TopicCount] = {}
    for topic, parts in after.offsets.items():
        kind = kind_of(topic, settings) or topic
        start = before.offsets.get(topic, {})
        used = sum(end - start.get(p, 0) for p, end in parts.items())
        counts[topic] = TopicCount(kind, offsets=used)
        if after.disk is not None and before.disk is not None and topic in after.disk:
            counts[topic].disk_bytes = after.disk[topic] - before.disk.get(topic, 0)
    _read(settings, before, after, counts)
    per_job = max(1, jobs)
    by_topic = {
        topic: {k: v / per_job if isinstance(v, int) else v for k, v in asdict(c).items()}
        for topic, c in counts.items()
        if c.offsets
    }
    processes: dict[str, dict[str, float]] = {}
    for c in counts.values():
        sides = (("written", WRITERS.get(c.kind, ())), ("read", READERS.get(c.kind, ())))
        for verb, roles in sides:
            for role in roles:
                mine = processes.setdefault(role, {})
                mine[f"{verb}_records"] = mine.get(f"{verb}_records", 0.0) + c.records / per_job
                mine[f"{verb}_bytes"] = mine.get(f"{verb}_bytes", 0.0) + c.payload_bytes / per_job
    pipeline = [c for c in counts.values() if c.kind not in INTERNAL_TOPICS]
    return {
        "jobs": jobs,
        "by_topic": by_topic,
        "by_process": processes,
        "records_per_job": sum(c.records for c in pipeline) / per_job,
        "offsets_per_job": sum(c.offsets for c in counts.values()) / per_job,
        "payload_bytes_per_job": sum(c.payload_bytes for c in pipeline) / per_job,
        "disk_bytes_per_job": (
            None
            if any(c.disk_bytes is None for c in pipeline)
            else sum(c.disk_bytes or 0 for c in counts.values()) / per_job
        ),
    }


def describe(accounting: dict[str, Any]) -> list[str]:
    """The report's lines: one per topic, one per process, and the totals."""
    if not accounting:
        return []

    def disk(v: float | None) -> str:
        return "" if v is None else f", disk {v:,.0f} B"

    lines = [
        f"records per job: {accounting['records_per_job']:.2f} data records "
        f"({accounting['payload_bytes_per_job']:,.0f} B of payload"
        f"{disk(accounting['disk_bytes_per_job'])}), {accounting['offsets_per_job']:.2f} offsets "
        "with transaction markers and Kafka's own topics"
    ]
    for topic, c in sorted(accounting["by_topic"].items(), key=lambda kv: -kv[1]["offsets"]):
        name = c["kind"] if c["kind"] != "runs" else topic.split(".", 1)[-1]
        lines.append(
            f"  {name:<20} {c['records']:6.2f} records {c['offsets']:6.2f} offsets "
            f"{c['payload_bytes']:7,.0f} B{disk(c['disk_bytes'])}"
        )
    for role, c in sorted(accounting["by_process"].items()):
        lines.append(
            f"  {role:<10} writes {c.get('written_records', 0):.2f} records "
            f"({c.get('written_bytes', 0):,.0f} B), reads {c.get('read_records', 0):.2f} "
            f"({c.get('read_bytes', 0):,.0f} B) per job"
        )
    return lines
