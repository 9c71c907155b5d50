"""The status sink's blocking Kafka calls are bounded: a broker frozen (SIGSTOP) while the sink
commits leaves its synchronous offset commit waiting (librdkafka gives it no timeout; only the
request's own, a minute, would end it), and the sink must not hold its partitions meanwhile.
With ``JOBWHEEL_STATUS_CALL_DEADLINE_MS`` it exits with the hung-call code; started again once
the broker is back, it commits every record. On a broker of the test's own (the session's broker
is shared)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from jobwheel.deploy.broker import LocalBroker
from jobwheel.kafka.admin import ensure_topics
from jobwheel.settings import Settings
from jobwheel.watchdog import HUNG_CALL_EXIT_CODE
from tests.conftest import settings_env
from tests.status_support import committed, lifecycle, now_ms, produce
from tests.support import Procs, log_tail, scaled, wait_until


def test_a_sink_commit_that_never_returns_ends_the_process(
    own_broker: LocalBroker, procs: Procs, tmp_path: Path
) -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=own_broker.bootstrap,
        topic_prefix="sinkwedge",
        partitions=2,
        data_dir=tmp_path / "data",
    )
    ensure_topics(settings)
    env = {
        **settings_env(settings),
        "JOBWHEEL_STATUS_BATCH_SIZE": "100",
        "JOBWHEEL_STATUS_BATCH_MS": "20",
        "JOBWHEEL_STATUS_CALL_DEADLINE_MS": "3000",
    }
    t0 = now_ms()
    events = [e for i in range(2000) for e in lifecycle(f"k-{i}", t0 + i)]  # 12,000
    produce(settings, events)

    log = tmp_path / "sink.log"
    sink = procs.spawn(["jobwheel", "sink"], env, log)
    wait_until(
        lambda: committed(settings) >= 400 or sink.poll() is not None,
        scaled(90),
        interval_s=0.02,
        message="the sink committed nothing:\n" + log_tail(log),
    )
    assert sink.poll() is None, log_tail(log)
    pid = own_broker.running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the sink goes on with what it fetched; its commit waits
    try:
        wait_until(
            lambda: sink.poll() is not None,
            scaled(30),
            0.1,
            "the sink is still blocked in a Kafka call with the broker frozen:\n"
            + log_tail(log, 10),
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert sink.returncode == HUNG_CALL_EXIT_CODE, log_tail(log)
    text = log.read_text()
    assert text.count(f"exits with code {HUNG_CALL_EXIT_CODE}") == 1, log_tail(log)
    assert "JOBWHEEL_STATUS_CALL_DEADLINE_MS" in text
    assert committed(settings) < len(events), "the freeze came too late to be mid-stream"

    # Started again (as its supervisor would): nothing is lost.
    log2 = tmp_path / "sink-2.log"
    env = {k: v for k, v in env.items() if not k.startswith("JOBWHEEL_STATUS_BATCH")}
    again = procs.spawn(["jobwheel", "sink"], env, log2)
    wait_until(
        lambda: committed(settings) == len(events) or again.poll() is not None,
        scaled(180),
        0.5,
        "the restarted sink did not commit every record",
    )
    assert again.poll() is None, log_tail(log2)
