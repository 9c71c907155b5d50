"""Soak benchmark: a steady rate held for a given time, every process sampled as it goes.

    python -m load.soak --rate 2000 --duration 3600 --out load/soak-2000   # the 1-hour soak
    python -m load.soak --rate 500 --duration 120                          # a short check
    python -m load.soak --rates 2000,2500,3000,3500 --duration 1800        # highest sustained

The pipeline is :mod:`load.e2e`'s (its broker, topics, ``jobwheel scheduler``/``worker``/
``sink`` processes and readiness probes), but the jobs come as they would in service, not as
one burst: a thread submits one-off ``load.noop`` jobs at ``--rate`` per second, each due
``--lead`` seconds after it is sent, for ``--duration`` seconds. Every ``--sample`` seconds the
generator records, for every process (broker, each scheduler, worker and the sink, and
itself): resident memory (VmRSS) and CPU (% of one core over the interval); the lag of each
consumer group (scheduler: requests and acks; workers: runs; sink: status and acks; records
not yet committed); and the start lateness (task start minus due time) of the jobs that started
in the interval (count, p50, p99, max). Each minute it also records the disk the broker (when
it is the generator's own), the scheduler's state and the sink's store take. It counts the
jobs not started (sent, and still not started ``--grace`` seconds after the last was due: lost,
or a pipeline that fell that far behind, which the lag tells apart) and duplicate executions
(starts beyond a job's first), keeping one byte per job, never the starts themselves: an hour
at 2,000/s is 7.2 M of them.

It prints a line per minute (start lateness, RSS and CPU of each process, lag, disk) and at the
end the flatness check: each process's RSS at the start of the last half of the run and at its
end, each the mean of the samples of one minute (less in a short run), within 10 % (issue 33's
"flat"). ``soak.json`` holds the configuration, every sample and the verdict; ``soak.png`` (with
matplotlib: ``pip install -e '.[bench]'``) plots the start lateness per interval (p50, p99,
max) and each process's RSS and CPU and each group's lag over time.

With ``--rates`` it runs each rate in turn on fresh topics and processes (the same broker) and
stops at the first that fails: a rate passes when every job started and every minute's p99
start lateness is at most 2 s. No assertions: it prints numbers, taken on whatever else the
machine is doing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jobwheel.schemas.topics import DEFAULT_PARTITIONS
from jobwheel.settings import Settings
from load.e2e import (
    LOCAL_BROKER_DIR,
    PASS_P99_MS,
    Config,
    Service,
    StartsTail,
    _service_settings,
    own_broker,
    percentiles,
    proc_cpu_s,
    proc_rss_mib,
    sink_progress,
    start_pipeline,
    stop_services,
    wait_ready,
)

#: The flatness check's tolerance: RSS at the end of the last half within this of its start.
FLAT_TOLERANCE = 0.10
#: Seconds of samples averaged at each end of the last half (shorter runs use a quarter of it).
FLAT_WINDOW_S = 60.0
JOB_PREFIX = "soak-"
#: Disk a job takes on this machine until the run's data is discarded (KB): broker logs of
#: every topic, the embedded store, the scheduler's state; measured at 500 jobs/s.
DISK_PER_JOB_KB = 4.0


# --- the counting (pure) --------------------------------------------------------------------


def due_ms(t0_ms: int, lead_s: float, rate: float, index: int) -> int:
    """When job ``index`` is due: sent at ``t0 + index / rate``, due ``lead_s`` after that."""
    return t0_ms + int((lead_s + index / rate) * 1000)


def jobs_to_send(rate: float, duration_s: float, elapsed_s: float) -> int:
    """How many jobs should have been sent ``elapsed_s`` into the run (paced, at most all)."""
    total = round(rate * duration_s)
    return max(0, min(total, int(elapsed_s * rate) + 1))


class StartCounts:
    """Starts per job, one byte each (job ``soak-<i>``): duplicates and lost jobs without
    keeping a set of millions of ids."""

    def __init__(self, jobs: int) -> None:
        self.counts = bytearray(jobs)
        self.executions = 0

    def add(self, job_id: str) -> bool | None:
        """Count a start; True for a job's first, False for a duplicate, None: not ours."""
        if not job_id.startswith(JOB_PREFIX):
            return None
        try:
            index = int(job_id[len(JOB_PREFIX) :])
        except ValueError:
            return None
        if not 0 <= index < len(self.counts):
            return None
        self.executions += 1
        before = self.counts[index]
        self.counts[index] = min(255, before + 1)
        return before == 0

    @property
    def started(self) -> int:
        return len(self.counts) - self.counts.count(0)

    @property
    def duplicates(self) -> int:
        return self.executions - self.started

    def not_started(self, upto: int) -> list[int]:
        """Indexes below ``upto`` that never started."""
        return [i for i in range(min(upto, len(self.counts))) if self.counts[i] == 0]


