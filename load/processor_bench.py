"""Print the scheduler's CPU per job without Kafka: the pure processor, its state and the codec.

    .venv/bin/python -m load.processor_bench [--jobs 4000] [--rounds 5] [--memory]
                                             [--commit-every N]

One partition's life of ``--jobs`` one-off jobs, as the engine drives it: decode each command
and apply it (its SCHEDULED event encoded), commit the state; punctuate until every job has
fired (each run and DISPATCHED event encoded), commit; decode a SUCCEEDED acknowledgement per
run and apply it (the COMPLETED event encoded), commit. State in real RocksDB in a temp dir
(``--memory``: in dicts). ``--commit-every N`` commits after every N commands, fires or
acknowledgements, as the engine's transactions do (about 25 jobs each at 1,000 jobs/s), instead
of once per phase; the time spent committing the state is printed on its own. The garbage
collector is tuned as the services tune it (``jobwheel.cli``). Each phase's figure is the best
of ``--rounds`` (fresh state each round), in microseconds of process CPU per job, so it says
what the Python costs, not what the broker or the other processes do; ``load.e2e`` measures
those. Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobwheel.cli import GC_YOUNG_THRESHOLD
from jobwheel.producers.spec import JobSpec, build_schedule
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import Run, State, StatusEvent
from jobwheel.streams.processor import SchedulerProcessor
from jobwheel.streams.state.partition import MemoryBackend, PartitionState, RocksDBBackend
from jobwheel.streams.state.rocksdb import RocksDBLimits

CODEC = default_codec(None)


def commands(jobs: int, now_ms: int) -> list[bytes]:
    """Encoded commands of one-off jobs due over the 10 s after ``now_ms`` + 5 s (as
    ``load.e2e`` submits them)."""
    out = []
    for i in range(jobs):
        due = now_ms + 5000 + i * 10_000 // jobs
        spec = JobSpec(
            task="load.noop",
            job_id=f"e2e-{i}",
            args={"out": "/tmp/starts"},
            at=datetime.fromtimestamp(due / 1000, UTC),
            visibility_timeout=timedelta(seconds=30),
        )
        out.append(CODEC.encode(build_schedule(spec, now_ms=now_ms, max_args_bytes=65536)))
    return out


def one_round(
    raw: list[bytes], now_ms: int, memory: bool, commit_every: int = 0
) -> dict[str, float]:
    backend: Any = MemoryBackend()
    if not memory:
        path = Path(tempfile.mkdtemp(prefix="processor-bench-"))
        backend = RocksDBBackend(path, RocksDBLimits().resources())
    state = PartitionState(backend)
    proc = SchedulerProcessor(0, state, fencing_token=1)
    encode, decode = CODEC.encode, CODEC.decode
    fire_at = now_ms + 20_000
    runs: list[Run] = []
    spent: dict[str, float] = {}

    done = 0  # changes since the last commit
    checkpoint = 0

    def commit() -> None:
        nonlocal done, checkpoint
        began = time.process_time()
        checkpoint += done + 1
        state.commit(checkpoint)
        spent["commit"] = spent.get("commit", 0.0) + time.process_time() - began
        done = 0

    def changed(n: int = 1) -> None:
        nonlocal done
        done += n
        if commit_every and done >= commit_every:
            commit()

    def phase(name: str, work: Callable[[], None]) -> None:
        began = time.process_time()
        work()
        commit()
        spent[name] = time.process_time() - began

    def submit() -> None:
        for data in raw:
            for event in proc.on_command(decode(data), now_ms).status:
                encode(event)
            changed()

    def fire() -> None:
        while True:
            out, handled = proc.punctuate(fire_at, commit_every or 1000, fire_at, 20_000)
            for run in out.runs:
                runs.append(run)
                encode(run)
            for event in out.status:
                encode(event)
            changed(len(out.runs))
            if not handled:
                return

    acks: list[bytes] = []

    def acknowledge() -> None:
        for ack in acks:
            for event in proc.on_ack(decode(ack), fire_at, fire_at).status:
                encode(event)
            changed()

    phase("submit", submit)
    phase("fire", fire)
    acks.extend(  # the workers' verdicts (their cost is not the scheduler's)
        encode(
            StatusEvent(
                f"{run.run_id}:1:SUCCEEDED",
                run.job_id,
                State.SUCCEEDED,
                fire_at,
                "worker",
                run.run_id,
                seq=run.seq + 1,
                attempt=1,
                scheduled_time_ms=run.scheduled_time_ms,
            )
        )
        for run in runs
    )
    phase("ack", acknowledge)
    backend.close()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory", action="store_true", help="state in dicts, not RocksDB")
    parser.add_argument(
        "--commit-every", type=int, default=0, help="commit every N changes (0: once a phase)"
    )
    args = parser.parse_args()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    now_ms = int(time.time() * 1000)
    raw = commands(args.jobs, now_ms)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, seconds in one_round(raw, now_ms, args.memory, args.commit_every).items():
            best[name] = min(best.get(name, seconds), seconds)
    per_job = {name: seconds / args.jobs * 1e6 for name, seconds in best.items()}
    store = "memory" if args.memory else "RocksDB"
    committing = per_job.pop("commit")
    commits = f"every {args.commit_every} changes" if args.commit_every else "once a phase"
    print(
        f"processor, {args.jobs} jobs on one partition ({store}, commits {commits}), best of "
        f"{args.rounds}: {sum(per_job.values()):.1f} us of CPU per job ("
        + ", ".join(f"{name} {us:.1f}" for name, us in per_job.items())
        + f"), of which committing the state {committing:.1f}"
    )


if __name__ == "__main__":
    main()
