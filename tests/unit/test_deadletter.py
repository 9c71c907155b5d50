"""Reading dead-letter records and deciding what a replay of each sends (schemas/deadletter.py).

The records are built exactly as the scheduler writes them (streams/commit.py: headers, key,
value), so these pin the reader to the documented format.
"""

from __future__ import annotations

import dataclasses

from jobwheel.schemas import deadletter as dl
from jobwheel.schemas.codec import default_codec
from jobwheel.schemas.models import JobCommand, Now, ReplayRun, Run, ScheduleJob, State
from jobwheel.schemas.models import StatusEvent as Event
from jobwheel.schemas.topics import (
    DEAD_RUN_KIND,
    ERROR_HEADER,
    KIND_HEADER,
    RUN_HEADER,
    SOURCE_OFFSET_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_TOPIC_HEADER,
    UNDECODABLE_RUN_KIND,
    run_header,
)

T0 = 1_800_000_000_000  # fixed date: every 'now' here is passed in from T0, none is the wall clock
CODEC = default_codec()
ACKS = "p.acks"


def read(key, value, headers, offset=7):
    return dl.parse(
        CODEC,
        partition=2,
        offset=offset,
        timestamp_ms=T0,
        key=key,
        value=value,
        headers=headers,
        acks_topic=ACKS,
    )


def source(topic="p.requests"):
    return [
        (SOURCE_TOPIC_HEADER, topic.encode()),
        (SOURCE_PARTITION_HEADER, b"2"),
        (SOURCE_OFFSET_HEADER, b"41"),
    ]


def plan(letter, reason=None):
    return dl.plan(
        letter, CODEC, command_id="replay-1", now_ms=T0 + 5, max_args_bytes=65536, reason=reason
    )


RUN = Run(f"j@{T0}", "j", "demo.flaky", '{"n": 1}', 5, T0, T0 + 1, 3, 3, 2000, 9000, T0 + 2, 2, 4)


def test_a_dead_run_is_read_and_replayed_as_a_replay_run_command():
    headers = [(ERROR_HEADER, b"attempt 3 of 3 failed: E: x"), (KIND_HEADER, DEAD_RUN_KIND)]
    letter = read(b"j", CODEC.encode(RUN), headers)
    assert (letter.kind, letter.run, letter.task, letter.ref) == (
        dl.DEAD_RUN,
        RUN,
        "demo.flaky",
        "2:7",
    )
    assert letter.as_dict()["run_id"] == RUN.run_id and "E: x" in letter.error
    replay = plan(letter, reason="fixed")
    assert replay.skip is None and replay.key == b"j"
    assert replay.command == JobCommand(
        "replay-1",
        "j",
        T0 + 5,
        ReplayRun(RUN.run_id, T0, 3, "demo.flaky", '{"n": 1}', 3, 2000, 9000, "fixed"),
    )


def test_a_rejected_command_replays_only_when_the_scheduler_would_accept_it_now():
    good = JobCommand("c1", "j", T0, ScheduleJob("demo.echo", Now()))
    # rejected by a scheduler error (or a wrong partitioner): the same bytes are fine now
    letter = read(b"j", CODEC.encode(good), [(ERROR_HEADER, b"scheduler error: x"), *source()])
    assert (letter.kind, letter.command, letter.source) == (dl.REQUEST, good, ("p.requests", 2, 41))
    replay = plan(letter)
    assert replay.skip is None and replay.command is None and replay.key == b"j"
    # an invalid command would be rejected again, unchanged
    bad = JobCommand("c2", "j", T0, ScheduleJob("not a task", Now()))
    skip = plan(read(b"j", CODEC.encode(bad), [(ERROR_HEADER, b"invalid"), *source()])).skip
    assert skip is not None and "would be rejected again" in skip and "task" in skip
    # so would one keyed by another job id, and bytes that are no command at all
    wrong_key = plan(read(b"other", CODEC.encode(good), source())).skip
    assert wrong_key is not None and "key" in wrong_key
    garbage = read(b"j", b"hello", [(ERROR_HEADER, b"undecodable"), *source()])
    assert garbage.kind == dl.REQUEST and garbage.undecodable
    assert "undecodable" in (plan(garbage).skip or "")