def interval_lateness(values: Sequence[float]) -> dict[str, float | None]:
    """count, p50, p99 and max of the start lateness values of one interval (ms)."""
    p = percentiles(values)
    return {"n": len(values), "p50": p["p50"], "p99": p["p99"], "max": p["max"]}


def minute_record(
    minute: int, lateness: Sequence[float], samples: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """One minute of the run: the start lateness of every job that started in it, each
    process's mean RSS and CPU over its samples, and the last sample's counts and lag."""
    names = sorted({n for s in samples for n in s["rss_mib"]})
    last = samples[-1] if samples else {}
    return {
        "minute": minute,
        "lateness_ms": interval_lateness(lateness),
        "rss_mib": {n: _mean([s["rss_mib"].get(n) for s in samples]) for n in names},
        "cpu_pct": {n: _mean([s.get("cpu_pct", {}).get(n) for s in samples]) for n in names},
        "lag": last.get("lag", {}),
        "sent": last.get("sent", 0),
        "started": last.get("started", 0),
    }


def flatness(
    samples: Sequence[dict[str, Any]], duration_s: float, window_s: float = FLAT_WINDOW_S
) -> dict[str, dict[str, float | bool | None]]:
    """Per process: mean RSS over the first ``window`` of the last half of the run and over
    its last ``window``, their change, and whether it is within :data:`FLAT_TOLERANCE`."""
    half = duration_s / 2
    window = min(window_s, half / 4) if half > 0 else 0.0
    during = [s for s in samples if s["t"] <= duration_s]
    second_half = [s for s in during if s["t"] >= half]
    # A window shorter than the sampling interval still has one sample at each end.
    first = [s for s in second_half if s["t"] <= half + window] or second_half[:1]
    last = [s for s in second_half if s["t"] >= duration_s - window] or second_half[-1:]
    out: dict[str, dict[str, float | bool | None]] = {}
    names = sorted({name for s in during for name in s["rss_mib"]})
    for name in names:
        a = _mean([s["rss_mib"].get(name) for s in first])
        b = _mean([s["rss_mib"].get(name) for s in last])
        change = None if a is None or b is None or a == 0 else (b - a) / a
        out[name] = {
            "start_mib": a,
            "end_mib": b,
            "change": change,
            "flat": None if change is None else abs(change) <= FLAT_TOLERANCE,
        }
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


# --- the run ------------------------------------------------------------------------------


@dataclass
class SoakConfig:
    rate: float = 2000.0
    duration_s: float = 3600.0
    lead_s: float = 5.0
    sample_s: float = 5.0
    grace_s: float = 60.0
    #: keep the run's topics and services' state after it (default: deleted, see discard_data)
    keep_data: bool = False
    pipeline: Config = field(default_factory=Config)


def process_names(services: Sequence[Service]) -> dict[int, str]:
    """pid -> a name per process: the role, numbered when there are several of it."""
    counts: dict[str, int] = {}
    for s in services:
        counts[s.role] = counts.get(s.role, 0) + 1
    seen: dict[str, int] = {}
    names = {}
    for s in services:
        i = seen.get(s.role, 0)
        seen[s.role] = i + 1
        names[s.pid] = s.role if counts[s.role] == 1 else f"{s.role}-{i}"
    return names


class GroupLag:
    """Records a consumer group has not committed yet on some topics (end offset minus the
    committed one, summed over partitions), through one long-lived consumer per group."""

    def __init__(self, settings: Settings, group: str, topics: Sequence[str]) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self._consumer = Consumer(settings.librdkafka(**{"group.id": group}))
        self._tps = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]

    def __call__(self) -> int | None:
        try:
            behind = 0
            for tp in self._consumer.committed(self._tps, timeout=10):
                _, high = self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                behind += max(0, high - max(tp.offset, 0))
            return behind
        except Exception:  # the broker did not answer: a gap in the timeline, not a zero
            return None

    def close(self) -> None:
        self._consumer.close()


