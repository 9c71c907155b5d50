"""Subcommands of the ``jobwheel`` CLI for ``jobwheel.consumers.worker``: ``jobwheel worker``.

Which tasks a worker can run is configuration by the operator: ``--tasks`` names the modules to
import, and importing them runs their ``@task`` decorators. Nothing in a message can add to that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Collection
from typing import Any

from jobwheel.errors import ConfigError
from jobwheel.signals import on_signals

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add subcommands; each sets ``handler=`` to a function of the parsed args."""
    p = sub.add_parser(
        "worker",
        help="execute runs from the runs topic (one consumer group member)",
        description="Consume the runs topic as a member of JOBWHEEL_WORKER_GROUP, execute the "
        "tasks registered by the --tasks modules and emit status events. Scale out by "
        "starting more processes. SIGTERM/SIGINT stop gracefully (JOBWHEEL_WORKER_SHUTDOWN_"
        "GRACE_MS), then give the broker 10 s to take the verdicts and offsets (exit 1 if it "
        "did not: those runs are delivered again); a second signal hands running runs back "
        "and exits at once. Whatever holds it (a task blocking the event loop, a broker that "
        "does not answer), the worker exits at most 25 s after its grace period.",
    )
    p.add_argument(
        "--tasks",
        required=True,
        metavar="MODULE[,MODULE]",
        help=(
            "comma-separated modules whose @task functions this worker runs, "
            "e.g. jobwheel.consumers.demo"
        ),
    )
    p.add_argument(
        "--queue",
        action="append",
        default=None,
        metavar="NAME",
        help="the queue (worker pool) to serve: its runs topic, in the group "
        "JOBWHEEL_WORKER_GROUP-NAME (JOBWHEEL_WORKER_GROUP for 'default'). Default: the queue "
        "the --tasks modules' tasks name (@task(..., queue=...)), else 'default'. Repeat it to "
        "serve several queues from one process: one pool (group member, --concurrency slots) "
        "per queue",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="N",
        help="runs executing at once in this process (default JOBWHEEL_WORKER_CONCURRENCY)",
    )
    p.set_defaults(handler=_worker)


def load_tasks(modules: str) -> None:
    """Import the task modules; their decorators register into the default registry."""
    from jobwheel.consumers.worker.registry import default_registry

    names = [m.strip() for m in modules.split(",") if m.strip()]
    if not names:
        raise ConfigError(
            "--tasks: give at least one module name, e.g. --tasks jobwheel.consumers.demo"
        )
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(
                f"--tasks: cannot import module {name!r} ({exc}); give importable module "
                "names (on PYTHONPATH), e.g. jobwheel.consumers.demo"
            ) from exc
    if not len(default_registry):
        raise ConfigError(f"--tasks: the modules {names} register no @task functions")


def serving_queues(
    asked: list[str] | None, of_tasks: list[str], known: Collection[str]
) -> list[str]:
    """The queues a worker serves, one pool each: the ones ``--queue`` names, else the ones
    its tasks name (``@task(..., queue=...)``), else ``default``. ``known``: the queues there
    are (``JOBWHEEL_QUEUES`` and those added with ``jobwheel queues add``, a
    :class:`~jobwheel.kafka.queues.QueueDirectory`); any other is refused: it has no runs
    topic, and the scheduler would reject its jobs."""
    from jobwheel.schemas import validation

    names = list(dict.fromkeys(asked)) if asked else list(of_tasks) or ["default"]
    for queue in names:
        try:
            validation.queue(queue)
        except Exception as exc:
            raise ConfigError(f"--queue: {exc}") from None
    unknown = [queue for queue in names if queue not in known]
    if unknown:
        raise ConfigError(
            f"no queue {', '.join(map(repr, unknown))}: the queues are {', '.join(known)}; add "
            f"it with `jobwheel queues add {unknown[0]}` (or declare it in JOBWHEEL_QUEUES, for "
            "the schedulers too, and run `jobwheel topics ensure`)"
        )
    return names


