"""Helpers for the pipeline tests against the session broker: real scheduler processes, runs
written to the runs topic as the scheduler writes them (for the worker tests, which run no
scheduler), the worker group's offsets, and :class:`TopicTail`, the one reader of the runs,
status, acks and dead-letter topics (the ``tail`` fixture of ``tests/integration/conftest.py``).
Workers are started with :func:`tests.support.start_worker`."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, Producer, TopicPartition

from jobwheel.clock import Clock
from jobwheel.errors import SchemaDecodeError
from jobwheel.kafka.producer import producer_config
from jobwheel.schemas.codec import Codec, default_codec
from jobwheel.schemas.models import Run, State, StatusEvent
from jobwheel.schemas.partitioning import key_for, partition_for
from jobwheel.settings import Settings
from jobwheel.streams.engine import Phase, SchedulerEngine
from jobwheel.watchdog import HUNG_CALL_EXIT_CODE
from tests.support import HarnessError, Procs, Tail, kafka_call, log_tail, scaled, wait_until

T = TypeVar("T")
CODEC = Codec()
#: The scheduler's log line of a reset (its transactional producer fenced or failed).
RESET = "dropping all partitions' uncommitted work and claiming them again"


class TopicTail:
    """The tests' one reader of the pipeline's topics as they grow: every declared queue's runs
    topic, status, acks and dead letters (read_committed), or the ones of them in ``topics``
    (``[settings.topics.acks]``: only what workers report). Everything a pipeline test asserts
    on is what a real consumer would see, decoded and kept:

    - ``runs``: (run, broker timestamp ms) of every runs topic, ``runs_on``: topic -> its runs;
    - ``status``: the events of both the scheduler (status) and workers (acks), in the order
      read (a StatusBatch's one by one), with ``partitions`` and ``keys`` (job id -> the
      partitions and keys they came in; a batch has no key);
    - ``dead``: the raw dead-letter records; ``garbage``: the records that do not decode to
      what their topic carries (a test's own garbage).

    It reads in the caller's thread with :class:`tests.support.Tail`: every accessor first
    takes in what has arrived (:meth:`poll`). A consumer error is not skipped: it raises, and
    so does every accessor after it, so a dead reader cannot pass for "nothing was seen". A
    negative check waits for a positive fact first and then reads to the end offsets taken
    after it (:meth:`settled`, :meth:`read_to_end`); :meth:`duplicate_dispatches` does so
    itself.
    """

    #: The most records one read takes in before it looks again (:meth:`Tail.poll`).
    BATCH = 500

    def __init__(self, settings: Settings, topics: Iterable[str] | None = None) -> None:
        t = settings.topics
        runs_topics = [t.runs_for(q) for q in settings.queue_names]
        known = [*runs_topics, t.status, t.acks, t.dead_letter]
        chosen = known if topics is None else list(topics)
        strangers = [topic for topic in chosen if topic not in known]
        if strangers or not chosen:
            raise HarnessError(
                f"TopicTail reads some of {known}, not {strangers or 'no topic at all'}"
            )
        self.settings = settings
        self.error: BaseException | None = None
        self._dead_letter = t.dead_letter
        self._codec = default_codec()
        self._runs: list[tuple[Run, int]] = []
        self._runs_on: dict[str, list[Run]] = {r: [] for r in runs_topics if r in chosen}
        self._status: list[StatusEvent] = []
        self._partitions: dict[str, set[int]] = defaultdict(set)
        self._keys: dict[str, set[bytes | None]] = defaultdict(set)
        self._dead: list[Any] = []  # raw confluent messages
        self._garbage: list[Any] = []
        self._closed = False
        self._reader = Tail(settings, chosen)

    # reading ---------------------------------------------------------------------------

    def _keep(self, msg: Any) -> None:
        topic = msg.topic()
        if topic == self._dead_letter:
            self._dead.append(msg)
            return
        try:
            values = self._codec.decode_events(msg.value() or b"")  # a StatusBatch's events
        except SchemaDecodeError:
            self._garbage.append(msg)
            return
        for value in values:
            if topic in self._runs_on and isinstance(value, Run):
                self._runs.append((value, msg.timestamp()[1]))
                self._runs_on[topic].append(value)
            elif topic not in self._runs_on and isinstance(value, StatusEvent):
                self._status.append(value)
                self._partitions[value.job_id].add(msg.partition())
                self._keys[value.job_id].add(msg.key())
            else:
                self._garbage.append(msg)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A read of the topics; one that fails leaves the reader failed for good (what it
        holds may lack records), so every accessor raises from then on."""
        self._check()
        try:
            yield
        except BaseException as exc:
            self.error = exc
            raise

    def _check(self) -> None:
        if self.error is not None:
            raise HarnessError(f"the topic reader failed: {self.error!r}") from self.error

    def poll(self, timeout_s: float = 0.0) -> None:
        """Take in every record that has arrived (waiting up to ``timeout_s`` for a first
        one). Every accessor does so first."""
        with self._reading():
            while True:
                batch = self._reader.poll(self.BATCH, timeout_s)
                for msg in batch:
                    self._keep(msg)
                if len(batch) < self.BATCH:
                    return
                timeout_s = 0.0

    def read_to_end(self, timeout_s: float = 30.0) -> None:
        """Return once everything on the topics up to their end offsets as of this call has
        been read. Call it after waiting for a fact (see :meth:`settled`)."""
        with self._reading():
            self._reader.read_to_end(self._keep, timeout_s)

    def settled(self, positive: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
        """Wait until the reader sees ``positive`` (a fact the test knows is on the topics:
        the run that did fire, the event that did arrive), then read to the end offsets taken
        after it, and return the fact. A negative check after it is about the whole topics."""
        seen = self.wait(positive, timeout_s, f"the reader never saw {what}")
        self.read_to_end(timeout_s)
        return seen

    def wait(self, predicate: Callable[[], Any], timeout_s: float, message: str = "") -> Any:
        return wait_until(predicate, timeout_s, 0.1, message)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._reader.close()

    # what was read (each takes in what has arrived first) ------------------------------

    @property
    def runs(self) -> list[tuple[Run, int]]:
        self.poll()
        return list(self._runs)

    @property
    def runs_on(self) -> dict[str, list[Run]]:
        self.poll()
        return {topic: list(runs) for topic, runs in self._runs_on.items()}

    @property
    def status(self) -> list[StatusEvent]:
        self.poll()
        return list(self._status)

    @property
    def partitions(self) -> dict[str, set[int]]:
        """Job id -> the partitions its status events came in."""
        self.poll()
        return {job: set(seen) for job, seen in self._partitions.items()}

    @property
    def keys(self) -> dict[str, set[bytes | None]]:
        """Job id -> the record keys its status events carried."""
        self.poll()
        return {job: set(seen) for job, seen in self._keys.items()}

    @property
    def dead(self) -> list[Any]:
        self.poll()
        return list(self._dead)

    @property
    def garbage(self) -> list[Any]:
        self.poll()
        return list(self._garbage)

    def all_runs(self) -> list[Run]:
        return [r for r, _ in self.runs]

    def runs_of(self, job_id: str) -> list[Run]:
        return [r for r in self.all_runs() if r.job_id == job_id]

    def dead_letters(self) -> list[Any]:
        return self.dead

    def events(self, job_id: str | None = None, state: State | None = None) -> list[StatusEvent]:
        """The status events read, of ``job_id`` and in ``state`` if given, in read order."""
        return [
            e
            for e in self.status
            if (job_id is None or e.job_id == job_id) and (state is None or e.state == state)
        ]

    def of(self, run_id: str, state: State | None = None) -> list[StatusEvent]:
        """The status events of one run (in ``state`` if given)."""
        return [e for e in self.events(state=state) if e.run_id == run_id]

    def wait_for(
        self, run_id: str, state: State, count: int = 1, timeout_s: float = 30.0
    ) -> list[StatusEvent]:
        """Wait until ``count`` events of the run in ``state`` have been read; those events."""

        def found() -> list[StatusEvent]:
            events = self.of(run_id, state)
            return events if len(events) >= count else []

        return self.wait(found, timeout_s, f"no {state} for {run_id}")

    def duplicate_dispatches(self) -> dict[tuple[str, int], int]:
        """Committed run records that appear more than once with the same run id and attempt
        (exactly-once dispatch says: none). Reads to the end offsets first, and refuses to
        answer over no runs at all: "no duplicates among nothing" proves nothing."""
        self.read_to_end()
        runs = self.all_runs()
        if not runs:
            raise HarnessError(
                "no run was read at all, so 'no duplicate dispatches' would prove nothing; "
                "wait for the runs the test expects before asking"
            )
        counts = Counter((r.run_id, r.attempt) for r in runs)
        return {key: n for key, n in counts.items() if n > 1}


def make_run(
    settings: Any,
    task: str,
    args: Any = None,
    *,
    job_id: str | None = None,
    run_id: str | None = None,
    attempt: int = 1,
    max_attempts: int = 3,
    visibility_timeout_ms: int = 30_000,
    fencing_token: int = 1,
    timeout_ms: int | None = None,
) -> Run:
    job_id = job_id or f"job-{uuid.uuid4().hex[:8]}"
    now = int(time.time() * 1000)
    return Run(
        run_id=run_id or f"{job_id}@{now}",
        job_id=job_id,
        task=task,
        args_json=json.dumps(args if args is not None else {}),
        seq=7,
        scheduled_time_ms=now,
        dispatched_at_ms=now,
        attempt=attempt,
        max_attempts=max_attempts,
        timeout_ms=timeout_ms,
        visibility_timeout_ms=visibility_timeout_ms,
        deadline_ms=now + visibility_timeout_ms,
        partition=partition_for(job_id, settings.partitions),
        fencing_token=fencing_token,
    )


def gated_run(settings: Any, folder: Path) -> tuple[Run, Path, Path, Path]:
    """A ``test.gate`` run (tests/tasks.py) and its files in ``folder``: ``started`` and
    ``finished`` get a line per execution, and the run blocks until ``gate`` exists, so a
    test decides when it finishes (not a sleep's length)."""
    started, finished, gate = folder / "started", folder / "finished", folder / "gate"
    args = {"gate": str(gate), "started": str(started), "finished": str(finished)}
    return make_run(settings, "test.gate", args), started, finished, gate


def produce_runs(settings: Any, records: list[Run | bytes], *, key: str = "raw") -> None:
    """One committed transaction, as the scheduler's dispatch producer writes runs."""
    producer = Producer(
        producer_config(settings, **{"transactional.id": f"test-dispatch-{uuid.uuid4().hex}"})
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for record in records:
        if isinstance(record, Run):
            producer.produce(
                settings.topics.runs, key=key_for(record.job_id), value=CODEC.encode(record)
            )
        else:
            producer.produce(settings.topics.runs, key=key.encode(), value=record)
    producer.commit_transaction(30)


def committed_offsets(settings: Any) -> dict[int, int]:
    """The worker group's committed offsets on the runs topic (partitions without one left
    out)."""
    consumer = Consumer(settings.librdkafka(**{"group.id": settings.worker_group}))
    try:
        tps = kafka_call(
            lambda: consumer.committed(
                [TopicPartition(settings.topics.runs, p) for p in range(settings.partitions)],
                timeout=10,
            ),
            "reading the worker group's committed offsets",
        )
    finally:
        consumer.close()
    errors = [tp.error for tp in tps if tp.error is not None]
    if errors:
        raise HarnessError(f"committed offsets of the worker group: {errors}")
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


def end_offsets(settings: Any) -> dict[int, int]:
    consumer = Consumer(settings.librdkafka(**{"group.id": f"test-{uuid.uuid4().hex[:8]}"}))
    topic = settings.topics.runs
    try:
        return {
            p: kafka_call(
                lambda p=p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1],
                f"reading the end offset of {topic}[{p}]",
            )
            for p in range(settings.partitions)
        }
    finally:
        consumer.close()


def scheduler_env(base_env: dict[str, str], data_dir: Path) -> dict[str, str]:
    return {**base_env, "JOBWHEEL_DATA_DIR": str(data_dir), "JOBWHEEL_LOG_FORMAT": "json"}


def log_events(log_path: Path, msg: str) -> list[dict[str, Any]]:
    """The JSON log lines of a process whose ``msg`` is ``msg``."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"msg": "{msg}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def ready_partitions(log_path: Path) -> dict[int, dict[str, Any]]:
    """Partition -> the last "partition ready" log event of a scheduler process."""
    return {e["partition"]: e for e in log_events(log_path, "partition ready")}


def wait_owns_all(proc: Any, partitions: int, timeout_s: float = 60) -> dict[int, dict[str, Any]]:
    """Wait until a scheduler has made every partition ready (after its rebalances)."""
    return wait_until(
        lambda: (
            (ready := ready_partitions(proc.log_path)).keys() == set(range(partitions)) and ready
        ),
        timeout_s,
        0.2,
        f"the scheduler did not come to own all {partitions} partitions:\n"
        f"{log_tail(proc.log_path)}",
    )


def start_scheduler(
    procs: Procs,
    base_env: dict[str, str],
    data_dir: Path,
    *,
    wait: bool = True,
    log_name: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Any:
    """Start ``jobwheel scheduler`` with its own data dir; with ``wait``, return once it has
    a ready partition. ``proc.log_path`` is its (JSON) log."""
    log_path = data_dir.parent / f"{log_name or data_dir.name}.log"
    env = {**scheduler_env(base_env, data_dir), **(extra_env or {})}
    proc = procs.spawn(["jobwheel", "scheduler"], env, log_path)
    proc.log_path = log_path  # type: ignore[attr-defined]
    if wait:
        wait_until(
            lambda: proc.poll() is not None or log_events(log_path, "partition ready"),
            90,
            0.2,
            f"scheduler did not get ready:\n{log_tail(log_path)}",
        )
        assert proc.poll() is None, f"scheduler exited:\n{log_tail(log_path)}"
    return proc


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextlib.contextmanager
def engine_of(
    settings: Settings, clock: Clock, *, held_to_broker: bool = False
) -> Iterator[SchedulerEngine]:
    """A connected engine stepped by the test (in the test's thread, on real clients of the
    real broker); it owns every partition when this yields. Its wall clock is ``clock``. Unless
    ``held_to_broker``, the tolerances that would hold "now" to the broker's time are set out
    of the way, so "now" is the test's clock however far it is from the broker's."""
    if not held_to_broker:
        years = 10 * 365 * 24 * 3_600_000
        settings = settings.model_copy(
            update={
                "scheduler_clock_tolerance_ms": years,
                "scheduler_clock_step_tolerance_ms": years,
            }
        )
    engine = SchedulerEngine(settings, clock=clock)
    engine.directory.lock()
    engine._instance = engine.directory.instance_id()
    engine._connect()
    try:
        step_until(
            engine,
            lambda: (
                len([t for t in engine.tasks.values() if t.phase is Phase.READY])
                == settings.partitions
            ),
            "the engine never owned every partition",
        )
        step_until(engine, lambda: engine.stats.transactions > 0, "the claims never committed")
        yield engine
    finally:
        engine._disconnect()
        engine.directory.unlock()


def step_until(
    engine: SchedulerEngine, done: Callable[[], object], message: str, timeout_s: float = 60
) -> None:
    """Step the engine until ``done()`` (checked after each iteration)."""

    def stepped() -> bool:
        engine.step()
        return bool(done())

    wait_until(stepped, scaled(timeout_s), 0, message)


def job_in(partition: int, partitions: int, prefix: str) -> str:
    """A job id starting with ``prefix`` that the requests topic puts on ``partition``."""
    return next(
        j for i in range(10_000) if partition_for(j := f"{prefix}-{i}", partitions) == partition
    )


class SupervisedScheduler:
    """A scheduler run as ``jobwheel up``, Compose's ``restart:`` or Kubernetes run it: when it
    exits with :data:`~jobwheel.watchdog.HUNG_CALL_EXIT_CODE` (a Kafka call that never
    returned, the exit its watchdog chose), :meth:`check` starts it again on the same state
    directory; any other exit fails the test. With ``metrics_port``, a thread records its
    ``/health/live`` answers."""

    def __init__(
        self,
        procs: Procs,
        env: dict[str, str],
        data_dir: Path,
        *,
        metrics_port: int | None = None,
        wait: bool = False,
    ) -> None:
        self.procs, self.env, self.data_dir, self.port = procs, env, data_dir, metrics_port
        self.exits: list[tuple[float, int, Path]] = []  # (monotonic time, code, its log)
        self.live: list[tuple[float, int, str]] = []  # (monotonic time, status, detail)
        self.proc = self._start(wait)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, daemon=True)
        if metrics_port is not None:
            self._thread.start()

    @property
    def log_path(self) -> Path:
        """The log of the scheduler running now (each start writes its own)."""
        return self.proc.log_path  # type: ignore[no-any-return]

    def _start(self, wait: bool = False) -> Any:
        extra = {} if self.port is None else {"JOBWHEEL_METRICS_PORT": str(self.port)}
        return start_scheduler(
            self.procs,
            self.env,
            self.data_dir,
            wait=wait,
            log_name=f"{self.data_dir.name}-{len(self.exits)}",
            extra_env=extra,
        )

    def check(self) -> None:
        """Restart the scheduler if it exited from a hung call; call it in every wait."""
        code = self.proc.poll()
        if code is None:
            return
        self.exits.append((time.monotonic(), code, self.proc.log_path))
        assert code == HUNG_CALL_EXIT_CODE, (
            f"the scheduler exited with {code}:\n{log_tail(self.proc.log_path)}"
        )
        self.proc = self._start()

    def _probe(self) -> None:
        while not self._stop.wait(0.25):
            try:
                url = f"http://127.0.0.1:{self.port}/health/live"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    status, body = resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                status, body = exc.code, exc.read()
            except OSError:
                continue  # not serving (restarting)
            failing = [c["detail"] for c in json.loads(body)["checks"] if not c["ok"]]
            self.live.append((time.monotonic(), status, "; ".join(failing)))

    def last_red(self) -> str:
        """What ``/health/live`` said last when it was red (a wedge names its call there)."""
        red = [detail for _at, status, detail in self.live if status == 503]
        return red[-1] if red else "never red"

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


def two_pool_jobs(n: int, log_a: Path, log_b: Path) -> list[dict[str, Any]]:
    """``n`` one-off jobs on each of the pools ``alpha`` (``a.work``, noting its runs in
    ``log_a``) and ``beta`` (``b.work``, in ``log_b``), interleaved: ``tests.pool_tasks_a``
    and ``tests.pool_tasks_b`` serve them."""
    jobs: list[dict[str, Any]] = []
    for i in range(n):
        jobs.append({"job_id": f"a-{i}", "task": "a.work", "queue": "alpha", "now": True,
                     "args": {"log": str(log_a)}})  # fmt: skip
        jobs.append({"job_id": f"b-{i}", "task": "b.work", "queue": "beta", "now": True,
                     "args": {"log": str(log_b)}})  # fmt: skip
    return jobs