class Submitter(threading.Thread):
    """Sends the jobs as they come: every 50 ms, the ones whose time to be sent has come."""

    def __init__(self, settings: Settings, config: SoakConfig, t0_ms: int, out: Path) -> None:
        super().__init__(name="soak-submitter", daemon=True)
        self.settings, self.config, self.t0_ms, self.out = settings, config, t0_ms, out
        self.sent = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        from jobwheel.producers.client import JobClient, JobSpec

        c = self.config
        total = round(c.rate * c.duration_s)
        try:
            with JobClient(self.settings, task_check="off") as client:
                while self.sent < total and not self.stopping.is_set():
                    elapsed_s = time.time() - self.t0_ms / 1000
                    upto = jobs_to_send(c.rate, c.duration_s, elapsed_s)
                    if upto > self.sent:
                        client.schedule_many(
                            [
                                JobSpec(
                                    task="load.noop",
                                    job_id=f"{JOB_PREFIX}{i}",
                                    args={"out": str(self.out)},
                                    at=datetime.fromtimestamp(
                                        due_ms(self.t0_ms, c.lead_s, c.rate, i) / 1000, UTC
                                    ),
                                    visibility_timeout=timedelta(seconds=30),
                                )
                                for i in range(self.sent, upto)
                            ]
                        )
                        self.sent = upto
                    self.stopping.wait(0.05)  # pacing, not synchronisation
        except BaseException as exc:  # reported by the sampler, which stops the run
            self.error = exc


def soak_once(
    config: SoakConfig,
    bootstrap: str,
    out_dir: Path,
    broker_pids: Sequence[int] = (),
    on_minute: Callable[[dict[str, Any]], None] | None = None,
    broker_dir: Path | None = None,
) -> dict[str, Any]:
    """One soak on fresh topics and processes; returns what ``soak.json`` holds.
    ``broker_dir``: the broker's data directory, whose size each minute records (when the
    broker is ours)."""
    pipeline = start_pipeline(config.pipeline, bootstrap, out_dir, broker_pids, stem="soak")
    settings, services = pipeline.settings, pipeline.services
    starts_dir = pipeline.run_dir / "starts"
    starts_dir.mkdir(parents=True)
    run_dir = pipeline.run_dir
    disk = {
        "broker": [broker_dir] if broker_dir else [],
        "scheduler": [run_dir / f"scheduler-{i}" for i in range(config.pipeline.schedulers)],
        "sink": [run_dir / "sink"],
    }
    t = settings.topics
    lags = {
        "scheduler": GroupLag(settings, settings.scheduler_app_id, [t.requests, t.acks]),
        "worker": GroupLag(settings, settings.worker_group, [t.runs]),
    }
    try:
        wait_ready(config.pipeline, settings, services, pipeline.run_dir / "probe")
        return _soak(config, settings, services, starts_dir, lags, on_minute, disk)
    finally:
        for lag in lags.values():
            lag.close()
        stop_services(services)
        if not config.keep_data:
            discard_data(settings, pipeline.run_dir)


def discard_data(settings: Settings, run_dir: Path) -> None:
    """Delete the run's topics and its services' state (RocksDB, the embedded store), keeping
    the logs and the start notes: an hour at 2,000 jobs/s leaves about 27 GB (about 4 KB a
    job: the broker's logs 3.1, the store 0.7, the state 0.3), and ``--rates`` runs several."""
    from confluent_kafka.admin import AdminClient

    from jobwheel.kafka.admin import topic_specs

    admin = AdminClient(settings.librdkafka())
    futures = admin.delete_topics([spec.name for spec in topic_specs(settings)], request_timeout=60)
    for topic, future in futures.items():
        try:
            future.result(timeout=60)
        except Exception as exc:  # the figures are written; say what is left behind
            print(f"could not delete topic {topic}: {exc}", file=sys.stderr)
    for data in run_dir.iterdir():
        if data.is_dir() and data.name.startswith(("scheduler-", "worker-", "sink")):
            shutil.rmtree(data, ignore_errors=True)


def disk_needed_gib(rate: float, duration_s: float) -> float:
    """What a run leaves on disk until :func:`discard_data`: about 4 KB a job (measured)."""
    return rate * duration_s * DISK_PER_JOB_KB / 1024 / 1024


