"""Retry delays: exponential backoff with jitter, as a pure function of the attempt number.

The scheduler owns retries (it re-dispatches attempt + 1 after the delay a FAILED event carries),
but the delay is the task's policy, so the worker computes it and ships it in ``retry_delay_ms``.
Keeping the arithmetic pure (the random source is an argument) makes it testable without time or
randomness, in the spirit of dramatiq's ``common.compute_backoff``.

Jitter only ever shortens the delay (``delay * (1 - jitter * u)``, ``u`` in [0, 1)), so ``max_ms``
is a hard cap that operators can rely on, and a thundering herd of runs failing together against
the same dead dependency spreads out instead of retrying in lockstep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from jobwheel.errors import ValidationError


class RandomSource(Protocol):
    """What the backoff needs from ``random.Random``: a float in [0, 1)."""

    def random(self) -> float: ...


def compute_backoff(
    attempt: int,
    base_ms: int,
    factor: float,
    max_ms: int,
    jitter: float,
    rng: RandomSource,
) -> int:
    """The delay in ms before retrying after ``attempt`` (1-based) failed.

    Without jitter it is ``min(max_ms, base_ms * factor ** (attempt - 1))``: non-decreasing in
    ``attempt`` and never above ``max_ms``. Jitter draws the delay uniformly from
    ``[(1 - jitter) * d, d]``.
    """
    if attempt < 1:
        raise ValidationError("attempt", f"must be >= 1, got {attempt}")
    _check_policy(base_ms, factor, max_ms, jitter)
    try:
        raw = base_ms * math.pow(factor, attempt - 1)
    except OverflowError:
        raw = math.inf
    capped = min(float(max_ms), raw)
    if jitter:
        capped *= 1.0 - jitter * rng.random()
    return int(capped)


def _check_policy(base_ms: int, factor: float, max_ms: int, jitter: float) -> None:
    if base_ms < 0:
        raise ValidationError("backoff.base_ms", f"must be >= 0, got {base_ms}")
    if not factor >= 1.0:
        raise ValidationError("backoff.factor", f"must be >= 1 (got {factor}); delays never shrink")
    if max_ms < base_ms:
        raise ValidationError("backoff.max_ms", f"must be >= base_ms ({base_ms}), got {max_ms}")
    if not 0.0 <= jitter <= 1.0:
        raise ValidationError("backoff.jitter", f"must be within [0, 1], got {jitter}")


@dataclass(frozen=True, slots=True)
class Backoff:
    """A task's retry policy, given to ``@task(backoff=Backoff(...))``.

    Defaults: 1 s, doubling, capped at 5 minutes, up to 20 % shorter at random.
    """

    base_ms: int = 1_000
    factor: float = 2.0
    max_ms: int = 300_000
    jitter: float = 0.2

    def __post_init__(self) -> None:
        _check_policy(self.base_ms, self.factor, self.max_ms, self.jitter)

    def delay_ms(self, attempt: int, rng: RandomSource) -> int:
        return compute_backoff(attempt, self.base_ms, self.factor, self.max_ms, self.jitter, rng)


DEFAULT_BACKOFF = Backoff()
