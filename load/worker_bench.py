"""Throughput of one ``jobwheel worker`` process on ``demo.echo`` (or ``--task``).

Produces N runs to a fresh runs topic (transactionally, keyed by job id, as the scheduler
does), starts one worker subprocess and reads the acks topic until every run's SUCCEEDED event
is there. Prints the drain rate over the whole run (process start and group join included) and
over the steady part (first to last SUCCEEDED).

    jobwheel broker start                       # or pass --start-broker
    python -m load.worker_bench --runs 20000 --concurrency 8
    python -m load.worker_bench --task load.noop --log-level INFO   # async no-op, default logging

No assertions: it prints numbers. The whole pipeline is on this machine (broker, producer of
the status events, the reader), so figures are for comparison between changes, not capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from jobwheel.kafka.admin import ensure_topics
from jobwheel.kafka.producer import producer_config
from jobwheel.schemas.codec import Codec
from jobwheel.schemas.models import Run, State, StatusEvent
from jobwheel.schemas.partitioning import key_for, partition_for
from jobwheel.settings import Settings
from load.harness import broker


def produce_runs(settings: Settings, n: int, codec: Codec, task: str = "demo.echo") -> float:
    producer = Producer(
        producer_config(settings, **{"transactional.id": f"bench-{uuid.uuid4().hex}"})
    )
    producer.init_transactions(30)
    started = time.monotonic()
    now = int(time.time() * 1000)
    batch = 5_000
    for first in range(0, n, batch):
        producer.begin_transaction()
        for i in range(first, min(n, first + batch)):
            job_id = f"bench-{i}"
            run = Run(
                run_id=f"{job_id}@{now}",
                job_id=job_id,
                task=task,
                args_json=json.dumps({"i": i}),
                seq=1,
                scheduled_time_ms=now,
                dispatched_at_ms=now,
                attempt=1,
                max_attempts=3,
                timeout_ms=None,
                visibility_timeout_ms=30_000,
                deadline_ms=now + 30_000,
                partition=partition_for(job_id, settings.partitions),
                fencing_token=1,
            )
            while True:
                try:
                    producer.produce(
                        settings.topics.runs, key=key_for(job_id), value=codec.encode(run)
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)
    return time.monotonic() - started


def worker_env(settings: Settings, concurrency: int, log_level: str = "WARNING") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env.update(
        JOBWHEEL_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        JOBWHEEL_KAFKA_CONFIG=json.dumps(settings.kafka_config),
        JOBWHEEL_TOPIC_PREFIX=settings.topic_prefix,
        JOBWHEEL_PARTITIONS=str(settings.partitions),
        JOBWHEEL_WORKER_GROUP=settings.worker_group,
        JOBWHEEL_WORKER_CONCURRENCY=str(concurrency),
        JOBWHEEL_LOG_LEVEL=log_level,
        JOBWHEEL_LOG_FORMAT="text",
    )
    return env


def wait_succeeded(settings: Settings, n: int, codec: Codec, timeout_s: float) -> list[int]:
    """Monotonic times at which each distinct run's SUCCEEDED was read."""
    consumer = Consumer(
        settings.librdkafka(
            **{"group.id": f"bench-read-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
    )
    consumer.assign(
        [TopicPartition(settings.topics.acks, p, 0) for p in range(settings.partitions)]
    )
    seen: set[str] = set()
    times: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(seen) < n and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error():
                    continue
                event = codec.decode(msg.value())
                if (
                    isinstance(event, StatusEvent)
                    and event.state is State.SUCCEEDED
                    and event.run_id not in seen
                ):
                    seen.add(event.run_id or "")
                    times.append(time.monotonic_ns())
    finally:
        consumer.close()
    return times


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Drained:
    """What one worker process did with the runs."""

    started_ns: int  # monotonic, when the worker process was started
    times: list[int]  # monotonic ns at which each run's SUCCEEDED was read
    cpu_s: float | None  # the worker's CPU seconds (None: not known on this platform)
    log_path: Path


def drain(args: argparse.Namespace, settings: Settings, codec: Codec, prefix: str) -> Drained:
    """Start one worker process (under cProfile with ``--profile``), read the acks until every
    run SUCCEEDED or ``--timeout``, then stop it."""
    log_path = Path(tempfile.gettempdir()) / f"{prefix}-worker.log"
    cpu_s: float | None = None
    with open(log_path, "wb") as log_file:
        started_ns = time.monotonic_ns()
        profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
        proc = subprocess.Popen(
            [
                sys.executable,
                *profile,
                "-m",
                "jobwheel.cli",
                "worker",
                "--tasks",
                "jobwheel.consumers.demo,load.tasks",
            ],
            env=worker_env(settings, args.concurrency, args.log_level),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            times = wait_succeeded(settings, args.runs, codec, args.timeout)
            cpu_s = process_cpu_s(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return Drained(started_ns, times, cpu_s, log_path)


def report(args: argparse.Namespace, drained: Drained) -> int:
    """Print the drain rates and the worker's CPU; 1 when not every run SUCCEEDED in time."""
    times, started_ns, cpu_s = drained.times, drained.started_ns, drained.cpu_s
    if len(times) < args.runs:
        print(
            f"only {len(times)}/{args.runs} SUCCEEDED within {args.timeout}s; "
            f"log {drained.log_path}"
        )
        return 1
    total_s = (times[-1] - started_ns) / 1e9
    steady_s = (times[-1] - times[0]) / 1e9
    print(
        f"worker ({args.task}, concurrency {args.concurrency}, {args.partitions} partitions, "
        f"log level {args.log_level}): "
        f"{args.runs} runs SUCCEEDED in {total_s:.2f}s from process start "
        f"({args.runs / total_s:,.0f} runs/s), first result after "
        f"{(times[0] - started_ns) / 1e9:.2f}s, steady {args.runs / max(steady_s, 1e-9):,.0f} "
        f"runs/s"
    )
    if cpu_s is not None:
        print(
            f"worker CPU {cpu_s:.2f}s for {args.runs} runs: {args.runs / cpu_s:,.0f} runs per "
            f"CPU-second (the machine's other load does not count against it)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", default=None, help="default: JOBWHEEL_BOOTSTRAP_SERVERS")
    parser.add_argument("--start-broker", action="store_true", help="start a local broker")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--profile", metavar="FILE", help="run the worker under cProfile")
    parser.add_argument(
        "--task",
        default="demo.echo",
        help="task of every run: demo.echo (sync, default), load.noop (async), load.noop_sync",
    )
    parser.add_argument(
        "--log-level", default="WARNING", help="the worker's JOBWHEEL_LOG_LEVEL (WARNING)"
    )
    args = parser.parse_args(argv)

    codec = Codec()
    with broker(args.start_broker, args.bootstrap) as bootstrap:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        settings = Settings(
            bootstrap_servers=bootstrap,
            topic_prefix=prefix,
            partitions=args.partitions,
            worker_group=f"{prefix}-workers",
        )
        ensure_topics(settings)
        produce_s = produce_runs(settings, args.runs, codec, args.task)
        print(f"produced {args.runs} runs in {produce_s:.2f}s ({args.runs / produce_s:,.0f}/s)")
        drained = drain(args, settings, codec, prefix)
    return report(args, drained)


if __name__ == "__main__":
    sys.exit(main())
