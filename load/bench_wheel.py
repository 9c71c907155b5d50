"""Print throughput of fire-time arithmetic and of the RocksDB timing wheel (no broker needed).

    .venv/bin/python -m load.bench_wheel [--entries 1000000]

Figures: next-fire computations per second (cron in a DST zone, interval); schedule() rate into
RocksDB; latency of due() for a small batch at the head of a large wheel, before and after many
removals (tombstones); process RSS growth; and the CPU per fire of a transaction's scans, as the
engine makes them: over the transaction's write buffer, due() and the entries removed, then the
next due time asked once per partition (``--partitions``), commits every 20 iterations. Numbers,
not assertions: run it on the target box.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from jobwheel.schemas.models import Cron, Every
from jobwheel.streams import triggers
from jobwheel.streams.state.buffer import BufferedWheelStore
from jobwheel.streams.state.rocksdb import RocksDBLimits, RocksDBWheelStore
from jobwheel.streams.wheel import TimingWheel

T0 = 1_780_000_000_000


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bench_triggers(n: int) -> None:
    for trigger in (
        Cron("*/5 * * * *", "America/New_York"),
        Cron("30 2 * * 1-5", "Europe/Berlin"),
        Cron("0 9 1 * *", "Australia/Lord_Howe"),
        Every(60_000),
    ):
        t = T0
        start = time.perf_counter()
        for _ in range(n):
            t = triggers.next_fire_ms(trigger, t)  # type: ignore[assignment]
        elapsed = time.perf_counter() - start
        print(f"next_fire_ms {trigger!r}: {n / elapsed:,.0f}/s ({elapsed / n * 1e6:.1f} us)")


def bench_wheel(entries: int, batch: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        limits = RocksDBLimits()
        db = limits.open(Path(tmp) / "wheel.db")
        wheel = TimingWheel(RocksDBWheelStore(db))
        rss0 = rss_mib()
        start = time.perf_counter()
        for i in range(entries):
            wheel.schedule(T0 + i * 10, f"job-{i:08d}", "fire")
        elapsed = time.perf_counter() - start
        print(f"schedule: {entries / elapsed:,.0f}/s ({entries:,} entries, {limits})")
        print(f"RSS growth after {entries:,} entries: {rss_mib() - rss0:.1f} MiB")

        def timed_due(label: str, wheel: TimingWheel) -> None:
            start = time.perf_counter()
            got = wheel.due(T0 + entries * 10, batch)
            print(f"due(limit={batch}) {label}: {(time.perf_counter() - start) * 1e3:.2f} ms")
            for entry in got:
                wheel.remove(entry)

        timed_due("at the head", wheel)
        removed = 0
        start = time.perf_counter()
        while removed < entries // 5:
            got = wheel.due(T0 + entries * 10, 1000)
            for entry in got:
                wheel.remove(entry)
            removed += len(got)
        elapsed = time.perf_counter() - start
        print(f"due+remove loop: {removed / elapsed:,.0f} entries/s ({removed:,} removed)")
        timed_due(f"after {removed:,} removals (with floor)", wheel)
        timed_due(f"after {removed:,} removals (fresh wheel, no floor)", TimingWheel(wheel.store))
        print(f"RSS growth at end: {rss_mib() - rss0:.1f} MiB")
        db.close()


def bench_transaction_scans(partitions: int, per_ms: int = 5, iterations: int = 400) -> None:
    """One partition's wheel, 50,000 entries due ``per_ms`` a millisecond; an iteration every
    millisecond fires what is due and asks for the next due time ``partitions`` times (the
    engine asks every partition's wheels each iteration; one wheel stands in for all)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = RocksDBLimits().open(Path(tmp) / "wheel.db")
        committed = TimingWheel(RocksDBWheelStore(db))
        for i in range(50_000):
            committed.schedule(T0 + i // per_ms, f"job-{i:08d}", "fire")
        store = BufferedWheelStore(RocksDBWheelStore(db))
        wheel = TimingWheel(store)
        now = T0
        fired = 0
        start = time.process_time()
        for i in range(iterations):
            now += 1
            for entry in wheel.due(now, 2000):
                wheel.remove(entry)
                fired += 1
            for _ in range(partitions):
                wheel.next_due_ms()
            if i % 20 == 19:
                store.commit()
        spent = time.process_time() - start
        print(
            f"transaction scans: {spent / fired * 1e6:.1f} us of CPU per fire ({fired:,} fires, "
            f"{per_ms} a ms, next due time asked {partitions} times an iteration, a commit "
            "every 20 iterations)"
        )
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--fires", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument(
        "--transaction-only", action="store_true", help="only the transaction's scans"
    )
    args = parser.parse_args()
    if not args.transaction_only:
        bench_triggers(args.fires)
        bench_wheel(args.entries, args.batch)
    bench_transaction_scans(args.partitions)


if __name__ == "__main__":
    main()
