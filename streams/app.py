"""``jobwheel scheduler``: run one scheduler process until SIGTERM or SIGINT.

The work is done by :class:`jobwheel.streams.engine.SchedulerEngine`; this module only prepares the
topics, installs the signal handlers and turns a clean stop into exit code 0. A first signal
finishes the current iteration (committed), hands the partitions back to the group and exits; a
second one exits at once (nothing uncommitted is lost either way: the transaction in flight is
aborted by the broker and its batch is processed again by the next owner).
"""

from __future__ import annotations

import logging
import os
import signal

from jobwheel.kafka.replication import ReplicationCollector
from jobwheel.settings import Settings
from jobwheel.signals import on_signals
from jobwheel.streams.engine import SchedulerEngine
from jobwheel.streams.metrics import SchedulerCollector

log = logging.getLogger(__name__)


def run_scheduler(settings: Settings) -> int:
    from jobwheel.kafka.admin import configure_scheduler_group, ensure_topics

    ensure_topics(settings)
    configure_scheduler_group(settings)
    engine = SchedulerEngine(settings)
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            log.warning("second signal: exiting now", extra={"signal": signum})
            os._exit(1)
        log.info("stopping: finishing the current transaction", extra={"signal": signum})
        engine.stop()

    restore = on_signals((signal.SIGTERM, signal.SIGINT), on_signal)
    uninstall = SchedulerCollector(engine).install()  # served when JOBWHEEL_METRICS_PORT is set
    # The topics' replication (under-replicated, offline partitions), asked at scrape time.
    uninstall_replication = ReplicationCollector(settings).install()
    try:
        engine.run()
    finally:
        uninstall_replication()
        uninstall()
        restore()
    return 0
