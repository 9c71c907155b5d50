"""Retry delays: the bounds operators configure must hold for every attempt and every draw."""

from __future__ import annotations

import random

import pytest

from jobwheel.consumers.worker.backoff import Backoff, compute_backoff
from jobwheel.errors import ValidationError


class FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_without_jitter_the_delay_grows_exponentially_from_base() -> None:
    rng = FixedRandom(0.5)
    delays = [compute_backoff(a, 100, 2.0, 10_000, 0.0, rng) for a in range(1, 6)]
    assert delays == [100, 200, 400, 800, 1600]


def test_delay_is_capped_and_never_decreases_without_jitter() -> None:
    rng = FixedRandom(0.0)
    delays = [compute_backoff(a, 1_000, 3.0, 60_000, 0.0, rng) for a in range(1, 200)]
    assert max(delays) == 60_000
    assert all(a <= b for a, b in zip(delays, delays[1:], strict=False))
    assert delays[-1] == 60_000


def test_huge_attempt_numbers_hit_the_cap_instead_of_overflowing() -> None:
    assert compute_backoff(10_000, 1_000, 10.0, 5_000, 0.0, FixedRandom(0.0)) == 5_000


@pytest.mark.parametrize("attempt", [1, 2, 5, 30])
def test_jitter_only_shortens_within_the_configured_fraction(attempt: int) -> None:
    rng = random.Random(42)
    full = compute_backoff(attempt, 500, 2.0, 20_000, 0.0, rng)
    draws = [compute_backoff(attempt, 500, 2.0, 20_000, 0.25, rng) for _ in range(2_000)]
    assert all(int(full * 0.75) <= d <= full for d in draws)
    assert len(set(draws)) > 10  # it really spreads retries out


def test_jitter_extremes_map_to_the_range_ends() -> None:
    assert compute_backoff(3, 1_000, 2.0, 60_000, 0.5, FixedRandom(0.0)) == 4_000
    assert compute_backoff(3, 1_000, 2.0, 60_000, 0.5, FixedRandom(0.999999)) == 2_000


def test_full_jitter_never_exceeds_the_cap() -> None:
    rng = random.Random(7)
    assert all(0 <= compute_backoff(a, 1_000, 2.0, 8_000, 1.0, rng) <= 8_000 for a in range(1, 50))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attempt": 0}, "attempt"),
        ({"base_ms": -1}, "backoff.base_ms"),
        ({"factor": 0.5}, "backoff.factor"),
        ({"max_ms": 10}, "backoff.max_ms"),
        ({"jitter": 1.5}, "backoff.jitter"),
    ],
)
def test_invalid_policies_are_rejected_with_the_field_named(kwargs: dict, field: str) -> None:
    args = {"attempt": 1, "base_ms": 100, "factor": 2.0, "max_ms": 1_000, "jitter": 0.1}
    args.update(kwargs)
    with pytest.raises(ValidationError) as info:
        compute_backoff(rng=FixedRandom(0.0), **args)
    assert info.value.field == field


def test_backoff_policy_object_validates_at_declaration_time() -> None:
    with pytest.raises(ValidationError):
        Backoff(base_ms=1_000, max_ms=10)
    assert Backoff(base_ms=10, factor=2, max_ms=15, jitter=0).delay_ms(3, FixedRandom(0)) == 15
