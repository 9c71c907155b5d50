"""Print codec and producer SDK throughput.

    .venv/bin/python -m load.bench_codec [--n 50000]
    .venv/bin/python -m load.bench_codec --bootstrap 127.0.0.1:9092 [--jobs 20000]

Without a broker: encode, decode and encode+decode per second for a ScheduleJob command and a
StatusEvent (single-object framing), with the default codec (its fast path on the C module
``schemas/_flat.c`` where it is built); then the flat fast path alone, per call, on the C and on
the generated Python side by side (the writer, ``FlatRecord.decode`` and ``Codec.decode_fields``
of a Run and a StatusEvent, the nested reader of a command). With ``--bootstrap``: the rate of
``JobClient.schedule`` (one acknowledged round trip per job), ``schedule_many`` (one flush per
batch) and ``AsyncJobClient.schedule`` (many in flight) against that broker, on fresh topics with
a unique prefix. Numbers, not assertions: run it on the target box.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit
import uuid
from collections.abc import Callable
from datetime import timedelta

from jobwheel.schemas import flat
from jobwheel.schemas.codec import Codec, default_codec
from jobwheel.schemas.models import After, JobCommand, Run, ScheduleJob, State, StatusEvent

COMMAND = JobCommand(
    uuid.uuid4().hex,
    uuid.uuid4().hex,
    1_780_000_000_000,
    ScheduleJob("demo.echo", After(5000), '{"x": 1}'),
)
EVENT = StatusEvent(
    "ev-1",
    "job-1",
    State.SUCCEEDED,
    1_780_000_000_000,
    "worker",
    run_id="job-1@1780000000000",
    seq=3,
    attempt=1,
    task="demo.echo",
    worker="host:1234",
    duration_ms=5,
)
RUN = Run(
    "job-1@1780000000000",
    "job-1",
    "demo.echo",
    '{"x": 1}',
    3,
    1_780_000_000_000,
    1_780_000_000_010,
    1,
    3,
    None,
    30_000,
    1_780_000_030_010,
    2,
    7,
)


def rate(n: int, fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def bench_codec(n: int) -> None:
    codec = default_codec()
    built = "C (schemas/_flat.c)" if flat._flat is not None else "generated Python (C not built)"
    print(f"codec fast path: {built}")
    for name, value in (("ScheduleJob command", COMMAND), ("StatusEvent", EVENT)):
        data = codec.encode(value)
        enc = rate(n, lambda v=value: codec.encode(v))
        dec = rate(n, lambda d=data: codec.decode(d))
        both = rate(n, lambda v=value: codec.decode(codec.encode(v)))
        print(
            f"{name:20} {len(data):4d} bytes  encode {enc:>9,.0f}/s  decode {dec:>9,.0f}/s  "
            f"encode+decode {both:>9,.0f}/s"
        )


def per_call(n: int, statement: str, **names: object) -> float:
    """Microseconds per run of ``statement``: the best of three rounds of ``n``."""
    return min(timeit.repeat(statement, globals=names, number=n, repeat=3)) / n * 1e6


def bench_flat(n: int) -> None:
    """The fast path alone, C against the generated Python, on the same records."""
    codecs = {"C": Codec(), "Python": Codec(native=False)}
    if flat._flat is None:
        del codecs["C"]
    print(f"\nflat records alone, per call   {'   '.join(f'{k:>8}' for k in codecs)}   Python/C")
    for name, value in (("Run", RUN), ("StatusEvent", EVENT), ("JobCommand", COMMAND)):
        data = codecs["Python"].encode(value)
        rows: dict[str, list[float]] = {}
        for codec in codecs.values():
            reader = codec._readers[data[2:10]]
            write = codec._writers[type(value)].write
            if write is not None:
                head = data[:10]
                rows.setdefault("write", []).append(
                    per_call(n, "w(v, h)", w=write, v=value, h=head)
                )
            fast = reader.fast if reader.flat is None else reader.flat
            if fast is not None:
                label = "decode" if reader.flat is not None else "decode (nested)"
                us = per_call(n, "d(b, 10)", d=fast.decode, b=data)
                rows.setdefault(label, []).append(us)
            if reader.flat is not None:
                us = per_call(n, "f(b)", f=codec.decode_fields, b=data)
                rows.setdefault("decode_fields", []).append(us)
        for what, times in rows.items():
            cells = "   ".join(f"{t:>5.2f} us" for t in times)
            ratio = f"{times[1] / times[0]:>7.1f}x" if len(times) == 2 else ""
            print(f"  {name:12} {what:16} {cells}   {ratio}")


def bench_producer(bootstrap: str, jobs: int) -> None:
    from jobwheel.kafka.admin import ensure_topics
    from jobwheel.producers.client import AsyncJobClient, JobClient, JobSpec
    from jobwheel.settings import Settings

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=bootstrap,
        topic_prefix=f"bench{uuid.uuid4().hex[:8]}",
        partitions=4,
    )
    ensure_topics(settings)
    with JobClient(settings) as client:
        single = min(jobs, 500)
        start = time.perf_counter()
        for _ in range(single):
            client.schedule(task="demo.echo", in_=timedelta(hours=1))
        print(f"JobClient.schedule        {single / (time.perf_counter() - start):>9,.0f} jobs/s")
        specs = [JobSpec(task="demo.echo", in_=timedelta(hours=1)) for _ in range(jobs)]
        start = time.perf_counter()
        for i in range(0, jobs, 1000):
            client.schedule_many(specs[i : i + 1000])
        print(f"JobClient.schedule_many   {jobs / (time.perf_counter() - start):>9,.0f} jobs/s")

    async def many() -> float:
        async with AsyncJobClient(settings) as client:
            start = time.perf_counter()
            for i in range(0, jobs, 1000):
                await asyncio.gather(
                    *(
                        client.schedule(task="demo.echo", in_=timedelta(hours=1))
                        for _ in range(min(1000, jobs - i))
                    )
                )
            return jobs / (time.perf_counter() - start)

    print(f"AsyncJobClient.schedule   {asyncio.run(many()):>9,.0f} jobs/s (1000 in flight)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=50_000, help="codec iterations")
    parser.add_argument("--bootstrap", help="also measure the producer against this broker")
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    bench_codec(args.n)
    bench_flat(args.n)
    if args.bootstrap:
        bench_producer(args.bootstrap, args.jobs)


if __name__ == "__main__":
    main()
