"""jobwheel: a distributed job scheduler on Apache Kafka.

This package is the one import root: ``jobwheel.schemas`` (the wire contract),
``jobwheel.producers`` (the client SDK), ``jobwheel.streams`` (the scheduler),
``jobwheel.consumers`` (workers, status) and ``jobwheel.deploy``; its own modules are the shared
kernel (settings, errors, clock, logs, the CLI entry point). The SDK's names are
re-exported lazily, so ``from jobwheel import JobClient`` works on the base install and
``import jobwheel`` loads nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobwheel.producers.client import AsyncJobClient, JobClient, JobSpec

__version__ = "0.1.0"
__all__ = ["AsyncJobClient", "JobClient", "JobSpec"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from jobwheel.producers import client

        return getattr(client, name)
    raise AttributeError(f"module 'jobwheel' has no attribute {name!r}")
