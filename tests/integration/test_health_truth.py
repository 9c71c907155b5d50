"""`jobwheel health` on the real broker: what it says of scheduler partitions nobody has
committed yet, and that it never dies of a signal while the broker starts, stops or restarts."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from jobwheel.consumers.status import cluster
from jobwheel.consumers.status.cli import _check_broker, _check_scheduler_partitions
from jobwheel.deploy.broker import LocalBroker, free_port
from jobwheel.kafka.admin import ensure_topics
from jobwheel.settings import Settings
from tests.conftest import settings_env
from tests.integration.scheduler_support import now_ms
from tests.support import BROKER_JVM_ARGS, Procs, jobwheel_argv, log_tail, wait_until


def test_a_partition_never_committed_is_stuck_only_once_its_oldest_input_has_waited(
    settings: Settings,
) -> None:
    """No scheduler has ever committed (none runs). A request that arrived just now is work a
    starting scheduler will claim within seconds, not a stall; one that has waited longer than
    the stuck threshold is. Before, both partitions were called stuck the moment they had input.

    The requests topic stamps records with the broker's time (LogAppendTime), so the old
    request really waits: the threshold is 3 s and the fresh request is sent once the old one's
    broker time is past it."""
    settings = settings.model_copy(update={"health_stuck_after_ms": 3_000})
    producer = Producer(settings.librdkafka("producer"))
    appended: list[int] = []
    producer.produce(
        settings.topics.requests,
        b"old",
        b"k",
        partition=2,
        on_delivery=lambda err, msg: appended.append(msg.timestamp()[1]),
    )
    assert producer.flush(30) == 0 and appended
    wait_until(
        lambda: now_ms() > appended[0] + 4_000,
        10,
        message="the clock never passed the old request's broker time plus 4 s",
    )
    producer.produce(settings.topics.requests, b"fresh", b"k", partition=1)
    assert producer.flush(30) == 0

    # Topics made a moment ago can answer NOT_LEADER for a while: asked again until they do.
    rows, _ = wait_until(
        lambda: (found := cluster.scheduler_progress(settings, 10.0))[1] is None and found,
        30,
        message="the scheduler group's offsets could not be read",
    )
    by_partition = {r.partition: r for r in rows}
    assert (by_partition[1].unread, by_partition[2].unread) == (1, 1)
    assert by_partition[1].stuck is None, by_partition[1].stuck
    assert by_partition[2].stuck is not None and "the oldest waiting " in by_partition[2].stuck
    assert [r.partition for r in rows if r.stuck] == [2]

    ok, detail = _check_scheduler_partitions(settings, 10.0)
    assert not ok and "partition 2: " in detail and "partition 1: " not in detail, detail


#: The health command's own function called over and over in one process (the way the API
#: server's console asks for the group views on every page): what librdkafka's crashes need
#: is many group-coordinator requests in one process while the broker comes and goes. Each
#: round is counted in a file; the loop ends when the stop file appears.
_HEALTH_LOOP = """
import argparse, contextlib, io, pathlib, sys
from jobwheel.consumers.status.cli import health
rounds, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = 0
while not stop.exists():
    with contextlib.redirect_stdout(io.StringIO()):
        health(argparse.Namespace(timeout=1.0, json=True))
    n += 1
    rounds.write_text(str(n))
"""


def test_a_count_of_partitions_other_than_the_topics_is_named_with_its_fix(
    settings: Settings,
) -> None:
    """`jobwheel health` run where JOBWHEEL_PARTITIONS is left at another count than the
    deployment's topics (the default 12 against topics made with 4) says so and names the
    setting, instead of failing its per-partition checks on partitions that are not there."""
    ok, detail = _check_broker(settings, 10.0)
    assert ok, detail  # the same count: the broker check passes
    other = settings.model_copy(update={"partitions": 12})
    ok, detail = _check_broker(other, 10.0)
    assert not ok
    assert f"has {settings.partitions} partitions but JOBWHEEL_PARTITIONS is 12" in detail
    assert f"set JOBWHEEL_PARTITIONS={settings.partitions}" in detail


@pytest.mark.timeout(900)
def test_health_never_dies_of_a_signal_while_the_broker_starts_stops_and_restarts(
    tmp_path: Path, procs: Procs
) -> None:
    """`jobwheel health` polled while `jobwheel up` started died once of SIGSEGV in
    librdkafka: its group-coordinator requests (describe a group, list a group's offsets)
    abort or crash the process that makes them while the broker stops or starts. The health
    command, in a loop of its own processes and in a loop inside one process, runs through a
    broker starting, stopping and restarting twice: every run ends 0 or 1 (the documented
    'something is not fine'), never by a signal."""
    broker = LocalBroker(
        tmp_path / "kafka",
        port=free_port(),
        controller_port=free_port(),
        heap="256m",
        jvm_options=BROKER_JVM_ARGS,
    )
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        bootstrap_servers=broker.bootstrap,
        data_dir=tmp_path / "data",
        topic_prefix="hl",
        partitions=2,
        replication_factor=1,
    )
    env = settings_env(settings)
    rounds, stop_file = tmp_path / "rounds", tmp_path / "stop"
    looping = procs.spawn(
        [sys.executable, "-c", _HEALTH_LOOP, str(rounds), str(stop_file)],
        env,
        tmp_path / "loop.log",
    )
    codes: list[tuple[str, int]] = []
    phase = ["down"]
    done = threading.Event()

    def commands() -> None:
        while not done.is_set():
            run = subprocess.run(
                jobwheel_argv(["jobwheel", "health", "--timeout", "1"]),
                env=env,
                capture_output=True,
            )
            codes.append((phase[0], run.returncode))

    polling = threading.Thread(target=commands, daemon=True)
    polling.start()

    def loop_rounds() -> int:
        return int(rounds.read_text() or 0) if rounds.exists() else 0

    def through(name: str, action: Callable[[], object]) -> None:
        """Run ``action`` (a broker start or stop) while both loops keep asking, and see each
        of them finish rounds after it."""
        phase[0] = name
        action()
        seen = (loop_rounds(), sum(1 for p, _ in codes if p == name))
        wait_until(
            lambda: (
                looping.poll() is not None
                or (
                    loop_rounds() > seen[0] + 2
                    and sum(1 for p, _ in codes if p == name) > seen[1] + 1
                )
            ),
            120,
            message=f"the health loops made no progress after the broker's {name}",
        )
        assert looping.poll() is None, (
            f"the health loop died after the broker's {name}: exit {looping.returncode}\n"
            f"{log_tail(tmp_path / 'loop.log')}"
        )

    try:
        through("start", lambda: broker.start(die_with_parent=True))
        ensure_topics(settings)  # so that every check runs, the group checks included
        for cycle in (1, 2):
            through(f"stop {cycle}", broker.stop)
            through(f"restart {cycle}", lambda: broker.start(die_with_parent=True))
    finally:
        done.set()
        stop_file.touch()
        polling.join(60)
        broker.stop(timeout_s=10)
    assert looping.wait(60) == 0, log_tail(tmp_path / "loop.log")
    signalled = [(p, c) for p, c in codes if c not in (0, 1)]
    assert not signalled, f"health runs ended by a signal or an odd code: {signalled}"
    assert {p for p, _ in codes} >= {"start", "stop 1", "restart 1", "stop 2", "restart 2"}
