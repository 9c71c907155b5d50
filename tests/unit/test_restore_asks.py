"""The asks a partition makes of the broker before it restores, while other partitions
process: the loop waits in each, so at most one ask per iteration may come back unanswered,
and the partitions take turns.

- A claim asks the group for its committed offsets; the broker holds the answer back while a
  previous owner's transaction with offsets for the partition is open (up to the transaction
  timeout). Each claim asking in every iteration, a survivor that took six partitions of a
  SIGSTOPped owner fired its own partitions' jobs up to 1.4 s late (0.25 s with this rule;
  measured on a real broker with twelve partitions, two schedulers, one stopped inside its
  commit).
- Claims and standby copies measure their changelog partition's end; with the leader's broker
  just killed, the ask waits for the election. Asked for 10 s each, a survivor's claim of two
  partitions whose changelog leader had died took 20 s (measured on a three-node cluster).
"""

from __future__ import annotations

from typing import Any

from jobwheel.errors import BrokerError
from jobwheel.settings import Settings
from jobwheel.streams.engine import SchedulerEngine
from jobwheel.streams.restore import END_ASK_S, END_WAIT_S, OFFSETS_ASK_S, OFFSETS_WAIT_S
from jobwheel.streams.state.partition import MemoryBackend, PartitionState
from jobwheel.streams.tasks import PartitionTask, Phase, StandbyTask

SETTINGS = Settings(_env_file=None, topic_prefix="p", partitions=9)  # type: ignore[call-arg]
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
    """Measuring a changelog partition's end: what each ask named and waited for; partitions in
    ``leaderless`` have lost their leader (the ask times out). Once measured, a partition's
    reading is assigned (nothing to read: the test ends before the restore proper)."""

    def __init__(self) -> None:
        self.leaderless: set[int] = set()
        self.asks: list[tuple[int, float]] = []

    def watermarks(self, partition: int, timeout_s: float) -> tuple[int, int]:
        self.asks.append((partition, timeout_s))
        if partition in self.leaderless:
            raise BrokerError("Local: Timed out", code="_TIMED_OUT")
        return 0, 5

    def unassign(self, partition: int) -> None:
        pass

    def assign(self, partition: int, offset: int) -> None:
        pass

    def pause(self, partition: int) -> None:
        pass

    def resume(self, partition: int) -> None:
        pass

    def position(self, partition: int) -> int | None:
        return None

    def poll_changes(self, limit: int, timeout_s: float) -> list[Any]:
        return []


def engine_with(ready: bool, standby: int = 0) -> tuple[SchedulerEngine, Group, Changelog]:
    engine = SchedulerEngine(SETTINGS)
    group, changelog = Group(), Changelog()
    engine.input = group  # type: ignore[assignment]
    engine.changelog = changelog  # type: ignore[assignment]
    engine._kafka_reachable = lambda: True
    for p in ([0] if ready else []) + list(CLAIMS):
        state = PartitionState(MemoryBackend())
        engine.tasks[p] = PartitionTask(p, state.backend, state)  # type: ignore[arg-type]
    for p in range(7, 7 + standby):
        state = PartitionState(MemoryBackend())
        engine.tasks[p] = StandbyTask(p, state.backend, state)  # type: ignore[arg-type]
    if ready:
        engine.tasks[0].phase = Phase.READY
    return engine, group, changelog


def test_one_unanswered_ask_per_iteration_while_partitions_process_and_claims_take_turns() -> None:
    engine, group, _ = engine_with(ready=True)
    engine._restore(0.0)
    assert group.asks == [(1, OFFSETS_ASK_S)]  # one ask waited: the others wait their turn
    for _ in range(len(CLAIMS) - 1):
        engine._restore(0.0)
    assert sorted(p for p, _ in group.asks) == list(CLAIMS)  # each claim asked once in 6
    assert {timeout for _, timeout in group.asks} == {OFFSETS_ASK_S}
    engine._restore(0.0)
    assert group.asks[-1][0] == 1  # round again, the longest waiting first


def test_answered_asks_do_not_hold_the_other_claims_back() -> None:
    """A claim whose offsets come back goes on in the same iteration, and so do the claims
    after it, up to the first ask left unanswered."""
    engine, group, _ = engine_with(ready=True)
    group.open = {4, 5, 6}
    engine._restore(0.0)
    assert [p for p, _ in group.asks] == [1, 2, 3, 4]
    assert all(engine.tasks[p].offsets_read for p in (1, 2, 3))
    assert not any(engine.tasks[p].offsets_read for p in (4, 5, 6))
    group.open.clear()
    engine._restore(0.0)
    assert [p for p, _ in group.asks[4:]] == [5, 6, 4]  # the two not asked yet first
    assert all(engine.tasks[p].offsets_read for p in CLAIMS)


def test_with_no_partition_processing_every_claim_asks_and_waits_longer() -> None:
    """Nothing else to hold back (a process starting, or one that lost all its partitions):
    each claim asks in every iteration, with the long wait."""
    engine, group, _ = engine_with(ready=False)
    engine._restore(0.0)
    assert group.asks == [(p, OFFSETS_WAIT_S) for p in CLAIMS]


def test_measuring_a_changelog_end_waits_briefly_and_once_per_iteration() -> None:
    """Claims whose offsets came back measure their changelog's end in the same iteration, for
    at most a second each while partitions process; once one ask is left unanswered (the
    leader's broker just died), the rest measure in the next, the longest waiting first."""
    engine, group, changelog = engine_with(ready=True)
    group.open.clear()
    changelog.leaderless = {2, 3}
    engine._restore(0.0)
    assert [p for p, _ in group.asks] == [1, 2]  # 2's end went unanswered: 3 to 6 wait
    assert changelog.asks == [(1, END_ASK_S), (2, END_ASK_S)]
    assert engine.tasks[1].restore.reading and not engine.tasks[2].restore.reading
    engine._restore(0.0)
    assert [p for p, _ in changelog.asks[2:]] == [3]  # offsets read, its end unanswered
    changelog.leaderless.clear()  # the election is over
    engine._restore(0.0)
    assert [p for p, _ in changelog.asks[3:]] == [4, 5, 6, 2, 3]
    assert all(engine.tasks[p].restore.reading for p in CLAIMS)


def test_claims_measure_before_standby_copies_and_nothing_waits_long_while_busy() -> None:
    engine, group, changelog = engine_with(ready=True, standby=2)
    group.open.clear()
    changelog.leaderless = {1}
    engine._restore(0.0)
    assert changelog.asks == [(1, END_ASK_S)]  # a claim first; the standby copies wait
    changelog.leaderless.clear()
    for _ in range(3):
        engine._restore(0.0)
    assert {p for p, _ in changelog.asks} == {*CLAIMS, 7, 8}
    assert {timeout for _, timeout in changelog.asks} == {END_ASK_S}


def test_with_no_partition_processing_each_end_is_measured_with_the_long_wait() -> None:
    engine, group, changelog = engine_with(ready=False, standby=1)
    group.open.clear()
    changelog.leaderless = {1, 2}
    engine._restore(0.0)
    assert changelog.asks == [(p, END_WAIT_S) for p in (*CLAIMS, 7)]
