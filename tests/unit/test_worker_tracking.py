"""Commit watermarks, stale-attempt and fencing decisions of the worker pool."""

from __future__ import annotations

import pytest

from jobwheel.consumers.worker.tracking import LatestAttempts, OffsetTracker


def test_watermark_waits_for_the_oldest_unfinished_run() -> None:
    t = OffsetTracker(0)
    for offset in (10, 11, 12, 15):  # 13/14: transaction markers never fetched
        t.add(offset)
    assert t.to_commit() is None
    t.mark_done(11)
    t.mark_done(12)
    # 10 still running: committing 13 would lose it on a crash. 10 is committed, naming 11-12.
    assert t.to_commit() == (10, "jw2:1-2")
    t.mark_done(10)
    assert t.to_commit() == (13, "")
    t.committed(13)
    assert t.to_commit() is None
    assert t.pending == 1
    t.mark_done(15)
    assert t.to_commit() == (16, "")


def test_marking_unknown_or_repeated_offsets_changes_nothing() -> None:
    t = OffsetTracker(0)
    t.add(5)
    t.mark_done(4)
    t.mark_done(6)
    assert t.to_commit() is None
    t.mark_done(5)
    t.mark_done(5)
    assert t.to_commit() == (6, "")


def test_a_revoked_tracker_never_offers_a_commit() -> None:
    t = OffsetTracker(0)
    t.add(1)
    t.mark_done(1)
    t.revoked = True
    assert t.to_commit() is None


def test_offsets_must_increase() -> None:
    t = OffsetTracker(0)
    t.add(3)
    with pytest.raises(ValueError, match="new one after a rebalance"):
        t.add(3)
    t.mark_done(3)
    with pytest.raises(ValueError):
        t.add(2)


def test_runs_done_past_an_unfinished_one_go_with_the_commit_and_the_next_owner_skips_them() -> (
    None
):
    old = OffsetTracker(0)
    for offset in range(10, 20):
        old.add(offset)
    for offset in (10, 12, 13, 14, 17, 19):
        old.mark_done(offset)
    # 11 still runs: the watermark stays at 11, the commit names 12-14, 17 and 19 as done.
    assert old.to_commit() == (11, "jw2:1-3,6,8")
    old.committed(11, "jw2:1-3,6,8")
    assert old.to_commit() is None

    new = OffsetTracker(0)
    assert new.inherit(11, "jw2:1-3,6,8") == 5
    ran = [o for o in range(11, 20) if new.add(o)]
    assert ran == [11, 15, 16, 18]  # the previous owner's finished runs are not run again
    # Until 11 is done, its own commit keeps naming what the previous owner finished.
    new.mark_done(15)
    # 11 still runs: the commit stays at 11 and keeps naming what the previous owner finished.
    assert new.to_commit() == (11, "jw2:1-4,6,8")
    new.mark_done(11)
    assert new.to_commit() == (16, "jw2:1,3")  # 16 and 18 run: 17 and 19 done past them
    new.mark_done(16)
    new.mark_done(18)
    assert new.to_commit() == (20, "")


def test_a_partition_lost_before_its_commits_got_through_is_not_run_again_here() -> None:
    """The session lost in a network partition: the last commit that reached the broker is
    at 10, but this process ran 10-14 and 17 since. Given the partition back, it runs only
    what it had not run."""
    old = OffsetTracker(0)
    for offset in range(10, 20):
        old.add(offset)
    for offset in (10, 11, 12, 13, 14, 17):
        old.mark_done(offset)
    remembered = old.known_done()
    assert remembered == (15, {17})

    new = OffsetTracker(0)
    new.inherit(10, "", remembered)
    assert [o for o in range(10, 20) if new.add(o)] == [15, 16, 18, 19]
    assert new.to_commit() == (15, "jw2:2")  # 10-14 done; 17 done past the watermark
    # Someone else committed past what this process knew: nothing of it counts any more.
    other = OffsetTracker(0)
    other.inherit(30, "", remembered)
    assert other.add(30)


def test_inherited_runs_not_fetched_yet_stay_in_the_commit() -> None:
    new = OffsetTracker(0)
    new.inherit(100, "jw2:5,a")  # 105 and 110
    assert new.add(100)
    new.mark_done(100)
    assert new.to_commit() == (101, "jw2:4,9")


def test_the_runs_executing_go_with_the_commit_and_the_next_owner_calls_them_repeats() -> None:
    old = OffsetTracker(0)
    for offset in range(50, 56):
        old.add(offset)
    old.own(50)
    old.own(52)
    old.mark_done(51)
    assert old.to_commit() == (50, "jw2:1|2")  # 51 done; runs started up to 52
    new = OffsetTracker(0)
    new.inherit(50, "jw2:1|2")
    assert [o for o in range(50, 56) if new.add(o)] == [50, 52, 53, 54, 55]
    assert [o for o in (50, 52, 53) if new.maybe_repeat(o)] == [50, 52]


def test_metadata_of_the_version_before_is_still_read() -> None:
    new = OffsetTracker(0)
    assert new.inherit(50, "jw1:1|2") == 1  # 51 done, started up to 52; no lookup time
    assert new.lookup_since_ms is None
    assert [o for o in range(50, 54) if new.add(o)] == [50, 52, 53]


