"""The one backoff of jobwheel's own retry loops (a transaction the scheduler must redo, a status
insert, a status event the worker must deliver, a local service the stack restarts): a delay
that doubles after each failure, from ``start_s`` up to ``max_s``, back to nothing after a
success. No jitter: each loop retries one thing of its own process, never in lockstep with
others. (A task's retry delay is its own policy: ``consumers/worker/backoff.py``.)"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    start_s: float
    max_s: float
    #: The delay after the last failure; 0 when nothing failed since the last success.
    delay_s: float = 0.0

    def failed(self) -> float:
        """Record a failure; the delay to wait before trying again."""
        self.delay_s = min(self.max_s, self.delay_s * 2 if self.delay_s else self.start_s)
        return self.delay_s

    def reset(self) -> None:
        """Record a success: the next failure waits ``start_s`` again."""
        self.delay_s = 0.0
