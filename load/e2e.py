"""End-to-end load generator: SDK submit -> scheduler -> worker -> task body, on real processes.

    python -m load.e2e --rate 1000 --window 10                  # 10,000 jobs due over 10 s
    python -m load.e2e --rate 500 --scan                        # double until it breaks
    python -m load.e2e --schedulers 2 --workers 2 --partitions 8
    python -m load.e2e --cluster                                # on a local 3-node cluster
    python -m load.e2e --queues 2 --workers 2                   # two pools, a worker each

Starts its own Kafka broker on free ports (``--cluster N``: a local KRaft cluster of N nodes,
whose topics ``topics ensure`` makes with replication factor min(3, N) and min ISR 2 from 3
nodes; or uses ``--bootstrap``), fresh topics, then the
services as the CLI starts them: ``--schedulers`` x ``jobwheel scheduler``, ``--workers`` x
``jobwheel worker --tasks load.tasks`` and one ``jobwheel sink`` (embedded store). Readiness is
a probe job per partition run end to end (never a log line): every partition has a scheduler
and a worker, and the sink has stored the probes' events. Then N one-off ``load.noop`` jobs,
due uniformly over ``--window`` seconds from ``--lead`` seconds on (``--rate`` per second), go
out through the SDK in one burst. The task notes its start (``load/tasks.py``).

It reports submitted/s; fired/s and fire lateness (when a ``read_committed`` consumer, as a
worker, first sees the run, minus its scheduled time); started/s and start lateness (the task's
start minus the scheduled time); lost jobs (no start at the end: must be 0); duplicate
executions (starts beyond the first of a run id); CPU seconds per job of each kind of process
(scheduler, worker, sink, broker: every node of a cluster summed; from /proc, counted until
the sink has stored every
status event, and how long after the last start that was) and peak RSS; and the schedulers'
transactions from the first due time on, from their metrics: how many, and the mean milliseconds
each spent open (its work waiting for the commit), producing, adding offsets, ending and
writing the local state, which is where a due run waits before a worker can see it.
``--queues N`` spreads
the jobs over N worker pools (the queues ``default``, ``q2`` .. ``qN``, each its runs topic and
group; worker ``i`` serves queue ``i mod N``), to measure what pools cost per job. It writes
``result.json`` and, with matplotlib installed (``pip install -e '.[bench]'``),
``result.png`` (lateness and throughput over time) to ``--out``. ``--scan`` doubles the rate
until p99 start lateness passes 2 s or a job is lost, and reports the highest passing rate.

No assertions: it prints numbers. Everything shares this machine, so compare runs with each
other, not with a cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobwheel.schemas.topics import DEFAULT_PARTITIONS
from jobwheel.settings import Settings
from load import records

PASS_P99_MS = 2000
#: A warm-up round in which the broker's JIT compiler used less CPU than this ends the warm-up.
WARM_JIT_S = 0.3


# --- the counting (pure) --------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """One execution of the task, as ``load.tasks`` noted it."""

    run_id: str
    attempt: int
    scheduled_ms: int
    start_ms: float
    pid: int

    @property
    def job_id(self) -> str:
        return self.run_id.rsplit("@", 1)[0]


@dataclass(frozen=True)
class Fire:
    """A run record as a worker would first see it."""

    run_id: str
    attempt: int
    scheduled_ms: int
    seen_ms: float


def parse_starts(text: str) -> list[Start]:
    """Lines of ``run_id attempt scheduled_ms start_ns pid``; a torn last line is skipped."""
    out: list[Start] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue
        try:
            out.append(
                Start(parts[0], int(parts[1]), int(parts[2]), int(parts[3]) / 1e6, int(parts[4]))
            )
        except ValueError:
            continue
    return out


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99/max (nearest rank), None when there is nothing to rank."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[-1]}


@dataclass
class Tally:
    """What happened to the submitted jobs."""

    jobs: int
    started_jobs: int
    lost: list[str]
    executions: int
    duplicates: int
    duplicated_runs: list[str]
    fired_runs: int
    start_lateness_ms: dict[str, float | None]
    fire_lateness_ms: dict[str, float | None]
    fired_per_s: float | None
    started_per_s: float | None


def tally(expected: dict[str, int], fires: Sequence[Fire], starts: Sequence[Start]) -> Tally:
    """Count against ``expected`` (job id -> scheduled ms); anything else (probes) is ignored.

    A job is lost when none of its runs started. Every start of a run id after its first is a
    duplicate execution (a redelivery, a re-dispatched attempt). Lateness uses the first fire
    and the first start of each run; rates span the first to the last of them.
    """
    ours = [s for s in starts if s.job_id in expected]
    first_start: dict[str, Start] = {}
    for s in sorted(ours, key=lambda s: s.start_ms):
        first_start.setdefault(s.run_id, s)
    started_jobs = {s.job_id for s in first_start.values()}
    per_run = Counter(s.run_id for s in ours)
    first_fire: dict[str, Fire] = {}
    for f in sorted(fires, key=lambda f: f.seen_ms):
        if f.run_id.rsplit("@", 1)[0] in expected:
            first_fire.setdefault(f.run_id, f)
    start_late = [s.start_ms - s.scheduled_ms for s in first_start.values()]
    fire_late = [f.seen_ms - f.scheduled_ms for f in first_fire.values()]
    return Tally(
        jobs=len(expected),
        started_jobs=len(started_jobs),
        lost=sorted(set(expected) - started_jobs),
        executions=len(ours),
        duplicates=len(ours) - len(per_run),
        duplicated_runs=sorted(r for r, n in per_run.items() if n > 1),
        fired_runs=len(first_fire),
        start_lateness_ms=percentiles(start_late),
        fire_lateness_ms=percentiles(fire_late),
        fired_per_s=_rate([f.seen_ms for f in first_fire.values()]),
        started_per_s=_rate([s.start_ms for s in first_start.values()]),
    )


def _rate(times_ms: Sequence[float]) -> float | None:
    if len(times_ms) < 2:
        return None
    span_s = (max(times_ms) - min(times_ms)) / 1000
    return len(times_ms) / span_s if span_s > 0 else None


# --- processes ----------------------------------------------------------------------------


def _stat_cpu_s(stat: str) -> float:
    """User + system CPU seconds from the text of a /proc ``stat`` file (process or thread)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (/proc), None when it is gone."""
    try:
        return _stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None


def proc_thread_cpu(pid: int) -> dict[str, tuple[str, float]] | None:
    """``thread id -> (thread name, CPU seconds so far)`` of every thread of ``pid`` (/proc),
    None when it is gone; a thread that ends while this reads is left out."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        out[tid] = (stat[stat.index("(") + 1 : stat.rindex(")")], _stat_cpu_s(stat))
    return out


