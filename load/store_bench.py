"""The embedded status store at a steady ingest rate: CPU per row, inserts and merges apart.

``load.status_bench`` measures a sink catching up (batches as large as they come); a sink that
keeps up inserts a batch every ``JOBWHEEL_STATUS_BATCH_MS``, or every
``JOBWHEEL_STATUS_BUSY_BATCH_MS`` once its batches are busy (``--batch-ms`` picks as the sink
would), and then the engine's background merges cost as much as the inserts. This inserts the
five rows of ``--rate`` one-off jobs per second (SCHEDULED, DISPATCHED, STARTED, the verdict,
COMPLETED) in one batch every ``--batch-ms`` into a fresh embedded store for ``--seconds``,
then prints the process's CPU split by thread (ClickHouse names its threads: ``MergeMutate`` merges,
``ThreadPool`` and the main thread run the inserts and their materialized views).

    python -m load.store_bench                              # 5,000 jobs/s for 50 s
    python -m load.store_bench --set merge_selector_base=5  # ClickHouse's default, to compare

No Kafka and no decoding: the engine alone. No assertions: it prints numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from collections import Counter

from jobwheel.consumers.status.sink import batch_due_ms
from jobwheel.consumers.status.store import TTL_TABLES, StatusStore, event_row
from jobwheel.schemas.models import State
from jobwheel.settings import get_settings
from load.e2e import proc_thread_cpu
from load.status_bench import job_events


def by_name(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]]) -> Counter:
    """CPU seconds between two :func:`~load.e2e.proc_thread_cpu` samples of this process,
    summed by thread name (digits dropped: ``MergeMutate`` for every merge thread); this
    thread is ``main``."""
    me = str(os.getpid())
    total: Counter = Counter()
    for tid, (name, cpu) in after.items():
        key = "main" if tid == me else re.sub(r"\d+$", "", name)
        total[key] += cpu - before.get(tid, (name, 0.0))[1]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000, help="jobs per second (5,000)")
    parser.add_argument("--seconds", type=float, default=50.0)
    parser.add_argument(
        "--batch-ms",
        type=int,
        default=None,
        help="one batch every this long (default: as the sink's settings pick for the rate)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a MergeTree setting for the data tables after they are made (repeatable)",
    )
    args = parser.parse_args()

    if args.batch_ms is None:
        settings = get_settings()
        args.batch_ms = batch_due_ms(  # 5 events a job: what its batch holds at batch_ms
            args.rate * 5 * settings.status_batch_ms // 1000,
            settings.status_batch_ms,
            settings.status_busy_rows,
            settings.status_busy_batch_ms,
        )
    jobs_per_batch = max(1, args.rate * args.batch_ms // 1000)
    batches = max(1, int(args.seconds * 1000 / args.batch_ms))
    with tempfile.TemporaryDirectory(prefix="jobwheel-store-bench-") as tmp:
        store = StatusStore.open(f"chdb://{tmp}", database="jobwheel")
        for assignment in args.set:
            name, _, value = assignment.partition("=")
            for table in TTL_TABLES:
                store.client.command(f"ALTER TABLE {table} MODIFY SETTING {name} = {value}")
        t0 = int(time.time() * 1000)
        rows_of = [
            [
                event_row(e)
                for i in range(b * jobs_per_batch, (b + 1) * jobs_per_batch)
                for e in job_events(i, t0)
                if e.state is not State.HEARTBEAT  # a quick run sends none
            ]
            for b in range(batches)
        ]
        rows = sum(len(r) for r in rows_of)
        before = proc_thread_cpu(os.getpid()) or {}
        started = time.monotonic()
        for n, batch in enumerate(rows_of):
            store.insert_events(batch)
            time.sleep(max(0.0, started + (n + 1) * args.batch_ms / 1000 - time.monotonic()))
        cpu = by_name(before, proc_thread_cpu(os.getpid()) or {})
        parts = store.client.query(
            "SELECT table, count() FROM system.parts WHERE active AND database = currentDatabase() "
            "AND table IN {t:Array(String)} GROUP BY table ORDER BY table",
            parameters={"t": list(TTL_TABLES)},
        ).result_rows
        store.close()
    total = sum(cpu.values())
    merges = cpu["MergeMutate"]
    print(
        f"store: {rows:,} rows ({args.rate:,} jobs/s x 5 rows, a batch of {rows // batches:,} "
        f"every {args.batch_ms} ms, {batches} batches)"
        + (f", settings {', '.join(args.set)}" if args.set else "")
    )
    print(
        f"CPU {total:.2f}s, {total / rows * 1e6:.1f} us per row: merges {merges:.2f}s "
        f"({merges / rows * 1e6:.1f} us per row), the rest {total - merges:.2f}s"
    )
    print("by thread:", ", ".join(f"{k} {v:.2f}s" for k, v in cpu.most_common(6) if v >= 0.01))
    print("active parts at the end:", ", ".join(f"{t} {n}" for t, n in parts))


if __name__ == "__main__":
    main()
