"""How promptly a `--now` job and a manual trigger fire, next to a timed (`--in`) job.

    .venv/bin/python -m load.prompt_bench --start-broker --count 30
    .venv/bin/python -m load.prompt_bench --bootstrap 127.0.0.1:9092 --count 30

Starts one ``jobwheel scheduler`` on fresh topics, then sends, one at a time with a pause
between them (the case of a person at a terminal, not a burst): ``--count`` one-off jobs due
now, as many due one second after they were issued, and as many manual triggers of one job.
Lateness is the scheduler's DISPATCHED event time minus the run's scheduled time (the command's
issue time for `now` and triggers), read from the status topic. Prints p50 / p90 / max per kind.
No worker runs: only the scheduler's side is measured.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from jobwheel.kafka.admin import ensure_topics
from jobwheel.producers.client import JobClient
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import State, StatusEvent
from jobwheel.settings import Settings
from load.harness import broker


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def dispatched(settings: Settings, wanted: int, timeout_s: float) -> list[StatusEvent]:
    codec = default_codec()
    consumer = Consumer(
        settings.librdkafka(
            **{"group.id": f"bench-{uuid.uuid4().hex[:8]}", "isolation.level": "read_committed"}
        )
    )
    topic = settings.topics.status
    consumer.assign(
        [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(settings.partitions)]
    )
    found: list[StatusEvent] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < wanted and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    continue
                for event in codec.decode_events(msg.value()):
                    if isinstance(event, StatusEvent) and event.state is State.DISPATCHED:
                        found.append(event)
    finally:
        consumer.close()
    return found


def run(args: argparse.Namespace, bootstrap: str, workdir: Path) -> None:
    prefix = f"prompt{uuid.uuid4().hex[:6]}"
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=args.partitions,
        scheduler_app_id=f"{prefix}-scheduler",
        data_dir=workdir,
    )
    ensure_topics(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env.update(
        JOBWHEEL_BOOTSTRAP_SERVERS=bootstrap,
        JOBWHEEL_TOPIC_PREFIX=prefix,
        JOBWHEEL_PARTITIONS=str(args.partitions),
        JOBWHEEL_SCHEDULER_APP_ID=f"{prefix}-scheduler",
        JOBWHEEL_DATA_DIR=str(workdir),
    )
    log = open(workdir / "scheduler.log", "ab")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "jobwheel.cli", "scheduler"], env=env, stdout=log, stderr=log
    )
    try:
        with JobClient(settings) as client:
            client.schedule("warm-up", task="demo.echo", now=True)
            client.schedule("manual", task="demo.echo", every=timedelta(hours=1))
            time.sleep(args.settle)  # the scheduler joins its group and restores its partitions
            kinds: dict[str, str] = {}
            for i in range(args.count):
                kinds[f"now-{i}"] = "now"
                client.schedule(f"now-{i}", task="demo.echo", now=True)
                time.sleep(args.gap)
                kinds[f"in-{i}"] = "in 1s"
                client.schedule(f"in-{i}", task="demo.echo", in_=timedelta(seconds=1))
                time.sleep(args.gap)
                client.trigger("manual")
                time.sleep(args.gap)
        events = dispatched(settings, 3 * args.count + 1, 60 + args.count)
    finally:
        scheduler.terminate()
        scheduler.wait(30)
        log.close()
    lateness: dict[str, list[int]] = {}
    for event in events:
        kind = "trigger" if event.job_id == "manual" else kinds.get(event.job_id)
        if kind is not None and event.scheduled_time_ms is not None:
            lateness.setdefault(kind, []).append(event.event_time_ms - event.scheduled_time_ms)
    print(f"{'kind':<8} {'runs':>5} {'p50 ms':>7} {'p90 ms':>7} {'max ms':>7}")
    for kind in ("in 1s", "now", "trigger"):
        values = lateness.get(kind, [])
        if values:
            print(
                f"{kind:<8} {len(values):>5} {percentile(values, 0.5):>7} "
                f"{percentile(values, 0.9):>7} {max(values):>7}"
            )
        else:
            print(f"{kind:<8} {0:>5}  (no DISPATCHED event seen)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=30, help="jobs of each kind")
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between commands")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds before sending")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--start-broker", action="store_true", help="start a throwaway broker")
    args = parser.parse_args()
    with broker(args.start_broker, args.bootstrap) as bootstrap:
        with tempfile.TemporaryDirectory(prefix="jobwheel-prompt-") as tmp:
            run(args, bootstrap, Path(tmp))


if __name__ == "__main__":
    main()