#: Thread families, by the first match on the /proc thread name (``comm``, at most 15
#: characters). Python names no OS thread, so a service's Python threads (its main thread,
#: the worker's consumer and delivery threads, the sink's consumer thread) are ``python``.
#: The embedded ClickHouse engine renames the thread it runs an insert on ("Unknown"), so
#: the sink's inserter thread, its column encoding included, is ``native`` with the engine's
#: own threads (merges, pools), as is any thread of a JVM no other family takes.
THREAD_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("python", ("python",)),
    ("librdkafka", ("rdk:",)),
    ("rocksdb", ("rocksdb:",)),
    ("jit", ("C1 CompilerThre", "C2 CompilerThre")),
    ("gc", ("GC Thread", "G1 ", "VM Thread")),
    ("requests", ("data-plane-kafk",)),
)


def thread_family(name: str) -> str:
    """The family of a thread named ``name`` (:data:`THREAD_FAMILIES`, else ``native``)."""
    for family, prefixes in THREAD_FAMILIES:
        if name.startswith(prefixes):
            return family
    return "native"


def proc_family_cpu(pid: int) -> dict[str, tuple[str, float]] | None:
    """``thread id -> (family, CPU seconds so far)`` of every thread of ``pid``; None when it
    is gone. Compare two samples with :func:`family_cpu_s`."""
    threads = proc_thread_cpu(pid)
    if threads is None:
        return None
    return {tid: (thread_family(name), cpu) for tid, (name, cpu) in threads.items()}


def family_cpu_s(
    before: dict[str, tuple[str, float]] | None, after: dict[str, tuple[str, float]] | None
) -> dict[str, float] | None:
    """CPU seconds by thread family between two :func:`proc_family_cpu` samples, thread by
    thread (as :func:`jit_cpu_s`, and short the same way by what ended threads did)."""
    if before is None or after is None:
        return None
    out: dict[str, float] = {}
    for tid, (family, cpu) in after.items():
        out[family] = out.get(family, 0.0) + cpu - before.get(tid, ("", 0.0))[1]
    return out


def proc_jit_cpu(pid: int) -> dict[str, float] | None:
    """CPU seconds so far of each of the JVM ``pid``'s JIT compiler threads (C1, C2), by
    thread id; None when the process is gone. Compare two samples with :func:`jit_cpu_s`."""
    threads = proc_family_cpu(pid)
    if threads is None:
        return None
    return {tid: cpu for tid, (family, cpu) in threads.items() if family == "jit"}


def brokers_jit_cpu(services: Sequence[Service]) -> dict[str, float] | None:
    """:func:`proc_jit_cpu` of every broker JVM of the run (each node of a cluster), keyed by
    pid and thread; None without a broker of ours, or when one is gone."""
    brokers = [s for s in services if s.role == "broker"]
    samples: dict[str, float] = {}
    for broker in brokers:
        jit = proc_jit_cpu(broker.pid)
        if jit is None:
            return None
        samples.update({f"{broker.pid}/{tid}": cpu for tid, cpu in jit.items()})
    return samples if brokers else None


