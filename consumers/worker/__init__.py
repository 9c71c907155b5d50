"""The worker pool: task registry, executor and the runs-topic consumer loop.

Task authors need only this package's top level::

    from jobwheel.consumers.worker import task, current_run, heartbeat, Backoff
    from jobwheel.errors import Retry
"""

from jobwheel.consumers.worker.backoff import Backoff
from jobwheel.consumers.worker.context import current_run, heartbeat
from jobwheel.consumers.worker.registry import TaskRegistry, default_registry, task

__all__ = ["Backoff", "TaskRegistry", "current_run", "default_registry", "heartbeat", "task"]
