"""Print what one scheduler transaction's commit costs on a broker with nothing else to do.

    .venv/bin/python -m load.commit_bench [--transactions 200] [--records 300] [--bootstrap B]
                                          [--topics 1] [--partitions 12]

The scheduler's own transactional producer (:class:`~jobwheel.streams.kafka.TransactionalProducer`,
its config and its phases: ``produce``, ``offsets``, ``end``) on a fresh local broker (or
``--bootstrap``): each transaction produces ``--records`` records of 200 bytes spread over
every partition of ``--topics`` topics of ``--partitions`` partitions, adds one consumed offset
and commits, 10 ms apart. ``--topics 3`` is the scheduler's own fan-out: a transaction of one
scheduler writes runs, status events and changelog records to each partition it owns that
had work, and librdkafka sends one produce request per partition (BENCHMARKS.md, "The
partition count"). What ``load.e2e``'s "scheduler transactions" line shows beyond these
figures is the load (the broker and the scheduler sharing two cores with everything else);
the ``open`` phase is not here, it is the commit interval and the loop. Numbers, not
assertions.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from jobwheel.schemas.topics import DEFAULT_PARTITIONS as PARTITIONS


def measure(
    bootstrap: str,
    transactions: int,
    records: int,
    topics: int = 1,
    partitions: int = PARTITIONS,
) -> dict[str, list[float]]:
    """Seconds per phase of each transaction, on fresh topics."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from jobwheel.settings import Settings
    from jobwheel.streams.kafka import TransactionalProducer

    run = uuid.uuid4().hex[:8]
    source = f"commit-bench-in-{run}"
    sinks = [f"commit-bench-out-{run}-{i}" for i in range(topics)]
    # every (topic, partition) a transaction writes to, each record to the next
    targets = [(t, p) for t in sinks for p in range(partitions)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(source, PARTITIONS, 1), *(NewTopic(t, partitions, 1) for t in sinks)]
    ).values():
        future.result()
    settings = Settings(_env_file=None, bootstrap_servers=bootstrap)  # type: ignore[call-arg]
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"commit-bench-{run}", "log_level": 4}
    )
    consumer.subscribe([source])
    for _ in range(50):  # joined: the group's metadata names a member
        consumer.poll(0.1)
        if consumer.assignment():
            break
    producer = TransactionalProducer(settings, f"commit-bench-{run}")
    producer.init()
    value = b"x" * 200
    spent: dict[str, list[float]] = {"produce": [], "offsets": [], "end": []}
    try:
        for i in range(transactions):
            began = time.perf_counter()
            producer.begin()
            for r in range(records):
                topic, partition = targets[r % len(targets)]
                producer.produce(topic, partition, str(r).encode(), value)
            produced = time.perf_counter() - began
            offsets_s, end_s = producer.commit(
                [(source, 0, i + 1, "")], consumer.consumer_group_metadata()
            )
            for phase, seconds in zip(spent, (produced, offsets_s, end_s), strict=True):
                spent[phase].append(seconds)
            time.sleep(0.01)
    finally:
        producer.close()
        consumer.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--bootstrap", help="a broker to use instead of a fresh local one")
    parser.add_argument(
        "--topics", type=int, default=1, help="topics written (3: the scheduler's fan-out)"
    )
    parser.add_argument("--partitions", type=int, default=PARTITIONS, help="of each topic")
    args = parser.parse_args()
    from load.e2e import own_broker

    with own_broker(args.bootstrap, Path(tempfile.mkdtemp(prefix="commit-bench-"))) as (
        bootstrap,
        _pids,
    ):
        shape = (args.topics, args.partitions)
        measure(bootstrap, 20, args.records, *shape)  # connections made, the broker's JIT warmed
        spent = measure(bootstrap, args.transactions, args.records, *shape)
    print(
        f"commit, {args.transactions} transactions of {args.records} records over "
        f"{args.topics} x {args.partitions} partitions: ms p50/p90 "
        + ", ".join(
            f"{phase} {statistics.median(v) * 1000:.1f}/"
            f"{statistics.quantiles(v, n=10)[-1] * 1000:.1f}"
            for phase, v in spent.items()
        )
    )


if __name__ == "__main__":
    main()
