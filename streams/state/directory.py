"""The scheduler's state directory: who this instance is, and one database per partition.

Layout under ``<JOBWHEEL_DATA_DIR>/scheduler/<scheduler app id>/``:

- ``LOCK``: held (``flock``) for as long as the scheduler runs, so two processes never share a
  directory (they would claim the same transactional id and fence each other in turn).
- ``instance-id``: a random id made on first start and kept, as Kafka Streams keeps its process
  id. The transactional id is ``<app id>-<instance id>``: stable across restarts on the same disk
  (a restarted scheduler fences its own predecessor and aborts its open transaction at once), and
  distinct between instances.
- ``partition-<p>/``: the RocksDB database of partition ``p``
(:mod:`jobwheel.streams.state.partition`),
  kept when the partition moves away, so that getting it back replays only the changelog's tail.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from pathlib import Path
from typing import IO

from jobwheel.errors import ConfigError


class StateDirectory:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._lock: IO[bytes] | None = None

    def lock(self) -> None:
        """Take the directory for this process, or raise :class:`ConfigError` naming it."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle = (self.root / "LOCK").open("ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            raise ConfigError(
                f"another scheduler is running with the state directory {self.root}; give each "
                "scheduler process its own JOBWHEEL_DATA_DIR"
            ) from exc
        self._lock = handle

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def instance_id(self) -> str:
        path = self.root / "instance-id"
        try:
            value = path.read_text().strip()
        except FileNotFoundError:
            value = ""
        if not value:
            value = uuid.uuid4().hex[:12]
            tmp = path.with_suffix(".tmp")
            tmp.write_text(value + "\n")
            os.replace(tmp, path)
        return value

    def partition(self, partition: int) -> Path:
        return self.root / f"partition-{partition}"
