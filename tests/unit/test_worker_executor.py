"""The executor: what a task's behaviour turns into in the SUCCEEDED/FAILED status event."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from jobwheel.consumers.worker.backoff import Backoff
from jobwheel.consumers.worker.context import current_run, heartbeat
from jobwheel.consumers.worker.executor import Executor, Outcome, decode_args, result_to_json
from jobwheel.consumers.worker.registry import TaskRegistry
from jobwheel.errors import Retry, TaskError
from jobwheel.schemas.models import Run, State
from jobwheel.schemas.validation import MAX_DURATION_MS
from tests.tasks import Abort, Opaque, Unprintable

RUN = Run(
    run_id="job-1@1000",
    job_id="job-1",
    task="t",
    args_json="{}",
    seq=3,
    scheduled_time_ms=1_000,
    dispatched_at_ms=1_001,
    attempt=1,
    max_attempts=3,
    timeout_ms=None,
    visibility_timeout_ms=30_000,
    deadline_ms=31_001,
    partition=0,
    fencing_token=1,
)


class FixedRandom:
    def random(self) -> float:
        return 0.0


@pytest.fixture
def threads() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(4)
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


def run_task(
    registry: TaskRegistry, threads: ThreadPoolExecutor, run: Run, hb=lambda: None
) -> Outcome:
    executor = Executor(registry, threads, rng=FixedRandom())
    return asyncio.run(executor.execute(run, heartbeat=hb))


def test_sync_task_gets_object_args_as_kwargs(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()
    seen: list[str] = []

    @reg.task("t")
    def add(a: int, b: int) -> dict:
        seen.append(threading.current_thread().name)
        return {"sum": a + b}

    out = run_task(reg, threads, replace(RUN, args_json='{"a": 2, "b": 3}'))
    assert out.state is State.SUCCEEDED
    assert json.loads(out.result_json) == {"sum": 5}
    assert seen and seen[0] != threading.main_thread().name  # ran in the thread pool
    assert out.error is None and out.retry_delay_ms is None


def test_async_task_gets_list_args_as_positional(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t")
    async def join(*parts: str) -> str:
        await asyncio.sleep(0)
        return "-".join(parts)

    out = run_task(reg, threads, replace(RUN, args_json='["a", "b", "c"]'))
    assert out.state is State.SUCCEEDED
    assert json.loads(out.result_json) == "a-b-c"


def test_decode_args_shapes() -> None:
    assert decode_args('{"x": 1}') == ((), {"x": 1})
    assert decode_args("[1, 2]") == ((1, 2), {})
    assert decode_args("null") == ((), {})
    assert decode_args("") == ((), {})
    assert decode_args("7") == ((7,), {})


def test_current_run_is_visible_to_sync_and_async_tasks(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("sync")
    def sync_attempt() -> int:
        return current_run().attempt

    @reg.task("async")
    async def async_attempt() -> str:
        return current_run().run_id

    out = run_task(reg, threads, replace(RUN, task="sync", attempt=2))
    assert out.result_json == "2"
    out = run_task(reg, threads, replace(RUN, task="async"))
    assert json.loads(out.result_json) == RUN.run_id
    with pytest.raises(TaskError, match="outside a running task"):
        current_run()


def test_explicit_heartbeat_reaches_the_pool_callback(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()
    beats: list[int] = []

    @reg.task("t")
    def beating() -> None:
        heartbeat()
        heartbeat()

    run_task(reg, threads, RUN, hb=lambda: beats.append(1))
    assert beats == [1, 1]


def test_failure_before_the_last_attempt_carries_the_backoff(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t", backoff=Backoff(base_ms=100, factor=2, max_ms=10_000, jitter=0.5))
    def boom() -> None:
        raise RuntimeError("smtp down")

    out = run_task(reg, threads, replace(RUN, attempt=2))
    assert out.state is State.FAILED
    assert out.error == "RuntimeError: smtp down"
    assert out.retry_delay_ms == 200  # FixedRandom draws 0: no shortening
    assert "attempt 2 of 3" in out.reason


def test_failure_on_the_last_attempt_is_not_retried(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t")
    def boom() -> None:
        raise ValueError("bad")

    out = run_task(reg, threads, replace(RUN, attempt=3))
    assert out.state is State.FAILED
    assert out.retry_delay_ms is None
    assert "exhausted" in out.reason


def test_task_max_attempts_lowers_the_run_limit(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t", max_attempts=1)
    def boom() -> None:
        raise ValueError("bad")

    out = run_task(reg, threads, replace(RUN, attempt=1, max_attempts=5))
    assert out.retry_delay_ms is None


def test_retry_exception_chooses_the_delay(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t")
    async def later() -> None:
        raise Retry(delay_ms=12_345, reason="rate limited")

    out = run_task(reg, threads, RUN)
    assert out.state is State.FAILED
    assert out.retry_delay_ms == 12_345
    assert "rate limited" in out.reason
    assert out.error == "Retry: rate limited"
    # ... but never past the attempt limit
    out = run_task(reg, threads, replace(RUN, attempt=3))
    assert out.retry_delay_ms is None


def test_async_task_over_the_run_timeout_fails_retryably(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t", timeout=60)
    async def slow() -> None:
        await asyncio.sleep(30)

    # The run's limit wins: with the task's 60 s the 30 s sleep would end SUCCEEDED.
    out = run_task(reg, threads, replace(RUN, timeout_ms=100))
    assert out.state is State.FAILED
    assert out.error.startswith("TimeoutError: ")
    assert "100 ms" in out.error
    assert out.retry_delay_ms is not None


def test_sync_task_over_the_task_timeout_fails_and_reports_its_thread(
    threads: ThreadPoolExecutor,
) -> None:
    reg = TaskRegistry()
    release = threading.Event()

    @reg.task("t", timeout=0.1)
    def stuck() -> None:
        release.wait(10)

    out = run_task(reg, threads, RUN)
    assert out.state is State.FAILED
    assert out.error.startswith("TimeoutError: ")
    assert out.lingering is not None and not out.lingering.done()
    release.set()
    out.lingering.result(timeout=5)


def test_a_timeout_error_raised_by_the_task_itself_is_an_ordinary_failure(
    threads: ThreadPoolExecutor,
) -> None:
    reg = TaskRegistry()

    @reg.task("t", timeout=60)
    async def raises() -> None:
        raise TimeoutError("upstream timed out")

    out = run_task(reg, threads, RUN)
    assert out.error == "TimeoutError: upstream timed out"
    assert out.reason.startswith("task raised an exception")


def test_unknown_task_fails_without_retry(threads: ThreadPoolExecutor) -> None:
    out = run_task(TaskRegistry(), threads, replace(RUN, task="nope", queue="reports"))
    assert out.state is State.FAILED
    assert out.retry_delay_ms is None
    assert "unknown task 'nope'" in out.reason
    assert "on queue 'reports'" in out.reason  # which pool lacks it
    assert out.error.startswith("TaskError: ")


def test_arguments_that_cannot_fit_fail_without_retry(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()
    called: list[int] = []

    @reg.task("t")
    def needs_a(a: int) -> None:
        called.append(a)

    out = run_task(reg, threads, replace(RUN, args_json='{"b": 1}'))
    assert out.retry_delay_ms is None and "signature" in out.reason
    out = run_task(reg, threads, replace(RUN, args_json="{not json"))
    assert out.retry_delay_ms is None and "not valid JSON" in out.reason
    assert called == []


def test_sys_exit_in_a_task_is_a_failure_not_a_worker_exit(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t")
    def leave() -> None:
        raise SystemExit(3)

    @reg.task("a")
    async def interrupt() -> None:
        raise KeyboardInterrupt("from the task")

    out = run_task(reg, threads, RUN)
    assert out.state is State.FAILED and out.error == "SystemExit: 3"
    assert out.retry_delay_ms is not None  # the task's failure: its retry policy applies
    out = run_task(reg, threads, replace(RUN, task="a"))
    assert out.state is State.FAILED and out.error == "KeyboardInterrupt: from the task"
    assert out.retry_delay_ms is not None


def test_big_results_are_truncated_to_valid_json() -> None:
    text = result_to_json({"blob": "é" * 10_000}, limit=4096)
    assert len(text.encode()) <= 4096
    parsed = json.loads(text)
    assert parsed["truncated"] is True and parsed["bytes"] > 4096
    assert result_to_json({"ok": 1}) == '{"ok":1}'
    assert json.loads(result_to_json({"when": object})) == {"when": str(object)}


def test_long_errors_are_truncated(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t")
    def boom() -> None:
        raise RuntimeError("x" * 10_000)

    out = run_task(reg, threads, RUN)
    assert out.error.startswith("RuntimeError: xxx") and len(out.error) <= 2048


def test_texts_utf8_cannot_carry_are_escaped_in_the_outcome(threads: ThreadPoolExecutor) -> None:
    """A file name whose bytes are not UTF-8 reaches Python as a lone surrogate; in a task's
    error, reason or result it would make the verdict impossible to encode. It becomes its
    escape: readable in the error, and the same value again when the result's JSON is read."""
    name = os.fsdecode(b"report-\xff.txt")
    reg = TaskRegistry()

    @reg.task("t")
    def missing() -> None:
        raise FileNotFoundError(name)

    @reg.task("r")
    def found() -> dict[str, str]:
        return {"name": name}

    failed = run_task(reg, threads, RUN)
    assert failed.error == "FileNotFoundError: report-\\udcff.txt"
    succeeded = run_task(reg, threads, replace(RUN, task="r"))
    assert succeeded.result_json is not None and json.loads(succeeded.result_json) == {"name": name}
    retry = Outcome(State.FAILED, 1, error="e", reason=f"asked: {name}", retry_delay_ms=5)
    assert retry.reason == "asked: report-\\udcff.txt"
    for text in (failed.error, succeeded.result_json, retry.reason):
        text.encode("utf-8")  # what the verdict's record needs