def _soak(
    config: SoakConfig,
    settings: Settings,
    services: Sequence[Service],
    starts_dir: Path,
    lags: dict[str, GroupLag],
    on_minute: Callable[[dict[str, Any]], None] | None,
    disk: dict[str, list[Path]],
) -> dict[str, Any]:
    total = round(config.rate * config.duration_s)
    counts = StartCounts(total)
    tail = StartsTail(starts_dir, keep=False)
    names = process_names(services)
    me = os.getpid()
    cpu_before = {pid: proc_cpu_s(pid) for pid in [*names, me]}
    t0_ms = int(time.time() * 1000)
    submitter = Submitter(settings, config, t0_ms, starts_dir)
    submitter.start()
    samples: list[dict[str, Any]] = []
    error: str | None = None
    per_minute: list[dict[str, Any]] = []
    minute_late: list[float] = []
    minute_samples: list[dict[str, Any]] = []
    end_s = config.duration_s + config.lead_s + config.grace_s
    next_sample = time.monotonic() + config.sample_s
    last_cpu_t = time.monotonic()
    try:
        while True:
            time.sleep(max(0.0, next_sample - time.monotonic()))  # the sampling period
            next_sample += config.sample_s
            now = time.monotonic()
            t_s = time.time() - t0_ms / 1000
            late: list[float] = []
            for start in tail.read():
                first = counts.add(start.job_id)
                if first:
                    late.append(start.start_ms - start.scheduled_ms)
            minute_late += late
            span = now - last_cpu_t
            last_cpu_t = now
            rss: dict[str, float | None] = {}
            cpu: dict[str, float | None] = {}
            for pid, name in [*names.items(), (me, "generator")]:
                rss[name] = proc_rss_mib(pid)
                used = proc_cpu_s(pid)
                before = cpu_before.get(pid)
                cpu[name] = None if used is None or before is None else 100 * (used - before) / span
                cpu_before[pid] = used
            sink = sink_progress(settings)
            sample = {
                "t": round(t_s, 2),
                "sent": submitter.sent,
                "due": jobs_due(config, t_s),
                "started": counts.started,
                "duplicates": counts.duplicates,
                "lateness_ms": interval_lateness(late),
                "rss_mib": rss,
                "cpu_pct": cpu,
                "lag": {
                    **{role: lag() for role, lag in lags.items()},
                    "sink": None if sink is None else sink[1],
                },
            }
            samples.append(sample)
            minute_samples.append(sample)
            if int(t_s // 60) > len(per_minute):
                per_minute.append(minute_record(len(per_minute) + 1, minute_late, minute_samples))
                per_minute[-1]["disk_mib"] = {
                    name: dirs_mib(paths) for name, paths in disk.items() if paths
                }
                if on_minute is not None:
                    on_minute(per_minute[-1])
                minute_late, minute_samples = [], []
            # A failure ends the run but keeps what was measured up to it (an hour's samples).
            if submitter.error is not None:
                error = f"submitting jobs failed: {submitter.error!r}"
            exited = [s for s in services if s.proc is not None and s.proc.poll() is not None]
            if exited:
                error = f"{exited[0].role} (pid {exited[0].pid}) exited; see {exited[0].log}"
            if error is not None:
                print(f"soak stopped at {t_s:.0f}s: {error}", file=sys.stderr, flush=True)
                break
            all_started = submitter.sent >= total and counts.started >= total
            if t_s >= end_s or (t_s >= config.duration_s + config.lead_s and all_started):
                break
    finally:
        submitter.stopping.set()
        submitter.join(30)
    missing = counts.not_started(submitter.sent)
    if minute_late:  # the part of a minute after the last whole one
        per_minute.append(minute_record(len(per_minute) + 1, minute_late, minute_samples))
        per_minute[-1]["partial"] = True
    flat = flatness(samples, config.duration_s)
    p99s = [m["lateness_ms"]["p99"] for m in per_minute]
    passed = (
        error is None
        and not missing
        and bool(p99s)
        and all(p is not None and p <= PASS_P99_MS for p in p99s)
    )
    return {
        "config": asdict(config) | {"jobs": total, "topic_prefix": settings.topic_prefix},
        "processes": {name: pid for pid, name in names.items()},
        "sent": submitter.sent,
        "started": counts.started,
        "executions": counts.executions,
        "duplicates": counts.duplicates,
        "not_started": len(missing),
        "not_started_first": [f"{JOB_PREFIX}{i}" for i in missing[:10]],
        "per_minute": per_minute,
        "flatness": flat,
        "flat": bool(flat) and all(v["flat"] for v in flat.values()),
        "passed": passed,
        "error": error,
        "samples": samples,
    }


def dirs_mib(paths: Sequence[Path]) -> float | None:
    """Disk used by the files under ``paths`` (allocated blocks, so the broker's sparse index
    files count as what they take), in MiB; None when none of them exists."""
    total, found = 0, False
    for path in paths:
        for root, _, files in os.walk(path):
            found = True
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
                except OSError:  # deleted while walking (a merged part, a deleted segment)
                    continue
    return total / 2**20 if found else None


def jobs_due(config: SoakConfig, t_s: float) -> int:
    """Jobs due by ``t_s`` into the run."""
    if t_s < config.lead_s:
        return 0
    return min(round(config.rate * config.duration_s), int((t_s - config.lead_s) * config.rate) + 1)


# --- output -------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _mib(rss: dict[str, float | None]) -> str:
    return ", ".join(f"{n} {'-' if v is None else round(v)}" for n, v in rss.items())


def minute_line(m: dict[str, Any]) -> str:
    late = m["lateness_ms"]
    lag = ", ".join(f"{k} {'-' if v is None else f'{v:,}'}" for k, v in m["lag"].items())
    return (
        f"minute {m['minute']:>3}: sent {m['sent']:,} started {m['started']:,}; start lateness "
        f"ms p50 {_ms(late['p50'])} p99 {_ms(late['p99'])} max {_ms(late['max'])}; "
        f"RSS MiB {_mib(m['rss_mib'])}; CPU % {_mib(m.get('cpu_pct', {}))}; lag {lag}"
        + (f"; disk MiB {_mib(m['disk_mib'])}" if m.get("disk_mib") else "")
    )


def report(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"soak: {c['rate']:,.0f} jobs/s for {c['duration_s']:,.0f}s ({c['jobs']:,} jobs, each "
        f"sent {c['lead_s']:.0f}s before due), {c['pipeline']['schedulers']} scheduler(s), "
        f"{c['pipeline']['workers']} worker(s), {c['pipeline']['partitions']} partitions",
        f"sent {result['sent']:,}, started {result['started']:,}, not started "
        f"{result['not_started']:,}"
        + (
            f" {result['not_started_first'][:3]} (lost, or still waiting: see the last lag)"
            if result["not_started"]
            else ""
        )
        + f", duplicate executions {result['duplicates']}",
        "per minute (start lateness of the jobs that started in it; mean RSS MiB):",
        *(
            f"  {m['minute']:>3}{'*' if m.get('partial') else ' '} p50 "
            f"{_ms(m['lateness_ms']['p50'])} p99 {_ms(m['lateness_ms']['p99'])} max "
            f"{_ms(m['lateness_ms']['max'])} ms; {_mib(m['rss_mib'])}"
            for m in result["per_minute"]
        ),
        "flatness, RSS at the start and the end of the last half (MiB):",
        *(
            f"  {name}: {_ms(f['start_mib'])} -> {_ms(f['end_mib'])} "
            + (
                "(-)"
                if f["change"] is None
                else f"({f['change']:+.1%}: {'flat' if f['flat'] else 'NOT flat'})"
            )
            for name, f in result["flatness"].items()
        ),
        *([f"stopped early: {result['error']}"] if result.get("error") else []),
        f"verdict: {'PASS' if result['passed'] else 'FAIL'} (every job started, every minute's p99 "
        f"start lateness <= {PASS_P99_MS} ms); RSS {'flat' if result['flat'] else 'NOT flat'} "
        f"(within {FLAT_TOLERANCE:.0%})",
    ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> bool:
    """p99 start lateness per interval, RSS of every process and the groups' lag over time,
    as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    samples = result["samples"]
    ts = [s["t"] / 60 for s in samples]
    fig, (late, rss, cpu, lag) = plt.subplots(4, 1, figsize=(11, 12), sharex=True)
    for key, label in (("p50", "p50"), ("p99", "p99"), ("max", "max")):
        points = [(t, s["lateness_ms"][key]) for t, s in zip(ts, samples, strict=True)]
        points = [(t, max(1.0, v)) for t, v in points if v is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            late.plot(xs, ys, label=f"{label} start lateness", linewidth=0.9)
    late.axhline(PASS_P99_MS, color="red", linewidth=0.8, linestyle="--", label="2 s")
    late.set_yscale("log")
    late.set_ylabel(f"ms, per {result['config']['sample_s']:.0f} s interval")
    late.legend(loc="upper left", fontsize=8)
    c = result["config"]
    late.set_title(
        f"soak: {c['rate']:,.0f} jobs/s for {c['duration_s'] / 60:g} min, "
        f"not started {result['not_started']:,}, duplicates {result['duplicates']}"
    )
    _per_process(rss, ts, samples, "rss_mib", "{}", "RSS (MiB)")
    rss.axvline(c["duration_s"] / 120, color="grey", linewidth=0.8, linestyle=":")
    _per_process(cpu, ts, samples, "cpu_pct", "{}", "CPU (% of one core)")
    _per_process(lag, ts, samples, "lag", "{} lag", "records not committed")
    lag.set_xlabel("minutes from the first job sent")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _per_process(
    ax: Any, ts: Sequence[float], samples: Sequence[dict[str, Any]], key: str, label: str, y: str
) -> None:
    """One line per name of ``samples[i][key]`` over time."""
    for name in sorted({n for s in samples for n in s[key]}):
        points = [(t, s[key].get(name)) for t, s in zip(ts, samples, strict=True)]
        points = [(t, v) for t, v in points if v is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=label.format(name), linewidth=0.9)
    ax.set_ylabel(y)
    ax.legend(loc="upper left", fontsize=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="jobs per second (2000)")
    parser.add_argument(
        "--rates",
        help="comma-separated rates run in turn, each for --duration, until one fails",
    )
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds (3600)")
    parser.add_argument(
        "--lead", type=float, default=5.0, help="each job due this long after it is sent (5 s)"
    )
    parser.add_argument("--sample", type=float, default=5.0, help="seconds between samples (5)")
    parser.add_argument(
        "--grace", type=float, default=60.0, help="wait this long for the last jobs (60 s)"
    )
    parser.add_argument("--schedulers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--partitions", type=int, default=DEFAULT_PARTITIONS, help="(the product's default)"
    )
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--out", type=Path, help="results directory (default: a temp dir)")
    parser.add_argument("--log-level", default="INFO", help="services' JOBWHEEL_LOG_LEVEL")
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep each run's topics and services' state (deleted by default: about 4 KB a job)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="JOBWHEEL_NAME=VALUE",
        help="a setting for every service (repeatable)",
    )
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    out = args.out or Path(tempfile.mkdtemp(prefix="jobwheel-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    pipeline = Config(
        schedulers=args.schedulers,
        workers=args.workers,
        partitions=args.partitions,
        log_level=args.log_level,
        service_settings=_service_settings(parser, args.set),
    )
    need = max(disk_needed_gib(r, args.duration) for r in rates)
    free = shutil.disk_usage(out).free / 1024**3
    if need > free:
        print(
            f"warning: a run may need about {need:,.0f} GiB of disk under {out} (and the "
            f"broker's), {free:,.0f} GiB are free",
            file=sys.stderr,
        )
    results = []
    with own_broker(args.bootstrap, out) as (bootstrap, broker_pids):
        for rate in rates:
            config = SoakConfig(
                rate=rate,
                duration_s=args.duration,
                lead_s=args.lead,
                sample_s=args.sample,
                grace_s=args.grace,
                keep_data=args.keep_data,
                pipeline=pipeline,
            )
            result = soak_once(
                config,
                bootstrap,
                out,
                broker_pids,
                lambda m: print(minute_line(m), flush=True),
                broker_dir=None if args.bootstrap else out / LOCAL_BROKER_DIR,
            )
            results.append(result)
            name = "soak" if len(rates) == 1 else f"soak-{int(rate)}"
            (out / f"{name}.json").write_text(json.dumps(result, indent=1))
            plotted = plot(result, out / f"{name}.png")
            print(report(result))
            print(
                f"written: {out / (name + '.json')}"
                + (
                    f", {out / (name + '.png')}"
                    if plotted
                    else " (no plot: pip install -e '.[bench]')"
                ),
                flush=True,
            )
            if not result["passed"]:
                break
    if len(rates) > 1:
        passing = [r["config"]["rate"] for r in results if r["passed"]]
        print(
            f"highest sustained rate: {max(passing):,.0f} jobs/s for {args.duration:,.0f}s"
            if passing
            else "no rate held"
        )
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
