"""What every benchmark stands on: a Kafka broker to run against.

``--start-broker`` runs a throwaway local broker (the same JVM broker the tests use) in a temp
dir; otherwise the benchmark uses ``--bootstrap`` or the configured bootstrap servers.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from jobwheel.settings import Settings


@contextlib.contextmanager
def broker(start: bool, bootstrap: str | None) -> Iterator[str]:
    """Yield the bootstrap servers of the broker to benchmark against."""
    if not start:
        yield bootstrap or Settings().bootstrap_servers
        return
    from jobwheel.deploy.broker import LocalBroker, free_port

    with tempfile.TemporaryDirectory(prefix="jobwheel-bench-") as tmp:
        local = LocalBroker(Path(tmp), port=free_port(), controller_port=free_port(), heap="512m")
        local.start(die_with_parent=True)
        try:
            yield local.bootstrap
        finally:
            local.stop()