def test_an_exception_whose_str_raises_is_still_a_retryable_failure(
    threads: ThreadPoolExecutor,
) -> None:
    """The task's own ``__str__`` raising must not take the verdict with it: the failure is
    named by its type and goes through the retry policy like any other."""
    reg = TaskRegistry()

    @reg.task("t")
    async def raises() -> None:
        raise Unprintable()

    @reg.task("s")
    def raises_sync() -> None:
        raise Unprintable()

    for name in ("t", "s"):
        out = run_task(reg, threads, replace(RUN, task=name))
        assert out.state is State.FAILED
        assert out.error == "Unprintable: <str() of this exception raised RuntimeError>"
        assert out.retry_delay_ms is not None
        assert out.reason.startswith("task raised an exception")


def test_a_result_no_text_can_describe_still_succeeds(threads: ThreadPoolExecutor) -> None:
    """A value neither JSON, ``str()`` nor ``repr()`` can print (the task's own classes, an int
    past the digits ``str()`` converts): the run succeeded, and its result says what it was."""
    opaque = "<dict object: repr() raised RuntimeError>"
    assert json.loads(result_to_json({"v": Opaque()})) == opaque
    assert json.loads(result_to_json(Opaque())) == "<Opaque object: repr() raised RuntimeError>"
    assert json.loads(result_to_json({"v": 10**5000})) == "<dict object: repr() raised ValueError>"
    loop: list[object] = []
    loop.append(loop)
    assert json.loads(result_to_json(loop)) == "[[...]]"
    reg = TaskRegistry()

    @reg.task("t")
    async def opaque() -> object:
        return Opaque()

    out = run_task(reg, threads, RUN)
    assert out.state is State.SUCCEEDED
    assert json.loads(out.result_json) == "<Opaque object: repr() raised RuntimeError>"


