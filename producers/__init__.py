"""The client SDK other services use to schedule jobs, and the submit CLI.

    from jobwheel.producers import JobClient

    with JobClient(get_settings()) as client:
        job_id = client.schedule(task="billing.send", args={"id": 7}, in_=timedelta(hours=1))

The names are imported lazily so ``jobwheel --help`` does not load confluent-kafka.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobwheel.producers.client import AsyncJobClient, JobClient, JobSpec

__all__ = ["AsyncJobClient", "JobClient", "JobSpec"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from jobwheel.producers import client

        return getattr(client, name)
    raise AttributeError(f"module 'jobwheel.producers' has no attribute {name!r}")