def test_a_commit_while_runs_go_on_names_since_when_to_read_their_acks() -> None:
    """An ownership that goes on running its partition's runs stamps each commit with the time
    it was made: verdicts not named in it can only be on the acks topic from then on, which is
    where a next owner after a crash or a lost session looks (and how far back). A hand-over
    with nothing running stamps nothing: the next owner has nothing to look up."""
    old = OffsetTracker(0)
    for offset in range(10, 14):
        old.add(offset)
    old.own(10)
    old.mark_done(11)
    offset, meta = old.to_commit(since_ms=1_700_000_000_000) or (0, "")
    assert (offset, meta.partition("@")[0]) == (10, "jw2:1|0")
    old.committed(offset, meta)
    # The same progress later is no change: the older stamp only makes the next owner read more.
    assert old.to_commit(since_ms=1_700_000_005_000) is None
    new = OffsetTracker(0)
    new.inherit(offset, meta)
    assert new.lookup_since_ms == 1_700_000_000_000
    # Nothing done past the watermark, nothing started: the stamp alone rides on the offset.
    quiet = OffsetTracker(0)
    quiet.add(7)
    quiet.mark_done(7)
    assert quiet.to_commit(since_ms=36) == (8, "jw2:@10")
    assert quiet.done_metadata() == ""


def test_runs_a_worker_decided_are_skipped_until_the_fetch_passes_the_old_end() -> None:
    t = OffsetTracker(0)
    t.decided = {("r1", 1)}
    t.decided_below = 20
    assert t.decided_elsewhere(15, "r1", 1)
    assert not t.decided_elsewhere(16, "r1", 2)  # another attempt: not decided
    assert t.decided_elsewhere(17, "r1", 1)  # a second copy of the same attempt
    assert not t.decided_elsewhere(20, "r1", 1)  # dispatched after the lookup
    assert t.decided == set()


def test_foreign_or_corrupt_metadata_skips_nothing() -> None:
    for metadata in ("", "something else", "jw2:zz-1", "jw2:1-!"):
        t = OffsetTracker(0)
        assert t.inherit(5, metadata) == 0
        assert t.add(6)


def test_commit_metadata_is_cut_to_fit_the_brokers_limit() -> None:
    from jobwheel.consumers.worker.tracking import METADATA_MAX_CHARS

    t = OffsetTracker(0)
    for offset in range(20_000):
        t.add(offset)
    for offset in range(1, 20_000, 2):  # every other run done: 10,000 single ranges
        t.mark_done(offset)
    assert t.to_commit() is not None
    offset, meta = t.to_commit() or (-1, "")
    assert offset == 0 and len(meta) <= METADATA_MAX_CHARS  # offset 0 still runs
    t.mark_done(0)
    offset, meta = t.to_commit() or (0, "")
    assert offset == 2 and len(meta) <= METADATA_MAX_CHARS


def test_older_attempt_after_a_newer_one_is_stale() -> None:
    latest = LatestAttempts()
    assert latest.observe("r", 2) is None
    assert (
        latest.observe("r", 1) == "stale attempt: 1 < 2, a newer attempt of this run was "
        "already dispatched"
    )
    assert latest.observe("r", 2) is None  # the same attempt again is a duplicate, not stale
    assert latest.observe("r", 3) is None
    assert latest.observe("r", 2) is not None
    assert latest.newer_attempt("r", 2) == 3
    assert latest.newer_attempt("r", 3) is None
    assert latest.newer_attempt("other", 1) is None


def test_latest_attempts_memory_is_bounded_lru() -> None:
    latest = LatestAttempts(capacity=2)
    latest.observe("a", 5)
    latest.observe("b", 5)
    latest.observe("a", 5)  # touch a: b is now the least recent
    latest.observe("c", 5)
    assert len(latest) == 2
    assert latest.observe("a", 1) is not None
    assert latest.observe("b", 1) is None  # forgotten: runs (at-least-once), never lost


def test_a_lower_fencing_token_is_fenced_for_its_own_run_only() -> None:
    latest = LatestAttempts()
    assert latest.observe("r", 1, fencing_token=5) is None
    assert latest.observe("r", 1, fencing_token=4) == "fenced: token 4 < 5"
    assert latest.observe("r", 2, fencing_token=4) == "fenced: token 4 < 5"
    assert latest.observe("r", 1, fencing_token=6) is None  # a new owner re-fired the run
    # A token from the future on one run (forged, corrupt) fences nothing else.
    assert latest.observe("forged", 1, fencing_token=2**62) is None
    assert latest.observe("s", 1, fencing_token=1) is None
    assert latest.observe("s", 1, fencing_token=1) is None


def test_a_finished_attempt_is_remembered_until_a_newer_attempt_arrives() -> None:
    """What keeps a worker from running again an attempt it finished when the run's record
    comes back after the ownership that ran it is gone (the verdict landed after the loss)."""
    latest = LatestAttempts()
    assert latest.observe("r", 1, fencing_token=3) is None
    assert not latest.finished("r", 1)  # dispatched, not finished
    latest.finish("r", 1, 3)
    assert latest.finished("r", 1)
    assert latest.observe("r", 1, fencing_token=3) is None  # the same record again
    assert latest.finished("r", 1)
    assert latest.observe("r", 1, fencing_token=4) is None  # re-sent by a newer owner
    assert latest.finished("r", 1)  # still this process's finished attempt
    assert latest.observe("r", 2, fencing_token=4) is None  # a new attempt: runs
    assert not latest.finished("r", 2) and not latest.finished("r", 1)
    latest.finish("r", 1, 4)  # an old attempt's verdict marks nothing
    assert not latest.finished("r", 2)
    latest.finish("unseen", 1, 1)  # forgotten or never observed: remembered from its verdict
    assert latest.finished("unseen", 1) and not latest.finished("unseen", 2)