def test_a_cancelled_error_from_the_task_itself_is_an_ordinary_failure(
    threads: ThreadPoolExecutor,
) -> None:
    """An async task awaiting something another party cancelled gets ``CancelledError`` while
    nobody cancelled the task: that is the task failing, retried by its policy, not the
    worker stopping it (which would leave the run without a verdict)."""
    reg = TaskRegistry()

    @reg.task("t")
    async def awaits_a_cancelled_future() -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    out = run_task(reg, threads, RUN)
    assert out.state is State.FAILED
    assert out.error == "CancelledError"
    assert out.retry_delay_ms is not None


def test_a_task_cancelled_by_its_caller_stays_cancelled(threads: ThreadPoolExecutor) -> None:
    """The other side of the rule above: when the worker cancels the run (hand-back on
    shutdown), the cancellation reaches the caller rather than becoming a verdict."""
    reg = TaskRegistry()
    started = asyncio.Event()

    @reg.task("t")
    async def waits() -> None:
        started.set()
        await asyncio.sleep(60)

    async def main() -> None:
        executor = Executor(reg, threads, rng=FixedRandom())
        task = asyncio.create_task(executor.execute(RUN, heartbeat=lambda: None))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_a_base_exception_from_a_task_is_its_failure(threads: ThreadPoolExecutor) -> None:
    """Not only Exception: whatever a task raises is its failure, retried by its policy, in
    async and sync tasks alike (before, an async one left its run without a verdict)."""
    reg = TaskRegistry()

    @reg.task("t")
    async def aborts() -> None:
        raise Abort("stop")

    @reg.task("s")
    def aborts_sync() -> None:
        raise Abort("stop")

    for name in ("t", "s"):
        out = run_task(reg, threads, replace(RUN, task=name))
        assert out.state is State.FAILED and out.error == "Abort: stop"
        assert out.retry_delay_ms is not None


