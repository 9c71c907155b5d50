"""The status service's memory budget reaches what it bounds: the embedded engine's server
settings (its memory limit and caches), the sink's consumer fetch queue and its batch size.
Resident memory itself is measured by the benchmarks (BENCHMARKS.md), never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jobwheel.consumers.status.memory import StatusMemory
from jobwheel.consumers.status.sink import StatusSink, consumer_config
from jobwheel.settings import Settings
from tests.support import scaled

#: Opens the store as `jobwheel sink` does and prints the engine's own view of its settings.
_PROBE = """
import json, sys
from jobwheel.consumers.status.memory import StatusMemory
from jobwheel.consumers.status.store import StatusStore
from jobwheel.settings import get_settings

settings = get_settings()
store = StatusStore.from_settings(settings, migrate=False)
names = list(StatusMemory.from_settings(settings).engine_options())
rows = store.client.query(
    "SELECT name, value FROM system.server_settings WHERE name IN {names:Array(String)}",
    parameters={"names": names},
).result_rows
print(json.dumps(dict(rows)))
sys.stdout.flush()
"""


def test_the_memory_budget_reaches_the_embedded_engine(tmp_path: Path) -> None:
    """In a process of its own: an embedded engine takes server settings only when it starts,
    and this test process's engine was started by other tests. Without the budget the engine
    sizes itself for the machine (a 5 GiB mark cache, a limit of 90 % of RAM)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWHEEL_")}
    env |= {"JOBWHEEL_DATA_DIR": str(tmp_path), "JOBWHEEL_STATUS_MEMORY_MIB": "640"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    actual = json.loads(done.stdout.strip().splitlines()[-1])
    wanted = StatusMemory(640).engine_options()
    assert actual == wanted
    assert int(actual["max_server_memory_usage"]) == 200 * 1024 * 1024
    assert int(actual["mark_cache_size"]) == 20 * 1024 * 1024


def test_the_sink_batch_and_fetch_queue_are_shares_of_the_budget() -> None:
    """A batch of 50,000 decoded rows is some 50 MiB of Python objects, and two are alive under
    load; librdkafka prefetches 64 MiB by default while the sink is behind."""
    settings = Settings(_env_file=None, status_memory_mib=512, status_batch_size=50_000)  # type: ignore[call-arg]
    sink = StatusSink(settings, store=None)  # type: ignore[arg-type]
    assert sink.batch_size == 512 * 32
    assert consumer_config(settings)["queued.max.messages.kbytes"] == 512 * 1024 // 32
    smaller = Settings(_env_file=None, status_memory_mib=512, status_batch_size=1000)  # type: ignore[call-arg]
    assert StatusSink(smaller, store=None).batch_size == 1000  # type: ignore[arg-type]


def test_the_fetch_queue_can_still_be_set_through_the_pass_through() -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        status_kafka_consumer_config={"queued.max.messages.kbytes": 4096},
    )
    assert consumer_config(settings)["queued.max.messages.kbytes"] == 4096