def _worker(args: argparse.Namespace) -> int:
    from jobwheel.consumers.worker.metrics import WorkerCollector
    from jobwheel.consumers.worker.pool import WorkerPool, default_worker_id
    from jobwheel.consumers.worker.registry import default_registry
    from jobwheel.kafka.queues import QueueDirectory, admin_topic_lister
    from jobwheel.settings import get_settings

    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {args.concurrency}")
    load_tasks(args.tasks)
    settings = get_settings()
    # A broker that cannot be asked now is no reason to refuse a queue: the pool waits for
    # the broker like any other, and says so.
    known = QueueDirectory(
        settings, admin_topic_lister(settings, "jobwheel.consumers.worker"), benefit_of_doubt=True
    )
    queues = serving_queues(args.queue, default_registry.queues(), known)
    # One pool per queue, each its own group member on the process's one event loop; each
    # announces itself under its own id (the roster is keyed by worker id).
    base_id = default_worker_id()
    pools = [
        WorkerPool(
            settings,
            default_registry,
            concurrency=args.concurrency,
            queue=queue,
            worker_id=base_id if len(queues) == 1 else f"{base_id}/{queue}",
        )
        for queue in queues
    ]
    uninstall = WorkerCollector(pools).install()  # served when JOBWHEEL_METRICS_PORT is set
    try:
        clean = _run(pools)
    finally:
        uninstall()
    # Verdicts or offsets the broker did not take before the worker gave up (the pool has said
    # which, in one line): a failure, as the CLI reports one, though nothing is lost (those
    # runs are delivered again to another worker).
    code = 1 if any(pool.left_undone for pool in pools) else 0
    threads = _threads_left()
    busy = sum(pool.busy_threads for pool in pools)
    if busy or any(pool.abandoned for pool in pools) or not clean or threads:
        # Task code still running cannot be stopped, and the interpreter would wait for it at
        # exit (sync task threads, async tasks that ignore their cancellation, threads a task
        # started or asyncio.to_thread left behind); their runs were handed back already. A
        # Kafka client call the pool gave up on (broker unreachable) may block for good, and
        # so would destroying its client at exit. Leave without them.
        if busy or not clean or threads:
            log.warning(
                "exiting with task code still running",
                extra={
                    "threads": busy,
                    "tasks": sum(pool.stuck_tasks for pool in pools),
                    "other_threads": threads,
                },
            )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _run(pools: list[Any]) -> bool:
    """Run the pools on an event loop of their own until they stop; True if the loop also closed
    cleanly. Not ``asyncio.run``: task code must not be able to stop the worker or keep it
    from exiting. A task that calls ``loop.stop()`` made ``asyncio.run`` raise (the worker
    died, its run unfinished, and the next worker to get the run died too); and at the end
    ``asyncio.run`` waits for every task to finish its cancellation and for every thread of
    the default executor, which an async task that swallows ``CancelledError`` or a blocked
    ``asyncio.to_thread`` never do."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(_serve(pools))
    while True:
        try:
            loop.run_until_complete(main)
            break
        except RuntimeError:
            if main.done():
                raise
            log.warning("something stopped the worker's event loop (a task?); running it again")
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=1.0))
    stuck = any(not t.done() for t in left)
    if not stuck:
        loop.run_until_complete(loop.shutdown_asyncgens())
    # The default executor's threads (asyncio.to_thread, run_in_executor(None, ...)): not
    # joined here; _threads_left() decides whether the process can exit normally.
    asyncio.set_event_loop(None)
    if stuck:
        return False
    loop.close()
    return True


def _threads_left() -> int:
    """Threads other than this one that would keep the interpreter from exiting: non-daemon
    threads still running (a task's own threads, asyncio.to_thread calls that never return)."""
    me = threading.current_thread()
    # Idle pool threads were told to end when their executors shut down: a moment to do so.
    until = time.monotonic() + 1.0
    left = 0
    for thread in threading.enumerate():
        if thread is me or thread.daemon:
            continue
        thread.join(max(0.0, until - time.monotonic()))
        left += thread.is_alive()
    return left


#: Past its grace period (``JOBWHEEL_WORKER_SHUTDOWN_GRACE_MS``), the most a stopping worker
#: takes to exit, whatever holds it: the hand-back of runs ignoring their cancellation (10 s),
#: the broker's share (10 s), and 5 s for the rest of the way out. Past it the exit watchdog
#: ends the process.
EXIT_BOUND_S = 25.0


class ExitWatchdog:
    """Ends the process when a stop signal was not followed by an exit in time.

    The pool's own shutdown is bounded, but it runs on the event loop: a task that blocks the
    loop (``time.sleep`` in an ``async def``, a CPU-bound loop) kept the worker from ever
    seeing SIGTERM (asyncio hears signals through the loop), so it ran until SIGKILL. The
    signal's Python handler runs on the main thread between two bytecodes, also while the loop
    is blocked, and arms a timer thread; when it expires the producer's queue is purged (its
    verdicts were never acknowledged, so those runs are delivered again to another worker) and
    the process exits 1 after one warning line."""

    def __init__(self, pools: list[Any], bound_s: float = EXIT_BOUND_S) -> None:
        from jobwheel.consumers.worker.pool import WorkerPool

        assert pools and all(isinstance(pool, WorkerPool) for pool in pools)
        self.pools = pools
        self.grace_s = max(pool.grace_s for pool in pools)
        self.bound_s = bound_s
        self._armed = threading.Event()
        self._lock = threading.Lock()

    def arm(self, signum: int) -> None:
        """A stop signal: start the clock once (later signals change nothing here)."""
        with self._lock:
            if self._armed.is_set():
                return
            self._armed.set()
        after = self.grace_s + self.bound_s
        threading.Thread(
            target=self._expire, args=(after, signum), name="jobwheel-exit-watchdog", daemon=True
        ).start()

    def _expire(self, after_s: float, signum: int) -> None:
        time.sleep(after_s)  # a deadline, not a synchronisation: exiting first ends this thread
        log.warning(
            "worker did not exit in time after a stop signal; exiting now",
            extra={
                "signal": signal.Signals(signum).name,
                "waited_s": after_s,
                "grace_s": self.grace_s,
                "bound_s": self.bound_s,
                "loop_stalled_s": round(
                    time.monotonic() - max(pool.turned_at for pool in self.pools), 1
                ),
                "detail": "its event loop is blocked (a task that does not await?) or the "
                "broker does not answer; runs without an acknowledged verdict are delivered "
                "again to another worker",
            },
        )
        for pool in self.pools:
            pool.purge()
        logging.shutdown()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(1)


async def _serve(pools: list[Any]) -> None:
    """Every pool until it stops. A stop signal stops them all; a pool that ends by itself (a
    fatal error) stops the others too, gracefully, and its error ends the process."""
    loop = asyncio.get_running_loop()
    watchdog = ExitWatchdog(pools)

    def stop() -> None:
        for pool in pools:
            pool.stop()  # a second signal: a second stop, which hurries each pool

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    # After asyncio's: the loop still hears the signals (the wakeup fd is asyncio's), and the
    # Python-level handler, which asyncio leaves a no-op, arms the watchdog (from a thread of its
    # own: arming takes locks the interrupted main thread may hold).
    on_signals((signal.SIGTERM, signal.SIGINT), watchdog.arm)
    runs = [asyncio.ensure_future(pool.run()) for pool in pools]
    await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
    for pool in pools:
        if not pool.stopping:
            pool.stop()
    await asyncio.gather(*runs)
