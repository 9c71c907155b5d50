"""Scheduler benchmark: fires per second and lateness on a real broker.

    .venv/bin/python -m load.scheduler_bench --jobs 5000 --window 10 --schedulers 1
    .venv/bin/python -m load.scheduler_bench --jobs 20000 --window 10 --acks   # + SUCCEEDED
    .venv/bin/python -m load.scheduler_bench --jobs 20000 --window 0   # burst: all due at once

Starts a local Kafka broker in a temp dir (or uses ``--bootstrap``), creates fresh topics,
starts ``--schedulers`` scheduler processes, schedules ``--jobs`` at-jobs due evenly over
``--window`` seconds starting ``--lead`` seconds from now, and reads the runs topic
(read_committed, as workers do). Lateness is measured twice: when the run record was produced
(its CreateTime minus its scheduled time), and when a consumer could first see it (receive time
minus scheduled time; includes the dispatch transaction's commit). With ``--acks`` the benchmark
answers every run with a SUCCEEDED acknowledgement, as a worker would, so the scheduler's CPU per
job covers the whole life of a one-off job: command, fire, acknowledgement (and COMPLETED).
No worker process runs: only the scheduler's cost is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from jobwheel.kafka.admin import ensure_topics
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import Run, State, StatusEvent
from jobwheel.schemas.topics import STATE_HEADER
from jobwheel.settings import Settings
from load.harness import broker


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return -1


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def wait_for_state(
    settings: Settings, state: str, count: int, since: float, timeout_s: float
) -> float:
    """Seconds from ``since`` until ``count`` events in ``state`` are on the status topic."""
    consumer = Consumer(
        settings.librdkafka(
            **{
                "group.id": f"bench-status-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
            }
        )
    )
    consumer.assign(
        [
            TopicPartition(settings.topics.status, p, OFFSET_BEGINNING)
            for p in range(settings.partitions)
        ]
    )
    codec = default_codec()
    seen = 0
    last = since
    deadline = time.time() + timeout_s
    try:
        while seen < count and time.time() < deadline:
            for m in consumer.consume(1000, 0.05):
                if m.error():
                    continue
                for event in codec.decode_events(m.value()):
                    if event.state == state:  # type: ignore[union-attr]
                        seen += 1
                        last = time.time()
    finally:
        consumer.close()
    return last - since


def ack(producer: Producer, codec: Any, settings: Settings, run: Run) -> None:
    """What a worker reports for a run that succeeded at once."""
    event = StatusEvent(
        event_id=f"{run.run_id}:{run.attempt}:SUCCEEDED",
        job_id=run.job_id,
        state=State.SUCCEEDED,
        event_time_ms=int(time.time() * 1000),
        source="worker",
        run_id=run.run_id,
        seq=run.seq,
        attempt=run.attempt,
        task=run.task,
        scheduled_time_ms=run.scheduled_time_ms,
        worker="bench",
        duration_ms=0,
    )
    while True:
        try:
            producer.produce(
                settings.topics.acks,
                codec.encode(event),
                run.job_id.encode(),
                partition=run.partition,
                headers=[(STATE_HEADER, b"SUCCEEDED")],
            )
            break
        except BufferError:
            producer.poll(0.05)
    producer.poll(0)


def env_for(settings: Settings, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is not None:
            env[f"JOBWHEEL_{name.upper()}"] = (
                json.dumps(value) if isinstance(value, dict) else str(value)
            )
    env["JOBWHEEL_DATA_DIR"] = str(data_dir)
    env["JOBWHEEL_LOG_LEVEL"] = "INFO"
    env["JOBWHEEL_LOG_FORMAT"] = "json"
    return env


@dataclass
class Submitted:
    """The jobs handed to the scheduler (after the warm-up)."""

    start_ms: int  # when the first of them is due
    t0: float  # wall clock when submitting began
    submit_s: float  # how long submitting took
    cpu0: float  # the schedulers' CPU seconds before it


@dataclass
class Fires:
    """The runs read from the runs topic, warm-up excluded."""

    produced_late: list[int] = field(default_factory=list)  # CreateTime - scheduled, ms
    visible_late: list[int] = field(default_factory=list)  # receive time - scheduled, ms
    first_recv: float = 0.0  # wall ms
    last_recv: float = 0.0


def start_schedulers(
    args: argparse.Namespace, settings: Settings, workdir: Path
) -> list[subprocess.Popen[bytes]]:
    """``--schedulers`` scheduler processes (under cProfile with ``--profile``), each with its
    own state directory and log in ``workdir``."""
    procs = []
    for i in range(args.schedulers):
        log = open(workdir / f"scheduler{i}.log", "wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    *(["-m", "cProfile", "-o", f"{args.profile}.{i}"] if args.profile else []),
                    "-m",
                    "jobwheel.cli",
                    "scheduler",
                ],
                env=env_for(settings, workdir / f"s{i}"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    return procs


def stop_schedulers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def submit(
    args: argparse.Namespace,
    settings: Settings,
    consumer: Consumer,
    procs: list[subprocess.Popen[bytes]],
) -> Submitted:
    """Warm up (one job per partition, four times over, so every scheduler has claimed its
    partitions and fired), then schedule ``--jobs`` at-jobs due evenly over ``--window``
    seconds from ``--lead`` seconds from now."""
    with JobClient(settings) as client:
        client.schedule_many(
            [JobSpec(task="bench.noop", now=True) for _ in range(4 * args.partitions)]
        )
        seen = 0
        deadline = time.time() + 120
        while seen < 4 * args.partitions and time.time() < deadline:
            if (m := consumer.poll(0.5)) is not None and not m.error():
                seen += 1
        start_ms = int((time.time() + args.lead) * 1000)
        step = args.window * 1000 / max(1, args.jobs - 1)
        specs = [
            JobSpec(
                task="bench.noop",
                at=datetime.fromtimestamp((start_ms + int(i * step)) / 1000, UTC),
            )
            for i in range(args.jobs)
        ]
        cpu0 = sum(cpu_s(p.pid) for p in procs)
        t0 = time.time()
        for i in range(0, len(specs), 5000):
            client.schedule_many(specs[i : i + 5000])
        submit_s = time.time() - t0
    return Submitted(start_ms, t0, submit_s, cpu0)


def read_fires(
    args: argparse.Namespace,
    settings: Settings,
    consumer: Consumer,
    acker: Producer | None,
    start_ms: int,
) -> Fires:
    """Read the runs topic until every job fired (or the window and two minutes are over),
    answering each run SUCCEEDED when there is an ``acker``."""
    codec = default_codec()
    fires = Fires()
    deadline = time.time() + args.lead + args.window + 120
    while len(fires.visible_late) < args.jobs and time.time() < deadline:
        msgs = consumer.consume(1000, 0.01)
        recv_ms = time.time() * 1000
        for m in msgs:
            if m.error():
                continue
            run_ = codec.decode(m.value())
            if acker is not None:
                ack(acker, codec, settings, run_)
            if run_.scheduled_time_ms < start_ms:
                continue  # warm-up
            fires.produced_late.append(m.timestamp()[1] - run_.scheduled_time_ms)
            fires.visible_late.append(int(recv_ms) - run_.scheduled_time_ms)
            fires.first_recv = fires.first_recv or recv_ms
            fires.last_recv = recv_ms
    return fires


def report(
    args: argparse.Namespace,
    procs: list[subprocess.Popen[bytes]],
    submitted: Submitted,
    fires: Fires,
    ingest: tuple[float, list[int], float],
    cpu_fire: float,
) -> None:
    """Print the figures; ``ingest`` is (seconds, the schedulers' RSS MiB after it, their CPU
    seconds for it)."""
    ingest_s, rss_ingested, cpu_ingest = ingest
    n = len(fires.visible_late)
    span_s = max((fires.last_recv - max(fires.first_recv, submitted.start_ms)) / 1000, 1e-3)
    print(
        f"jobs={args.jobs} window={args.window}s partitions={args.partitions} "
        f"schedulers={args.schedulers} acks={'yes' if args.acks else 'no'}"
    )
    submit_s = submitted.submit_s
    print(f"submitted {args.jobs} jobs in {submit_s:.2f}s ({args.jobs / submit_s:.0f}/s)")
    print(
        f"ingested (SCHEDULED seen) in {ingest_s:.2f}s after submit started "
        f"({args.jobs / ingest_s:.0f} commands/s); scheduler RSS MiB after ingest: "
        f"{rss_ingested}, at end: {[rss_mib(p.pid) for p in procs]}"
    )
    if ingest_s > args.lead:
        print("note: ingestion outlasted --lead; lateness below includes ingestion backlog")
    print(f"fired {n}/{args.jobs}; fires/s over the firing span: {n / span_s:.0f}")
    what = "incl. SUCCEEDED acks and COMPLETED" if args.acks else "no acks"
    print(
        f"scheduler CPU: ingest {cpu_ingest:.1f}s ({args.jobs / cpu_ingest:.0f} commands per "
        f"CPU-second), firing {cpu_fire:.1f}s ({n / cpu_fire:.0f} fires per CPU-second, "
        f"{what}); per job {(cpu_ingest + cpu_fire) / args.jobs * 1000:.3f} ms"
    )
    if n:
        for name, vals in (("produced", fires.produced_late), ("visible", fires.visible_late)):
            print(
                f"lateness {name:8} ms: p50={percentile(vals, 0.5)} "
                f"p99={percentile(vals, 0.99)} max={max(vals)}"
            )


def run(args: argparse.Namespace, bootstrap: str, workdir: Path) -> None:
    """Start the schedulers, submit, measure ingestion, then the fires; print the figures."""
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    settings = Settings(
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=args.partitions,
        scheduler_app_id=f"{prefix}-scheduler",
        data_dir=workdir,
    )
    ensure_topics(settings)
    procs = start_schedulers(args, settings, workdir)
    consumer = Consumer(
        settings.librdkafka(**{"group.id": f"{prefix}-bench", "isolation.level": "read_committed"})
    )
    consumer.assign(
        [TopicPartition(settings.topics.runs, p, OFFSET_BEGINNING) for p in range(args.partitions)]
    )
    acker = Producer(settings.librdkafka(**{"linger.ms": 5})) if args.acks else None
    try:
        submitted = submit(args, settings, consumer, procs)
        total = args.jobs + 4 * args.partitions
        ingest_s = wait_for_state(settings, "SCHEDULED", total, submitted.t0, args.lead + 300)
        rss_ingested = [rss_mib(p.pid) for p in procs]
        cpu_ingest = sum(cpu_s(p.pid) for p in procs) - submitted.cpu0
        if args.ingest_only:
            print(
                f"ingest only: {args.jobs} jobs due in {args.lead:.0f}s, "
                f"ingested in {ingest_s:.2f}s "
                f"({args.jobs / ingest_s:.0f} commands/s, {args.jobs / cpu_ingest:.0f} per "
                f"scheduler CPU-second); scheduler RSS MiB: {rss_ingested}"
            )
            return
        fires = read_fires(args, settings, consumer, acker, submitted.start_ms)
        if acker is not None:
            acker.flush(30)
            wait_for_state(settings, "COMPLETED", total, time.time(), 60)
        cpu_fire = sum(cpu_s(p.pid) for p in procs) - submitted.cpu0 - cpu_ingest
        report(args, procs, submitted, fires, (ingest_s, rss_ingested, cpu_ingest), cpu_fire)
    finally:
        consumer.close()
        stop_schedulers(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds over which jobs fall due"
    )
    parser.add_argument(
        "--lead",
        type=float,
        help="seconds before the first is due (default 5 + jobs/500, so that submitting and "
        "ingesting the jobs is over before they fall due and fires are measured on their own)",
    )
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument(
        "--acks", action="store_true", help="answer every run with SUCCEEDED, as a worker would"
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument(
        "--ingest-only",
        action="store_true",
        help="schedule the jobs (far ahead with --lead) and report ingestion and RSS only",
    )
    parser.add_argument("--profile", help="write each scheduler's cProfile stats to PROFILE.<n>")
    args = parser.parse_args()
    if args.lead is None:
        args.lead = 5 + args.jobs / 500
    with (
        tempfile.TemporaryDirectory(prefix="jobwheel-bench-") as tmp,
        broker(args.bootstrap is None, args.bootstrap) as bootstrap,
    ):
        run(args, bootstrap, Path(tmp))


if __name__ == "__main__":
    main()