def test_a_retry_delay_is_whole_milliseconds_within_the_largest_duration(
    threads: ThreadPoolExecutor,
) -> None:
    """A float (2.5 * 1000) or a number past the largest duration could not be encoded: the
    verdict was lost and the partition stalled. A delay that is not a number fails the task
    with a message naming it."""
    reg = TaskRegistry()
    delays: list[object] = []

    @reg.task("t")
    def retries() -> None:
        raise Retry(delay_ms=delays[-1])  # type: ignore[arg-type]

    for given, carried in (
        (1500.5, 1501),
        (10**20, MAX_DURATION_MS),
        (float("inf"), MAX_DURATION_MS),
        (-3, 0),
    ):
        delays.append(given)
        out = run_task(reg, threads, RUN)
        assert out.retry_delay_ms == carried, given
        assert f"retry in {carried} ms" in out.reason
    delays.append("5s")
    out = run_task(reg, threads, RUN)
    assert out.error.startswith("TypeError: Retry(delay_ms=...) takes a number of milliseconds")
    assert Outcome(State.FAILED, 0, retry_delay_ms=float("nan")).retry_delay_ms == 0  # type: ignore[arg-type]


def test_a_retry_reason_past_the_record_size_is_cut(threads: ThreadPoolExecutor) -> None:
    reg = TaskRegistry()

    @reg.task("t")
    def retries() -> None:
        raise Retry(reason="x" * 2_000_000)

    out = run_task(reg, threads, RUN)
    assert out.reason.startswith("task asked for a retry: xxx") and len(out.reason) <= 2048


def test_a_plain_function_returning_a_coroutine_is_not_a_success(
    threads: ThreadPoolExecutor,
) -> None:
    """An async function behind a decorator that kept ``functools.wraps`` runs as async; one
    that did not, or a plain function returning a coroutine, fails without retry and says why
    (before: SUCCEEDED, its result the coroutine's repr, its body never run)."""
    ran: list[str] = []

    async def body() -> str:
        ran.append("body")
        return "done"

    def kept(fn):  # type: ignore[no-untyped-def]
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            return fn(*args, **kwargs)

        return wrapper

    class Callable_:
        async def __call__(self) -> str:
            ran.append("call")
            return "called"

    reg = TaskRegistry()
    reg.task("kept")(kept(body))
    reg.task("object")(Callable_())
    reg.task("lost")(lambda: body())
    assert reg.get("kept").is_async and reg.get("object").is_async and not reg.get("lost").is_async
    assert run_task(reg, threads, replace(RUN, task="kept")).result_json == '"done"'
    assert run_task(reg, threads, replace(RUN, task="object")).result_json == '"called"'
    lost = run_task(reg, threads, replace(RUN, task="lost"))
    assert lost.state is State.FAILED and lost.retry_delay_ms is None
    assert "declare it `async def`" in lost.reason
    assert ran == ["body", "call"]


def test_logging_survives_a_task_that_closed_or_replaced_stderr(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Tasks run in the worker's process: one that closed sys.stderr made the worker's next
    log line raise (ValueError: I/O operation on closed file) and the worker died. The line
    goes to the process's own stderr instead."""
    import io
    import logging

    from jobwheel.logs import ServiceHandler

    handler = ServiceHandler()
    logger = logging.getLogger("test.closed_stderr")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        closed = io.StringIO()
        closed.close()
        monkeypatch.setattr("sys.stderr", closed)
        logger.warning("still written")
        monkeypatch.setattr("sys.stderr", None)
        logger.warning("written again")

        class Broken(io.StringIO):
            def write(self, _text: str) -> int:
                raise ValueError("this stream refuses")

        monkeypatch.setattr("sys.stderr", Broken())
        logger.warning("lost, not raised")  # the handler's own error report fails too
    finally:
        logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert "still written" in err and "written again" in err