def test_acks_and_references_are_listed_but_never_replayed():
    event = Event("e", "j", State.SUCCEEDED, T0, "worker", run_id="j@1", attempt=1)
    ack = read(b"j", CODEC.encode(event), [(ERROR_HEADER, b"ack failed"), *source(ACKS)])
    assert ack.kind == dl.ACK and "never replayed" in (plan(ack).skip or "")
    ref = read(
        b"j",
        None,
        [
            (ERROR_HEADER, b"too big"),
            *source(),
            (KIND_HEADER, b"too-large"),
            ("jobwheel.size", b"9"),
        ],
    )
    assert (ref.kind, ref.size) == (dl.TOO_LARGE, 9)
    assert "too large" in (plan(ref).skip or "")


def test_a_replayed_commands_answer_says_it_was_replayed():
    answer = Event("c1:PAUSED", "j", State.PAUSED, T0, "scheduler", reason="maintenance")
    other = Event("j:9:COMPLETED", "j", State.COMPLETED, T0, "scheduler")
    noted = dl.note_replay([answer, other], "c1", "2:7")
    assert noted[0].reason == "replayed from the dead-letter topic (2:7): maintenance"
    assert noted[1] == other
    plain = dl.note_replay(
        [Event("c1:SCHEDULED", "j", State.SCHEDULED, T0, "scheduler")], "c1", "x"
    )
    assert plain[0].reason == "replayed from the dead-letter topic (x)"


def test_an_undecodable_run_is_listed_as_such_and_never_replayed():
    """A worker's copy of a runs record it could not decode: its own kind (not a bad request,
    which a replay would send to the requests topic), never replayed; a reader that knows the
    schema now shows the run."""
    headers = [
        (RUN_HEADER, run_header(RUN)),
        (ERROR_HEADER, b"undecodable run record at p.runs:2:9: unknown schema"),
        (KIND_HEADER, UNDECODABLE_RUN_KIND),
        *source("p.runs"),
    ]
    garbage = read(b"j", b"\xc3\x01garbage", headers)
    assert (garbage.kind, garbage.run, garbage.source) == (
        dl.UNDECODABLE_RUN,
        None,
        ("p.runs", 2, 41),
    )
    assert garbage.undecodable
    assert "FAILED" in (plan(garbage).skip or "")
    readable = read(b"j", CODEC.encode(RUN), headers)
    assert (readable.kind, readable.run) == (dl.UNDECODABLE_RUN, RUN)
    assert plan(readable).command is None and plan(readable).skip
    assert dl.UNDECODABLE_RUN in dl.KINDS


def test_dlq_list_marks_the_letters_replayed_already():
    """A run's older dead letter was replayed (a run dies again only after a replay); the
    status store's view marks the rest. Before, `dlq list` showed every entry alike, and a
    user could not tell what was dealt with."""
    from dataclasses import replace

    from jobwheel.consumers.status.cli import dead_letter_line
    from jobwheel.producers.deadletters import replay_marks

    headers = [(ERROR_HEADER, b"attempt 3 of 3 failed: E: x"), (KIND_HEADER, DEAD_RUN_KIND)]
    first = read(b"j", CODEC.encode(RUN), headers, offset=7)
    again = read(b"j", CODEC.encode(replace(RUN, attempt=6)), headers, offset=9)
    other_run = replace(RUN, run_id="k@1", job_id="k")
    fixed = read(b"k", CODEC.encode(other_run), headers, offset=11)
    pending = read(b"m", CODEC.encode(replace(RUN, run_id="m@1", job_id="m")), headers, 12)
    store_says = {"k@1": "replayed already: the run is SUCCEEDED now, not DEAD"}

    marks = replay_marks([first, again, fixed, pending], lambda d: store_says.get(d.run_id))

    assert marks == {
        "2:7": "replayed already: the run died again, see 2:9",
        "2:11": "replayed already: the run is SUCCEEDED now, not DEAD",
    }
    line = dead_letter_line({**first.as_dict(), "replayed": marks["2:7"]})
    assert line.endswith("  [replayed already: the run died again, see 2:9]"), line
    assert "replayed" not in dead_letter_line({**pending.as_dict(), "replayed": None})
    # Without the status API's view the older letter is still known.
    assert replay_marks([first, again]) == {"2:7": marks["2:7"]}


def test_a_dead_runs_replay_keeps_its_queue():
    """A forgotten job is recreated from its dead run: on the queue the run was dispatched to,
    not on the default one."""
    run = dataclasses.replace(RUN, queue="reports")
    headers = [(ERROR_HEADER, b"attempt 3 of 3 failed: E: x"), (KIND_HEADER, DEAD_RUN_KIND)]
    replay = plan(read(b"j", CODEC.encode(run), headers))
    assert replay.command is not None and replay.command.body.queue == "reports"
