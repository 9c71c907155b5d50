"""A claim asks the group for its committed offsets before it restores, and the broker holds the
answer back while a previous owner's transaction with offsets for the partition is open (up to
the transaction timeout). While other partitions process, the loop waits in each ask: so at
most one ask per iteration may come back unanswered, and the claims take turns. Each claim
asking in every iteration, a survivor that took six partitions of a SIGSTOPped owner fired its
own partitions' jobs up to 1.4 s late (0.25 s with this rule; measured on a real broker with
twelve partitions, two schedulers, one stopped inside its commit)."""

from __future__ import annotations

from typing import Any

from jobwheel.errors import BrokerError
from jobwheel.settings import Settings
from jobwheel.streams.engine import SchedulerEngine
from jobwheel.streams.restore import OFFSETS_ASK_S, OFFSETS_WAIT_S
from jobwheel.streams.state.partition import MemoryBackend, PartitionState
from jobwheel.streams.tasks import PartitionTask, Phase

SETTINGS = Settings(_env_file=None, topic_prefix="p", partitions=7)  # type: ignore[call-arg]
TIMED_OUT = BrokerError("Failed to get committed offsets: Local: Timed out", code="_TIMED_OUT")
CLAIMS = range(1, 7)


class Group:
    """The group consumer's ``committed``: what each ask named and waited for; partitions in
    ``open`` are behind a previous owner's open transaction (the ask times out)."""

    def __init__(self) -> None:
        self.open: set[int] = set(CLAIMS)
        self.asks: list[tuple[int, float]] = []

    def committed(
        self, pairs: list[tuple[str, int]], timeout_s: float
    ) -> dict[tuple[str, int], int]:
        partitions = {p for _, p in pairs}
        assert len(partitions) == 1, pairs  # one claim's two topics per ask
        partition = partitions.pop()
        self.asks.append((partition, timeout_s))
        if partition in self.open:
            raise TIMED_OUT
        return {pair: 10 for pair in pairs}


class Changelog:
    """Measuring the changelog fails: the claims that read their offsets stop there (this test
    is about the asks before it)."""

    def watermarks(self, partition: int) -> Any:
        raise BrokerError("not yet", code="_TRANSPORT")


def engine_with(ready: bool) -> tuple[SchedulerEngine, Group]:
    engine = SchedulerEngine(SETTINGS)
    group = Group()
    engine.input = group  # type: ignore[assignment]
    engine.changelog = Changelog()  # type: ignore[assignment]
    engine._kafka_reachable = lambda: True
    for p in ([0] if ready else []) + list(CLAIMS):
        state = PartitionState(MemoryBackend())
        engine.tasks[p] = PartitionTask(p, state.backend, state)  # type: ignore[arg-type]
    if ready:
        engine.tasks[0].phase = Phase.READY
    return engine, group


def test_one_unanswered_ask_per_iteration_while_partitions_process_and_claims_take_turns() -> None:
    engine, group = engine_with(ready=True)
    engine._restore(0.2)
    assert group.asks == [(1, OFFSETS_ASK_S)]  # one ask waited: the others wait their turn
    for _ in range(len(CLAIMS) - 1):
        engine._restore(0.2)
    assert sorted(p for p, _ in group.asks) == list(CLAIMS)  # each claim asked once in 6
    assert {timeout for _, timeout in group.asks} == {OFFSETS_ASK_S}
    engine._restore(0.2)
    assert group.asks[-1][0] == 1  # round again, the longest waiting first


def test_answered_asks_do_not_hold_the_other_claims_back() -> None:
    """A claim whose offsets come back goes on in the same iteration, and so do the claims
    after it, up to the first ask left unanswered."""
    engine, group = engine_with(ready=True)
    group.open = {4, 5, 6}
    engine._restore(0.2)
    assert [p for p, _ in group.asks] == [1, 2, 3, 4]
    assert all(engine.tasks[p].offsets_read for p in (1, 2, 3))
    assert not any(engine.tasks[p].offsets_read for p in (4, 5, 6))
    group.open.clear()
    engine._restore(0.2)
    assert [p for p, _ in group.asks[4:]] == [5, 6, 4]  # the two not asked yet first
    assert all(engine.tasks[p].offsets_read for p in CLAIMS)


def test_with_no_partition_processing_every_claim_asks_and_waits_longer() -> None:
    """Nothing else to hold back (a process starting, or one that lost all its partitions):
    each claim asks in every iteration, with the long wait."""
    engine, group = engine_with(ready=False)
    engine._restore(0.2)
    assert group.asks == [(p, OFFSETS_WAIT_S) for p in CLAIMS]