def jit_cpu_s(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """JIT compiler CPU between two :func:`proc_jit_cpu` samples, thread by thread.

    The JVM starts and stops compiler threads as the work comes and goes, and a thread that
    ends takes its CPU time out of ``/proc``: a sum over the live threads fell between two
    samples (the report printed -0.3 s), and a warm-up round that looked quiet that way
    ended the warm-up early. Counted per thread, a thread started in between counts from
    zero and one that ended counts nothing after ``before``: never negative, at worst short
    by what ended threads did since ``before``."""
    if before is None or after is None:
        return None
    return sum(cpu - before.get(tid, 0.0) for tid, cpu in after.items())


def scheduler_transactions(url: str | None) -> dict[str, float] | None:
    """A scheduler's committed transactions (``count``) and the seconds they spent in each
    phase (:data:`jobwheel.streams.metrics.TRANSACTION_PHASES`: where a due run waits before a
    worker can see it, which is after ``end``), read from its metrics; None when it cannot be
    read."""
    if url is None:
        return None
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from jobwheel.streams.metrics import TRANSACTION_PHASE_SECONDS, TRANSACTIONS_TOTAL

    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == TRANSACTIONS_TOTAL:
                out["count"] = sample.value
            elif sample.name == TRANSACTION_PHASE_SECONDS:
                out[sample.labels["phase"]] = sample.value
    return out if "count" in out else None


def transactions_delta(
    samples: Sequence[tuple[dict[str, float] | None, dict[str, float] | None]],
) -> dict[str, Any] | None:
    """The schedulers' transactions between two samples each: how many, and each phase's
    milliseconds per transaction; None when a sample is missing or none committed."""
    count = 0.0
    spent: dict[str, float] = {}
    for before, after in samples:
        if before is None or after is None:
            return None
        count += after["count"] - before["count"]
        for phase, seconds in after.items():
            if phase != "count":
                spent[phase] = spent.get(phase, 0.0) + seconds - before.get(phase, 0.0)
    if count <= 0:
        return None
    return {
        "count": int(count),
        "ms_each": {phase: seconds * 1000 / count for phase, seconds in spent.items()},
    }


def proc_peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of ``pid`` in MiB, None when it is gone."""
    return _proc_status_mib(pid, "VmHWM")


def proc_rss_mib(pid: int) -> float | None:
    """Resident memory now (VmRSS) of ``pid`` in MiB, None when it is gone."""
    return _proc_status_mib(pid, "VmRSS")


def _proc_status_mib(pid: int, key: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


@dataclass
class Service:
    role: str  # scheduler, worker, sink, broker
    pid: int
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    cpu_start: float | None = None
    families_start: dict[str, tuple[str, float]] | None = None
    #: a scheduler's metrics (its transactions' time by phase), and their first sample
    metrics_url: str | None = None
    transactions_start: dict[str, float] | None = None


def service_env(
    settings: Settings, data_dir: Path, log_level: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """os.environ without JOBWHEEL_*, plus what reproduces ``settings`` in a subprocess and the
    ``--set`` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env.update(
        JOBWHEEL_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        JOBWHEEL_KAFKA_CONFIG=json.dumps(settings.kafka_config),
        JOBWHEEL_TOPIC_PREFIX=settings.topic_prefix,
        JOBWHEEL_PARTITIONS=str(settings.partitions),
        JOBWHEEL_SCHEDULER_APP_ID=settings.scheduler_app_id,
        JOBWHEEL_WORKER_GROUP=settings.worker_group,
        JOBWHEEL_STATUS_GROUP=settings.status_group,
        JOBWHEEL_QUEUES=settings.queues,
        JOBWHEEL_DATA_DIR=str(data_dir),
        JOBWHEEL_LOG_LEVEL=log_level,
        JOBWHEEL_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def spawn(role: str, args: list[str], env: dict[str, str], log: Path) -> Service:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobwheel.cli", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Service(role, proc.pid, proc, log)


def stop_services(services: Sequence[Service], timeout_s: float = 30.0) -> None:
    for s in services:
        if s.proc is not None and s.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for s in services:
        if s.proc is None:
            continue
        try:
            s.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait()


# --- one run ------------------------------------------------------------------------------


@dataclass
class Config:
    rate: float = 1000.0
    window_s: float = 10.0
    lead_s: float = 5.0
    schedulers: int = 1
    workers: int = 1
    #: worker pools: queue ``i mod queues`` gets job ``i`` and worker ``i``
    queues: int = 1
    partitions: int = DEFAULT_PARTITIONS
    concurrency: int | None = None
    settle_s: float = 2.0
    timeout_s: float = 120.0
    #: one-off jobs run through every process before the measured ones (0: none); see warm_up
    warmup_jobs: int = 10_000
    warmup_rate: float = 2_000.0
    warmup_rounds: int = 3
    log_level: str = "INFO"
    #: JOBWHEEL_* settings given to every service (``--set``)
    service_settings: dict[str, str] = field(default_factory=dict)
    # Test hooks: make the counting find a lost job and a duplicate execution on purpose.
    sabotage_lose: int = 0  # this many jobs are expected but never submitted
    sabotage_duplicate: int = 0  # this many fired runs are dispatched again (attempt 2)

    @property
    def jobs(self) -> int:
        return max(1, round(self.rate * self.window_s))

    @property
    def queue_names(self) -> list[str]:
        """The pools' queues: ``default``, then ``q2`` .. ``qN``."""
        return ["default", *(f"q{i}" for i in range(2, self.queues + 1))]

    def queue_of(self, i: int) -> str:
        return self.queue_names[i % self.queues]


@dataclass
class Result:
    config: dict[str, Any]
    submitted: int
    submit_s: float
    submitted_per_s: float
    tally: dict[str, Any]
    cpu_s_per_job: dict[str, float | None]
    cpu_s: dict[str, float | None]
    peak_rss_mib: dict[str, list[float | None]]
    passed: bool
    #: seconds from the last task start until the sink had stored every status event (None:
    #: not within the timeout; ``status_behind`` records were still unstored)
    status_stored_s: float | None = None
    status_behind: int | None = None
    timeline: dict[str, Any] = field(default_factory=dict)
    #: CPU seconds the broker's JIT compiler threads used in the measured span (part of the
    #: broker's figure; a long-running broker has compiled its hot paths long before)
    broker_jit_s: float | None = None
    #: CPU seconds this process used watching the run (reading the start notes and the runs
    #: reader's thread), from the end of the submit to the last start: taken from the same
    #: cores as the pipeline, so it must stay small.
    watch_cpu_s: float | None = None
    #: brokers, replication factor and min.insync.replicas of the run's requests topic
    replication: dict[str, int] = field(default_factory=dict)
    #: records and bytes per job by topic and by process (:func:`load.records.account`)
    records: dict[str, Any] = field(default_factory=dict)
    #: CPU seconds per job of each kind of process by thread family (:func:`thread_family`):
    #: which part of a process the figure in ``cpu_s_per_job`` is spent in
    cpu_s_per_job_by_family: dict[str, dict[str, float]] = field(default_factory=dict)
    #: threads of each kind of process alive at the end, whose CPU the by-family figures add
    #: up: /proc counts each thread's time in whole clock ticks, so on a short run those
    #: figures can be off by up to a tick per thread (a process's own figure is not)
    threads: dict[str, int] = field(default_factory=dict)
    #: the schedulers' transactions from the first due time to the end of the run
    #: (:func:`transactions_delta`): how long a due run waits in the scheduler, part by part
    transactions: dict[str, Any] | None = None


def topics_replication(settings: Settings) -> dict[str, int]:
    """What the run's topics got from ``topics ensure``: the brokers it saw, the replication
    factor and min.insync.replicas of the requests topic (all jobwheel topics get the same)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(settings.librdkafka())
    topic = settings.topics.requests
    md = admin.list_topics(topic, timeout=30)
    factor = min(len(p.replicas) for p in md.topics[topic].partitions.values())
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    return {
        "brokers": len(md.brokers),
        "replication_factor": factor,
        "min_insync_replicas": int(configs["min.insync.replicas"].value),
    }


class Progress:
    """A one-line progress bar on stderr (a line every few seconds when not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def show(self, fired: int, started: int, elapsed_s: float, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < (0.25 if self.tty else 5.0):
            return
        self._last = now
        width = 30
        done = int(width * started / max(1, self.total))
        bar = "#" * done + "." * (width - done)
        line = (
            f"[{bar}] fired {fired:,}/{self.total:,}  started {started:,}/{self.total:,}  "
            f"+{elapsed_s:.1f}s"
        )
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


class RunsReader:
    """Reads the runs topic (read_committed, as a worker) in a thread: first sight of each
    run. Also produces copies of fired runs on request (the duplicate sabotage).

    A record is kept as it came, with when it was seen, and decoded only when :meth:`fires`
    is asked for (after the run): decoding 50,000 runs as they came cost the generator half a
    second of CPU on the cores the pipeline was using. While the run goes on, only the keys
    (job ids) of the measured jobs' runs are counted, for the progress bar."""

    def __init__(self, settings: Settings, duplicate: int = 0) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from jobwheel.schemas.codec import default_codec

        self.settings = settings
        #: Job ids (record keys) of the ``e2e-`` jobs whose runs have been seen.
        self.fired_jobs: set[bytes] = set()
        self._seen: list[tuple[bytes, float]] = []
        self.duplicated: list[str] = []
        self._duplicate = duplicate
        self._codec = default_codec()
        self._stop = threading.Event()
        self._consumer = Consumer(
            settings.librdkafka(
                **{
                    "group.id": f"e2e-reader-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 10,
                }
            )
        )
        self._consumer.assign(
            [
                TopicPartition(settings.topics.runs_for(queue), p, OFFSET_BEGINNING)
                for queue in settings.queue_names
                for p in range(settings.partitions)
            ]
        )
        self._thread = threading.Thread(target=self._loop, name="e2e-runs-reader", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            # What is there now, else wait for one record only: a batch call would hold the
            # first records back until the batch filled, and that would count as lateness.
            messages = self._consumer.consume(1000, 0)
            if not messages:
                messages = self._consumer.consume(1, 0.1)
                if messages:
                    messages += self._consumer.consume(999, 0)
            seen_ms = time.time() * 1000
            for msg in messages:
                value = msg.value()
                if msg.error() or value is None:
                    continue
                self._seen.append((value, seen_ms))
                key = msg.key()
                if key is not None and key.startswith(b"e2e-"):
                    self.fired_jobs.add(key)
                if self._duplicate:
                    run = self._run(value)
                    if run is not None and run.job_id.startswith("e2e-") and run.attempt == 1:
                        self._duplicate -= 1
                        self._produce_again(key, run)
                        self.duplicated.append(run.run_id)

    def _run(self, value: bytes) -> Any:
        from jobwheel.schemas.models import Run

        try:
            run = self._codec.decode(value)
        except Exception:  # not a Run (not ours to judge here)
            return None
        return run if isinstance(run, Run) else None

    def fires(self) -> list[Fire]:
        """Every run seen so far, decoded (see the class doc), in the order seen."""
        out = []
        for value, seen_ms in self._seen[:]:  # the reader thread only appends
            run = self._run(value)
            if run is not None:
                out.append(Fire(run.run_id, run.attempt, run.scheduled_time_ms, seen_ms))
        return out

    def _produce_again(self, key: bytes, run: Any) -> None:
        """The run once more as attempt 2, as the scheduler re-dispatches a run whose verdict
        did not arrive in time: the worker executes it again."""
        import dataclasses

        from confluent_kafka import Producer

        from jobwheel.kafka.producer import producer_config

        value = self._codec.encode(dataclasses.replace(run, attempt=run.attempt + 1))

        producer = Producer(
            producer_config(self.settings, **{"transactional.id": f"e2e-{uuid.uuid4().hex}"})
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(self.settings.topics.runs, key=key, value=value)
        producer.commit_transaction(30)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def read_starts(directory: Path) -> list[Start]:
    """Every start noted in ``directory`` so far, in one read (the loop that watches a run
    keeps a :class:`StartsTail`)."""
    return StartsTail(directory).read()


class StartsTail:
    """The starts noted in a directory, read as they are appended: each :meth:`read` parses
    only the complete lines written since the one before.

    Why: the generator shares the machine with what it measures. Reading every file whole
    five times a second, as the watch loop did, parsed all the starts so far each time:
    measured, 200 ms of CPU per read at 50,000 starts, about a third of a core over a
    5,000/s run, taken from the pipeline on a two-core machine.
    """

    def __init__(self, directory: Path, keep: bool = True) -> None:
        """``keep`` False: :attr:`starts` stays empty (a soak of hours would hold millions)."""
        self.directory = directory
        self.keep = keep
        self.starts: list[Start] = []
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[Start]:
        """The starts appended since the last call (also added to :attr:`starts` if kept)."""
        new: list[Start] = []
        for path in sorted(self.directory.glob("starts-*.txt")):
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
            if end:
                self._offsets[path] = offset + end
                new += parse_starts(data[:end].decode())
        if self.keep:
            self.starts += new
        return new


def jobs_per_partition(settings: Settings, prefix: str) -> list[str]:
    """One job id per partition (the readiness probes)."""
    from jobwheel.schemas.partitioning import partition_for

    found: dict[int, str] = {}
    i = 0
    while len(found) < settings.partitions:
        job_id = f"{prefix}-{i}"
        found.setdefault(partition_for(job_id, settings.partitions), job_id)
        i += 1
    return [found[p] for p in sorted(found)]


def group_members(admin: Any, group: str) -> int:
    try:
        description = admin.describe_consumer_groups([group])[group].result(timeout=10)
    except Exception:
        return 0
    return len(description.members)


def sink_progress(settings: Settings) -> tuple[int, int] | None:
    """The status group's committed offsets on the status and acks topics, summed, and the
    records it has not committed (stored) yet; None when the broker does not answer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.librdkafka(**{"group.id": settings.status_group}))
    try:
        tps = [
            TopicPartition(topic, p)
            for topic in (settings.topics.status, settings.topics.acks)
            for p in range(settings.partitions)
        ]
        done = behind = 0
        for tp in consumer.committed(tps, timeout=10):
            _, high = consumer.get_watermark_offsets(tp, timeout=10)
            # The scheduler writes status in transactions: the commit marker after a
            # partition's last record takes an offset no consumer ever commits past.
            marker = 1 if tp.topic == settings.topics.status else 0
            done += max(tp.offset, 0)
            behind += max(0, high - max(tp.offset, 0) - marker)
        return done, behind
    except Exception:
        return None
    finally:
        consumer.close()


def wait_for(predicate: Any, timeout_s: float, what: str, services: Sequence[Service]) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        for s in services:
            if s.proc is not None and s.proc.poll() is not None:
                raise RuntimeError(
                    f"{s.role} (pid {s.pid}) exited while waiting for {what}; {s.log}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


def wait_for_groups(settings: Settings, config: Config, services: Sequence[Service]) -> None:
    """Every scheduler and worker process in its group (the broker's view). The admin client is
    destroyed when this returns, while the broker is up: librdkafka's destroy of a client whose
    broker is gone can wait forever (seen: the generator hung at the end of a run)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.librdkafka())
    for q, queue in enumerate(config.queue_names):
        pool = len(range(q, config.workers, config.queues))  # the workers serving it
        group = settings.worker_group_for(queue)
        wait_for(
            lambda a=admin, g=group, n=pool: group_members(a, g) >= n,
            120,
            f"the workers of the queue {queue} to join their group",
            services,
        )
    wait_for(
        lambda a=admin: group_members(a, settings.scheduler_app_id) >= config.schedulers,
        120,
        "the schedulers to join their group",
        services,
    )
    del admin


@dataclass
class Pipeline:
    """The processes of one run on fresh topics: what :func:`start_pipeline` started."""

    settings: Settings
    services: list[Service]
    run_dir: Path


def start_pipeline(
    config: Config,
    bootstrap: str,
    out_dir: Path,
    broker_pids: Sequence[int] = (),
    stem: str = "e2e",
) -> Pipeline:
    """Fresh topics (prefix ``stem`` + a random part) and the services on them, as the CLI
    starts them: ``config.schedulers`` schedulers, ``config.workers`` workers running
    ``load.tasks``, one sink (embedded store); the brokers of ``broker_pids`` are watched
    with them. Logs and state go to ``out_dir/<prefix>``."""
    from jobwheel.kafka.admin import ensure_topics

    prefix = f"{stem}{uuid.uuid4().hex[:8]}"
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        partitions=config.partitions,
        scheduler_app_id=f"{prefix}-scheduler",
        worker_group=f"{prefix}-workers",
        status_group=f"{prefix}-status",
        queues=",".join(config.queue_names[1:]),
    )
    ensure_topics(settings)
    run_dir = out_dir / prefix
    run_dir.mkdir(parents=True)

    services: list[Service] = []
    for i in range(config.schedulers):
        env = service_env(
            settings, run_dir / f"scheduler-{i}", config.log_level, config.service_settings
        )
        url = None
        if "JOBWHEEL_METRICS_PORT" not in env:  # (one given with --set is every service's)
            from jobwheel.deploy.broker import free_port

            port = free_port()
            env["JOBWHEEL_METRICS_PORT"] = str(port)
            url = f"http://127.0.0.1:{port}/metrics"
        service = spawn("scheduler", ["scheduler"], env, run_dir / f"scheduler-{i}.log")
        service.metrics_url = url
        services.append(service)
    worker_args = ["worker", "--tasks", "load.tasks"]
    if config.concurrency:
        worker_args += ["--concurrency", str(config.concurrency)]
    for i in range(config.workers):
        env = service_env(
            settings, run_dir / f"worker-{i}", config.log_level, config.service_settings
        )
        args = [*worker_args, "--queue", config.queue_of(i)]
        services.append(spawn("worker", args, env, run_dir / f"worker-{i}.log"))
    env = service_env(settings, run_dir / "sink", config.log_level, config.service_settings)
    services.append(spawn("sink", ["sink"], env, run_dir / "sink.log"))
    services += [Service("broker", pid) for pid in broker_pids]
    # The generator's own clients log warnings only (librdkafka's informational lines about
    # closing clients are noise next to the progress bar).
    quiet = settings.model_copy(update={"kafka_config": {**settings.kafka_config, "log_level": 4}})
    return Pipeline(quiet, services, run_dir)


def wait_ready(
    config: Config, settings: Settings, services: Sequence[Service], probe_dir: Path
) -> None:
    """Every process in its group, a probe job per partition run end to end, the sink
    storing: readiness by what the pipeline does, never by a log line."""
    from jobwheel.producers.client import JobClient, JobSpec

    probe_dir.mkdir(parents=True, exist_ok=True)
    wait_for_groups(settings, config, services)
    probes = {
        job_id: queue
        for queue in config.queue_names
        for job_id in jobs_per_partition(settings, f"probe-{queue}")
    }
    with JobClient(settings) as client:
        client.schedule_many(
            [
                JobSpec(task="load.noop", job_id=j, args={"out": str(probe_dir)}, now=True, queue=q)
                for j, q in probes.items()
            ]
        )
    wait_for(
        lambda: {s.job_id for s in read_starts(probe_dir)} >= set(probes),
        180,
        "a probe job on every partition to run end to end",
        services,
    )
    wait_for(
        lambda: (sink_progress(settings) or (0, 0))[0] > 0,
        120,
        "the sink to store events",
        services,
    )


def run_once(
    config: Config, bootstrap: str, out_dir: Path, broker_pids: Sequence[int] = ()
) -> Result:
    """One load run on fresh topics and fresh processes; see the module doc."""
    pipeline = start_pipeline(config, bootstrap, out_dir, broker_pids)
    settings, services = pipeline.settings, pipeline.services
    replication = topics_replication(settings)
    starts_dir = pipeline.run_dir / "starts"
    probe_dir = pipeline.run_dir / "probe"
    starts_dir.mkdir(parents=True)
    reader = RunsReader(settings, duplicate=config.sabotage_duplicate)
    try:
        result = _drive(config, settings, services, reader, starts_dir, probe_dir)
        result.replication = replication
        return result
    finally:
        reader.close()
        stop_services(services)


def _drive(
    config: Config,
    settings: Settings,
    services: list[Service],
    reader: RunsReader,
    starts_dir: Path,
    probe_dir: Path,
) -> Result:
    from jobwheel.producers.client import JobClient, JobSpec

    wait_ready(config, settings, services, probe_dir)

    if config.warmup_jobs > 0:
        warm_up(config, settings, services, starts_dir.parent / "warmup")

    broker_pids = [s.pid for s in services if s.role == "broker"]
    records_start = records.snapshot(settings, broker_pids)
    for s in services:
        s.cpu_start = proc_cpu_s(s.pid)
        s.families_start = proc_family_cpu(s.pid)

    n = config.jobs
    first_due_ms = int((time.time() + config.lead_s) * 1000)
    expected = {f"e2e-{i}": first_due_ms + int(i * 1000 / config.rate) for i in range(n)}
    to_submit = list(expected.items())[config.sabotage_lose :]
    specs = [
        JobSpec(
            task="load.noop",
            job_id=job_id,
            args={"out": str(starts_dir)},
            at=datetime.fromtimestamp(due_ms / 1000, UTC),
            visibility_timeout=timedelta(seconds=30),
            queue=config.queue_of(i),
        )
        for i, (job_id, due_ms) in enumerate(to_submit)
    ]
    submit_started = time.monotonic()
    with JobClient(settings) as client:
        client.schedule_many(specs)
    submit_s = time.monotonic() - submit_started

    progress = Progress(n)
    began = time.monotonic()
    watch_cpu_start = time.process_time()
    last_due_s = (max(expected.values()) - time.time() * 1000) / 1000
    deadline = began + max(0.0, last_due_s) + config.timeout_s
    # Counted as they come (see StartsTail): the watching must cost next to nothing.
    tail = StartsTail(starts_dir)
    started_ids: set[str] = set()
    schedulers = [s for s in services if s.role == "scheduler"]
    firing = False
    while True:
        if not firing and time.time() * 1000 >= first_due_ms:
            # The transactions of the firing: the commands' burst before it commits in larger
            # transactions (behind, at the backlog interval), a figure of its own.
            firing = True
            for s in schedulers:
                s.transactions_start = scheduler_transactions(s.metrics_url)
        started_ids.update(s.job_id for s in tail.read() if s.job_id in expected)
        started = len(started_ids)
        progress.show(len(reader.fired_jobs), started, time.monotonic() - began)
        if started >= len(to_submit) or time.monotonic() > deadline:
            break
        for s in services:
            if s.proc is not None and s.proc.poll() is not None:
                raise RuntimeError(f"{s.role} (pid {s.pid}) exited during the run; see {s.log}")
        time.sleep(0.2)
    watch_cpu_s = time.process_time() - watch_cpu_start
    if config.sabotage_duplicate:
        # Duplicates made on purpose are known: wait for their executions (a fixed settle
        # raced them: the re-dispatched attempt could start after it and go uncounted).
        expected_runs = len(to_submit) + config.sabotage_duplicate
        while (
            sum(1 for s in tail.starts if s.job_id in expected) < expected_runs
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
            tail.read()
    time.sleep(config.settle_s)  # late duplicates nobody made on purpose
    tail.read()
    starts = tail.starts
    # The status path is not on the firing path (the sink may run behind during a burst and
    # catch up after it): wait for it, report how long it took, and count its CPU to the end.
    last_start_s = max((s.start_ms for s in starts), default=time.time() * 1000) / 1000
    sink_deadline = time.monotonic() + config.timeout_s
    behind: int | None = None
    while time.monotonic() < sink_deadline:
        sink_now = sink_progress(settings)
        behind = None if sink_now is None else sink_now[1]
        if behind == 0:
            break
        time.sleep(0.2)
    status_stored_s = time.time() - last_start_s if behind == 0 else None
    fires = reader.fires()
    counted = tally(expected, fires, starts)
    progress.show(counted.fired_runs, counted.started_jobs, time.monotonic() - began, final=True)

    transactions = transactions_delta(
        [(s.transactions_start, scheduler_transactions(s.metrics_url)) for s in schedulers]
    )
    cpu: dict[str, float | None] = {}
    rss: dict[str, list[float | None]] = {}
    by_family: dict[str, dict[str, float]] = {}
    # The brokers' JIT compiler, from the same samples (None without a broker of ours, or
    # when one is gone, as brokers_jit_cpu).
    broker_jit_s: float | None = 0.0 if broker_pids else None
    threads: dict[str, int] = {}
    for s in services:
        families_end = proc_family_cpu(s.pid)
        threads[s.role] = threads.get(s.role, 0) + len(families_end or {})
        families = family_cpu_s(s.families_start, families_end)
        if s.role == "broker" and broker_jit_s is not None:
            broker_jit_s = None if families is None else broker_jit_s + families.get("jit", 0.0)
        for family, used_s in (families or {}).items():
            role = by_family.setdefault(s.role, {})
            role[family] = role.get(family, 0.0) + used_s / n
        end = proc_cpu_s(s.pid)
        used = None if end is None or s.cpu_start is None else end - s.cpu_start
        if s.role in cpu and cpu[s.role] is not None and used is not None:
            cpu[s.role] = (cpu[s.role] or 0.0) + used
        elif s.role not in cpu:
            cpu[s.role] = used
        rss.setdefault(s.role, []).append(proc_peak_rss_mib(s.pid))
    per_job = {role: None if v is None else v / n for role, v in cpu.items()}
    # Counted after the CPU figures: reading the records back is the generator's work.
    records_end = records.snapshot(settings, broker_pids)
    accounting = records.account(settings, records_start, records_end, n)
    p99 = counted.start_lateness_ms["p99"]
    passed = not counted.lost and p99 is not None and p99 <= PASS_P99_MS
    return Result(
        config=asdict(config) | {"jobs": n, "topic_prefix": settings.topic_prefix},
        submitted=len(to_submit),
        submit_s=submit_s,
        submitted_per_s=len(to_submit) / submit_s if submit_s > 0 else float("inf"),
        tally=asdict(counted) | {"sabotaged_duplicates": reader.duplicated},
        cpu_s_per_job=per_job,
        cpu_s=cpu,
        peak_rss_mib=rss,
        passed=passed,
        status_stored_s=status_stored_s,
        status_behind=behind,
        timeline=_timeline(expected, fires, starts),
        broker_jit_s=broker_jit_s,
        watch_cpu_s=watch_cpu_s,
        records=accounting,
        transactions=transactions,
        cpu_s_per_job_by_family={
            role: dict(sorted(families.items(), key=lambda kv: -kv[1]))
            for role, families in by_family.items()
        },
        threads=threads,
    )


def warm_up(config: Config, settings: Settings, services: Sequence[Service], out: Path) -> None:
    """Run rounds of ``config.warmup_jobs`` one-off jobs through every process before
    measuring, until the broker's JIT compiler is quiet (or ``config.warmup_rounds``).

    Why: a broker the generator has just started compiles its hot paths while the measured
    jobs go through it. Measured by thread on this machine, its C1/C2 compiler threads took
    about half of the broker's CPU in a 30,000-job run on a fresh JVM, on the same two cores
    as the pipeline, which a broker that has been up for minutes (any real one) no longer
    pays; one round of 20,000 jobs left more than half of that compiling still to do. It
    does not go quiet soon: counted thread by thread, three rounds still left 2.6 to 3.8 s of
    compiling in a 4,500/s measured span, and a broker kept up through four whole runs is
    quiet (``load/RESULTS.md``). So three is the default and the report gives what was left
    (with ``--bootstrap`` the broker is not ours to watch: one round). The
    services warm up too (RocksDB, the embedded store's first parts, the codecs). The warm-up
    jobs use other ids and another output directory, so nothing here is counted.
    """
    from jobwheel.producers.client import JobClient, JobSpec

    out.mkdir(parents=True, exist_ok=True)
    n = config.warmup_jobs
    tail = StartsTail(out)
    warmed: set[str] = set()

    def ran(total: int) -> bool:
        warmed.update(s.job_id for s in tail.read())
        return len(warmed) >= total

    for round_ in range(config.warmup_rounds):
        jit_before = brokers_jit_cpu(services)
        first_due_ms = int((time.time() + 3) * 1000)
        specs = [
            JobSpec(
                task="load.noop",
                job_id=f"warmup-{round_}-{i}",
                args={"out": str(out)},
                at=datetime.fromtimestamp(
                    (first_due_ms + int(i * 1000 / config.warmup_rate)) / 1000, UTC
                ),
                queue=config.queue_of(i),
            )
            for i in range(n)
        ]
        with JobClient(settings) as client:
            client.schedule_many(specs)
        wait_for(
            lambda total=n * (round_ + 1): ran(total),
            3 + n / config.warmup_rate + config.timeout_s,
            "the warm-up jobs to run",
            services,
        )
        wait_for(
            lambda: (sink_progress(settings) or (0, 1))[1] == 0,
            config.timeout_s,
            "the sink to store the warm-up's events",
            services,
        )
        jit_after = brokers_jit_cpu(services)
        jit = jit_cpu_s(jit_before, jit_after)
        print(
            f"warm-up {round_ + 1}: {n:,} jobs at {config.warmup_rate:,.0f}/s (not counted)"
            + ("" if jit is None else f", broker JIT compiler CPU {jit:.2f}s"),
            flush=True,
        )
        if jit is None or jit < WARM_JIT_S:
            break


def _timeline(
    expected: dict[str, int], fires: Sequence[Fire], starts: Sequence[Start]
) -> dict[str, Any]:
    """Per-job points for the plot, times in seconds from the first due time."""
    if not expected:
        return {}
    t0 = min(expected.values())
    first: dict[str, Start] = {}
    for s in sorted(starts, key=lambda s: s.start_ms):
        if s.job_id in expected:
            first.setdefault(s.run_id, s)
    fired: dict[str, Fire] = {}
    for f in sorted(fires, key=lambda f: f.seen_ms):
        if f.run_id.rsplit("@", 1)[0] in expected:
            fired.setdefault(f.run_id, f)
    return {
        "t0_ms": t0,
        "start": [
            [round((s.scheduled_ms - t0) / 1000, 3), round(s.start_ms - s.scheduled_ms, 1)]
            for s in first.values()
        ],
        "fire": [
            [round((f.scheduled_ms - t0) / 1000, 3), round(f.seen_ms - f.scheduled_ms, 1)]
            for f in fired.values()
        ],
        "started_at": sorted(round((s.start_ms - t0) / 1000, 3) for s in first.values()),
        "fired_at": sorted(round((f.seen_ms - t0) / 1000, 3) for f in fired.values()),
        "due_at": sorted(round((d - t0) / 1000, 3) for d in expected.values()),
    }


# --- output -------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _service_settings(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    settings = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("JOBWHEEL_"):
            parser.error(f"--set {item!r}: expected JOBWHEEL_NAME=VALUE")
        settings[name] = value
    return settings


def report(result: Result) -> str:
    t = result.tally
    c = result.config
    fl, sl = t["fire_lateness_ms"], t["start_lateness_ms"]
    lines = [
        f"e2e: {c['jobs']:,} jobs at {c['rate']:,.0f}/s over {c['window_s']:.0f}s "
        f"(lead {c['lead_s']:.0f}s), {c['schedulers']} scheduler(s), {c['workers']} worker(s), "
        f"{c['partitions']} partitions"
        + (f", {c['queues']} queues (pools)" if c.get("queues", 1) > 1 else "")
        + (
            f"; {r['brokers']} broker(s), replication factor {r['replication_factor']}, "
            f"min ISR {r['min_insync_replicas']}, acks=all"
            if (r := result.replication)
            else ""
        ),
        f"submitted {result.submitted:,} in {result.submit_s:.2f}s "
        f"({result.submitted_per_s:,.0f}/s)",
        f"fired {t['fired_runs']:,} ({_ms(t['fired_per_s'])}/s); fire lateness ms "
        f"p50 {_ms(fl['p50'])} p90 {_ms(fl['p90'])} p99 {_ms(fl['p99'])} max {_ms(fl['max'])}",
        f"started {t['started_jobs']:,} jobs ({_ms(t['started_per_s'])}/s); start lateness ms "
        f"p50 {_ms(sl['p50'])} p90 {_ms(sl['p90'])} p99 {_ms(sl['p99'])} max {_ms(sl['max'])}",
        f"lost {len(t['lost'])}{' ' + str(t['lost'][:5]) if t['lost'] else ''}; "
        f"executions {t['executions']:,}, duplicate executions {t['duplicates']}",
        *(
            [
                f"scheduler transactions: {x['count']:,}; ms each on average: "
                + ", ".join(f"{phase} {ms:.1f}" for phase, ms in x["ms_each"].items())
                + " (a run fired into one is seen after its end)"
            ]
            if (x := result.transactions)
            else []
        ),
        "CPU ms per job: "
        + ", ".join(
            f"{role} {_ms(None if v is None else v * 1000) if v is None else f'{v * 1000:.3f}'}"
            for role, v in result.cpu_s_per_job.items()
        ),
        *(
            [
                "  by thread family: "
                + "; ".join(
                    f"{role} "
                    + ", ".join(
                        f"{family} {v * 1000:.3f}" for family, v in families.items() if v > 0
                    )
                    for role, families in result.cpu_s_per_job_by_family.items()
                )
            ]
            if result.cpu_s_per_job_by_family
            else []
        ),
        (
            f"status stored: every event {result.status_stored_s:.1f}s after the last start"
            if result.status_stored_s is not None
            else f"status stored: the sink was still {result.status_behind} records behind"
        ),
        "peak RSS MiB: "
        + ", ".join(
            f"{role} {[round(v) if v is not None else None for v in vs]}"
            for role, vs in result.peak_rss_mib.items()
        ),
        *(
            [f"broker JIT compiler CPU in the measured span: {result.broker_jit_s:.2f}s"]
            if result.broker_jit_s is not None
            else []
        ),
        *(
            [f"generator CPU while watching: {result.watch_cpu_s:.2f}s"]
            if result.watch_cpu_s is not None
            else []
        ),
        *records.describe(result.records),
        f"verdict: {'PASS' if result.passed else 'FAIL'} (p99 start lateness <= "
        f"{PASS_P99_MS} ms and nothing lost)",
    ]
    return "\n".join(lines)


def plot(result: Result, path: Path) -> bool:
    """Lateness and throughput over time as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tl = result.timeline
    fig, (late, rate) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for key, label in (("fire", "fire lateness"), ("start", "start lateness")):
        if tl.get(key):
            xs, ys = zip(*tl[key], strict=True)
            late.scatter(xs, [max(1.0, y) for y in ys], s=2, label=label, alpha=0.5)
    late.axhline(PASS_P99_MS, color="red", linewidth=0.8, linestyle="--", label="2 s")
    late.set_ylabel("lateness (ms, by due time; under 1 ms shown as 1)")
    late.set_yscale("log")
    late.legend(loc="upper left", markerscale=4)
    late.set_title(
        f"{result.config['jobs']:,} jobs at {result.config['rate']:,.0f}/s, "
        f"{result.config['schedulers']} scheduler(s), {result.config['workers']} worker(s)"
    )
    for key, label in (("due_at", "due"), ("fired_at", "fired"), ("started_at", "started")):
        times = tl.get(key) or []
        if times:
            lo, hi = int(min(times)), int(max(times)) + 1
            counts = Counter(int(t) for t in times)
            seconds = list(range(lo, hi + 1))
            rate.step(seconds, [counts.get(s, 0) for s in seconds], where="post", label=label)
    rate.set_ylabel("per second")
    rate.set_xlabel("seconds from the first due time")
    rate.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


#: Where under its work directory :func:`own_broker` keeps its single broker's data.
LOCAL_BROKER_DIR = "kafka"
#: Heap of the generator's own broker, and of each node of its cluster (the same per JVM, so
#: a cluster's figures differ from one broker's by the replication, not by the heap).
BROKER_HEAP = "1g"


@contextlib.contextmanager
def own_broker(
    bootstrap: str | None, work: Path, nodes: int = 1
) -> Iterator[tuple[str, list[int]]]:
    """``(bootstrap, broker pids)``: the given broker (no pid: not ours to watch), a fresh
    local one, or a fresh local cluster of ``nodes`` (every node's pid)."""
    if bootstrap:
        yield bootstrap, []
        return
    from jobwheel.deploy.broker import LocalBroker, LocalCluster, free_port

    broker: LocalBroker | LocalCluster
    if nodes > 1:
        broker = LocalCluster(
            work / "kafka-cluster",
            nodes=nodes,
            ports=[(free_port(), free_port()) for _ in range(nodes)],
            heap=BROKER_HEAP,
        )
    else:
        broker = LocalBroker(
            work / LOCAL_BROKER_DIR, port=free_port(), controller_port=free_port(), heap=BROKER_HEAP
        )
    broker.start(die_with_parent=True)
    try:
        if isinstance(broker, LocalCluster):
            pids = [p for b in map(broker.node, broker.node_ids) if (p := b.running_pid())]
        else:
            pids = [p] if (p := broker.running_pid()) else []
        yield broker.bootstrap, pids
    finally:
        gc.collect()  # any client left in a reference cycle is destroyed while the broker is up
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs due per second (1000)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of due times (10)")
    parser.add_argument("--lead", type=float, default=5.0, help="first due time after submit (5 s)")
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--queues",
        type=int,
        default=1,
        help="worker pools the jobs are spread over (worker i serves queue i mod N; 1)",
    )
    parser.add_argument(
        "--partitions", type=int, default=DEFAULT_PARTITIONS, help="(the product's default)"
    )
    parser.add_argument("--concurrency", type=int, default=None, help="per worker (setting)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument(
        "--cluster",
        type=int,
        nargs="?",
        const=3,
        default=1,
        metavar="N",
        help="start a local KRaft cluster of N nodes (3 when N is left out) instead of one "
        "broker: topics with replication factor min(3, N), min ISR 2 from 3 nodes",
    )
    parser.add_argument("--out", type=Path, help="results directory (default: a temp dir)")
    parser.add_argument("--scan", action="store_true", help="double the rate until it fails")
    parser.add_argument("--max-rate", type=float, default=64_000.0, help="--scan stops here")
    parser.add_argument("--timeout", type=float, default=120.0, help="after the last due time")
    parser.add_argument("--log-level", default="INFO", help="services' JOBWHEEL_LOG_LEVEL")
    parser.add_argument(
        "--warmup",
        type=int,
        default=Config.warmup_jobs,
        help="jobs per warm-up round, run through every process at 2,000/s before the "
        "measured ones, up to 3 rounds or until one leaves the broker JIT compiler quiet (10,000; "
        "0: measure from a cold start)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="JOBWHEEL_NAME=VALUE",
        help="a setting for every service, e.g. --set JOBWHEEL_SCHEDULER_COMMIT_INTERVAL_MS=100 "
        "(repeatable)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.queues <= args.workers:
        parser.error("--queues must be between 1 and --workers (each pool needs a worker)")

    out = args.out or Path(tempfile.mkdtemp(prefix="jobwheel-e2e-"))
    out.mkdir(parents=True, exist_ok=True)
    config = Config(
        rate=args.rate,
        window_s=args.window,
        lead_s=args.lead,
        schedulers=args.schedulers,
        workers=args.workers,
        queues=args.queues,
        partitions=args.partitions,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        log_level=args.log_level,
        warmup_jobs=args.warmup,
        service_settings=_service_settings(parser, args.set),
    )
    results: list[Result] = []
    with own_broker(args.bootstrap, out, args.cluster) as (bootstrap, broker_pids):
        while True:
            result = run_once(config, bootstrap, out, broker_pids)
            results.append(result)
            step = len(results)
            name = "result" if not args.scan else f"result-{step}-{int(config.rate)}"
            (out / f"{name}.json").write_text(json.dumps(asdict(result), indent=1))
            plotted = plot(result, out / f"{name}.png")
            print(report(result))
            print(
                f"written: {out / (name + '.json')}"
                + (
                    f", {out / (name + '.png')}"
                    if plotted
                    else " (no plot: pip install -e '.[bench]')"
                )
            )
            if not args.scan or not result.passed or config.rate * 2 > args.max_rate:
                break
            config = Config(**{**asdict(config), "rate": config.rate * 2})
    if args.scan:
        passing = [r.config["rate"] for r in results if r.passed]
        print(
            f"scan: highest passing rate {max(passing):,.0f} jobs/s"
            if passing
            else "scan: no rate passed"
        )
        summary = [
            {
                "rate": r.config["rate"],
                "passed": r.passed,
                "p99_start_ms": r.tally["start_lateness_ms"]["p99"],
                "lost": len(r.tally["lost"]),
            }
            for r in results
        ]
        (out / "scan.json").write_text(json.dumps(summary, indent=1))
    return 0 if results[-1].passed or args.scan else 1


if __name__ == "__main__":
    sys.exit(main())
