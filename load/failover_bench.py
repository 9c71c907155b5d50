"""How long partitions take to move between scheduler processes, and how long a failover takes
when the failed process owned a million pending jobs.

    .venv/bin/python -m load.failover_bench movement            # classic vs KIP-848
    .venv/bin/python -m load.failover_bench restore --jobs 1000000

``movement`` runs real ``jobwheel scheduler`` processes with empty state and times, for each
group protocol: a second scheduler joining (scale out), one leaving on SIGTERM (scale in), one
SIGKILLed (failover), and the only one SIGKILLed and restarted at once (crash restart). The
time is from the event to the last "partition ready" line of the process that takes over.

``restore`` fills one scheduler with ``--jobs`` pending future jobs, schedules a probe job due 5 s
after the kill, SIGKILLs the owner, starts another scheduler on an empty disk at once, and times
the probe's fire (the session timeout, the restore from the changelog and the punctuation), with
the restore rate and the RSS of both processes. With ``--warm`` the other scheduler runs from
the start (owning half the partitions and keeping standby copies of the rest), as in a cluster:
the probe is due on a partition of the killed one.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import median
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from jobwheel.kafka.admin import ensure_topics
from jobwheel.producers.client import JobClient, JobSpec
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.partitioning import partition_for
from jobwheel.settings import Settings
from load.harness import broker
from load.scheduler_bench import cpu_s, env_for, rss_mib

PROTOCOLS = {
    "consumer (KIP-848)": {"JOBWHEEL_SCHEDULER_GROUP_PROTOCOL": "consumer"},
    "classic": {"JOBWHEEL_SCHEDULER_GROUP_PROTOCOL": "classic"},
    "classic, static": {
        "JOBWHEEL_SCHEDULER_GROUP_PROTOCOL": "classic",
        "JOBWHEEL_SCHEDULER_STATIC_MEMBERSHIP": "true",
    },
}


class Scheduler:
    def __init__(self, settings: Settings, workdir: Path, name: str, extra: dict[str, str]):
        self.log = workdir / f"{name}-{uuid.uuid4().hex[:4]}.log"
        env = {**env_for(settings, workdir / name), **extra}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jobwheel.cli", "scheduler"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def events(self, msg: str) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"msg": "{msg}"' in line:
                out.append(json.loads(line))
        return out

    def owned(self) -> set[int]:
        """Partitions ready and not since revoked or lost, from the log."""
        owned: set[int] = set()
        for line in self.log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event.get("msg") == "partition ready":
                owned.add(event["partition"])
            elif event.get("msg") in ("partition revoked", "partition lost", "partition stopped"):
                owned.difference_update(event["partitions"])  # one line per rebalance
        return owned

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait(predicate: Any, timeout_s: float = 120.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError("condition not met")
        time.sleep(0.02)
    return time.monotonic() - start


def fresh(bootstrap: str, workdir: Path, partitions: int) -> Settings:
    prefix = f"fo{uuid.uuid4().hex[:6]}"
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=partitions,
        scheduler_app_id=f"{prefix}-scheduler",
        data_dir=workdir,
    )
    ensure_topics(settings)
    return settings


def movement(args: argparse.Namespace, bootstrap: str, workdir: Path) -> None:
    all_parts = set(range(args.partitions))
    results: dict[str, dict[str, list[float]]] = {}
    for name, extra in PROTOCOLS.items():
        times: dict[str, list[float]] = {"join": [], "leave": [], "kill": [], "restart": []}
        for _ in range(args.repeat):
            s = fresh(bootstrap, workdir, args.partitions)
            a = Scheduler(s, workdir, "a", extra)
            wait(lambda a=a: a.owned() == all_parts)
            b = Scheduler(s, workdir, "b", extra)
            t0 = time.monotonic()
            wait(
                lambda a=a, b=b: (
                    b.owned() and (a.owned() | b.owned()) == all_parts and not a.owned() & b.owned()
                )
            )
            times["join"].append(time.monotonic() - t0)
            moved = b.owned()
            t0 = time.monotonic()
            b.stop(signal.SIGTERM)
            wait(lambda a=a, moved=moved: moved <= a.owned())
            times["leave"].append(time.monotonic() - t0)
            b = Scheduler(s, workdir, "b", extra)
            wait(
                lambda a=a, b=b: (
                    b.owned() and (a.owned() | b.owned()) == all_parts and not a.owned() & b.owned()
                )
            )
            moved = b.owned()
            t0 = time.monotonic()
            b.stop(signal.SIGKILL)
            wait(lambda a=a, moved=moved: moved <= a.owned())
            times["kill"].append(time.monotonic() - t0)
            t0 = time.monotonic()
            a.stop(signal.SIGKILL)
            a = Scheduler(s, workdir, "a", extra)  # same state dir: same instance
            wait(lambda a=a: a.owned() == all_parts)
            times["restart"].append(time.monotonic() - t0)
            a.stop()
        results[name] = times
        print(
            f"{name:20} "
            + "  ".join(f"{k} {median(v):5.2f}s" for k, v in times.items())
            + f"   (median of {args.repeat}; {args.partitions} partitions)",
            flush=True,
        )


def start_restore_pair(
    args: argparse.Namespace, s: Settings, workdir: Path
) -> tuple[Scheduler, Scheduler | None]:
    """The owner to be killed, once it holds every partition; with ``--warm`` also the other
    scheduler, once the two share the partitions (None: it starts after the kill)."""
    a = Scheduler(s, workdir, "a", {})
    wait(lambda: a.owned() == set(range(args.partitions)))
    b = None
    if args.warm:
        b = Scheduler(s, workdir, "b-warm", {})
        wait(
            lambda: (
                b is not None
                and (a.owned() | b.owned()) == set(range(args.partitions))
                and not a.owned() & b.owned()
            )
        )
    return a, b


def fill(args: argparse.Namespace, s: Settings, a: Scheduler) -> None:
    """Schedule ``--jobs`` jobs due tomorrow and wait until the scheduler has read them all
    (its group committed the requests topic to its end); print the times."""
    later = datetime.now(UTC) + timedelta(days=1)
    t0 = time.time()
    with JobClient(s) as client:
        for i in range(0, args.jobs, 20_000):
            client.schedule_many(
                [
                    JobSpec(job_id=f"pending-{j}", task="bench.noop", at=later)
                    for j in range(i, min(args.jobs, i + 20_000))
                ]
            )
    submitted = time.time() - t0
    print(f"submitted {args.jobs} pending jobs in {submitted:.0f}s", flush=True)
    # Ingested when the scheduler has read the requests topic to its end.
    consumer = Consumer(s.librdkafka(**{"group.id": s.scheduler_app_id}))
    tps = [TopicPartition(s.topics.requests, p) for p in range(args.partitions)]
    ends = {tp.partition: consumer.get_watermark_offsets(tp)[1] for tp in tps}

    def ingested() -> bool:
        return all(tp.offset >= ends[tp.partition] for tp in consumer.committed(tps, timeout=10))

    wait(ingested, 3600)
    ingest_s = time.time() - t0
    print(
        f"ingested in {ingest_s:.0f}s ({args.jobs / ingest_s:.0f} commands/s); owner RSS "
        f"{rss_mib(a.proc.pid)} MiB, CPU {cpu_s(a.proc.pid):.0f}s",
        flush=True,
    )


def schedule_probe(
    args: argparse.Namespace, s: Settings, victim_parts: set[int]
) -> tuple[str, Consumer]:
    """A probe job on one of ``victim_parts``, due 5 s from now, and a reader of the runs
    topic from its end (already assigned) to see it fire."""
    due = time.time() + 5
    probe = next(
        f"probe-{i}"
        for i in range(10_000)
        if partition_for(f"probe-{i}", args.partitions) in victim_parts
    )
    with JobClient(s) as client:
        client.schedule(probe, task="bench.noop", at=datetime.fromtimestamp(due, UTC))
    runs = Consumer(s.librdkafka(**{"group.id": f"fo-{uuid.uuid4().hex[:6]}"}))
    runs.assign([TopicPartition(s.topics.runs, p, OFFSET_END) for p in range(args.partitions)])
    runs.consume(1, 1.0)
    return probe, runs


def wait_for_probe(
    runs: Consumer, probe: str, b: Scheduler, kill_at: float
) -> tuple[float | None, int]:
    """When the probe fired (None: not within 10 minutes of the kill), and the new owner's
    peak RSS meanwhile (MiB)."""
    codec = default_codec()
    fired_at = None
    peak_rss = 0
    while fired_at is None and time.time() - kill_at < 600:
        for m in runs.consume(100, 0.05):
            if not m.error() and codec.decode(m.value()).job_id == probe:
                fired_at = time.time()
        peak_rss = max(peak_rss, rss_mib(b.proc.pid))
    return fired_at, peak_rss


def report_restore(
    args: argparse.Namespace,
    b: Scheduler,
    kill_at: float,
    fired_at: float | None,
    peak_rss: int,
    victim_parts: set[int],
) -> None:
    """Print the phases after the kill (from the new owner's log), the probe's time and the
    restore's figures."""
    ready = [e for e in b.events("partition ready") if e["ts"] >= kill_at]
    restored = sum(e["restored_records"] for e in ready)
    slowest = max((e["restore_s"] for e in ready), default=0.0)
    assigned = [e for e in b.events("partitions assigned; restoring") if e["ts"] >= kill_at]
    if assigned:
        print(
            f"phases after the kill: new owner assigned partitions at "
            f"{assigned[0]['ts'] - kill_at:.1f}s (the session timeout), last partition ready "
            f"at {max(e['ts'] for e in ready) - kill_at:.1f}s"
            if ready
            else ""
        )
    print(
        f"kill -9 of the owner of {args.jobs} pending jobs ({len(victim_parts)} partitions): "
        f"the probe due 5 s after the kill fired {fired_at - kill_at:.1f}s after it on "
        + ("a process with standby copies" if args.warm else "a process with an empty disk")
        if fired_at
        else "the probe never fired"
    )
    print(
        f"restored {restored} changelog records over {len(ready)} partitions; slowest "
        f"partition {slowest:.1f}s; new owner peak RSS {peak_rss} MiB, CPU "
        f"{cpu_s(b.proc.pid):.0f}s"
    )


def restore(args: argparse.Namespace, bootstrap: str, workdir: Path) -> None:
    """Fill an owner with pending jobs, kill it with a probe due 5 s later, and time the probe
    on the scheduler that takes over."""
    s = fresh(bootstrap, workdir, args.partitions)
    a, b = start_restore_pair(args, s, workdir)
    fill(args, s, a)
    victim_parts = a.owned()
    probe, runs = schedule_probe(args, s, victim_parts)
    kill_at = time.time()
    a.stop(signal.SIGKILL)
    if b is None:
        b = Scheduler(s, workdir, "b-empty-disk", {})
    fired_at, peak_rss = wait_for_probe(runs, probe, b, kill_at)
    report_restore(args, b, kill_at, fired_at, peak_rss, victim_parts)
    b.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["movement", "restore"])
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument(
        "--warm", action="store_true", help="restore: the other scheduler runs from the start"
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="jobwheel-failover-") as tmp,
        broker(args.bootstrap is None, args.bootstrap) as bootstrap,
    ):
        (movement if args.mode == "movement" else restore)(args, bootstrap, Path(tmp))
    os._exit(0)


if __name__ == "__main__":
    main()
