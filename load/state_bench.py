"""Print what the scheduler's job store holds outside its block cache, and what a lookup costs,
as the records pile up (no broker needed).

    .venv/bin/python -m load.state_bench [--records 2000000] [--index-on-heap]

A scheduler keeps a day of job records (``JOBWHEEL_JOB_RETENTION_MS``): at 2,000 jobs/s that is
gigabytes of RocksDB tables. Each open table's index and filter blocks live either in the block
cache (bounded, shared; jobwheel's setting) or on the heap beside it (RocksDB's default, which
grows with the tables): ``--index-on-heap`` measures the default for comparison. Figures: the
table readers' memory outside the cache (RocksDB's ``estimate-table-readers-mem``), the cache's
usage, and the CPU time of a lookup that finds its record and of one that does not (a new
job's id), median of five rounds. Numbers, not assertions: run it on the target box, each mode
in turn.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import rocksdict

from jobwheel.streams.state.rocksdb import RocksDBLimits, RocksDBResources

LOOKUPS = 100_000


def _on_heap(resources: RocksDBResources) -> None:
    """Options as before the index and filter blocks moved into the cache."""
    made = resources.options

    def options(point_lookups: bool = False) -> rocksdict.Options:
        o = made(point_lookups)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(resources.cache)
        if point_lookups:
            table.set_bloom_filter(10, False)
        o.set_block_based_table_factory(table)
        return o

    resources.options = options  # type: ignore[method-assign]


def _per_lookup_us(db: rocksdict.Rdict, keys: list[bytes]) -> float:
    start = time.process_time()
    for key in keys:
        db.get(key)
    return (time.process_time() - start) / len(keys) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--index-on-heap", action="store_true")
    args = parser.parse_args()
    resources = RocksDBLimits().resources()
    if args.index_on_heap:
        _on_heap(resources)
    with tempfile.TemporaryDirectory(prefix="state-bench-") as tmp:
        db = resources.open(Path(tmp) / "jobs")
        value = os.urandom(300)  # about a job record's size
        for i in range(args.records):
            db.put(f"job-{i:012d}".encode(), value)
        db.flush()
        outside = db.property_int_value("rocksdb.estimate-table-readers-mem") or 0
        rng = random.Random(7)
        hits, misses = [], []
        for r in range(5):
            found = [f"job-{rng.randrange(args.records):012d}".encode() for _ in range(LOOKUPS)]
            new = [f"new-{r}-{i:012d}".encode() for i in range(LOOKUPS)]
            hits.append(_per_lookup_us(db, found))
            misses.append(_per_lookup_us(db, new))
        db.close()
    mode = "index and filters on the heap" if args.index_on_heap else "in the block cache"
    print(
        f"{mode}: {args.records:,} records; outside the cache {outside / 2**20:.1f} MiB; "
        f"cache used {resources.cache.get_usage() / 2**20:.1f} MiB; lookup found "
        f"{statistics.median(hits):.2f} us, not found {statistics.median(misses):.2f} us (CPU)"
    )


if __name__ == "__main__":
    main()
