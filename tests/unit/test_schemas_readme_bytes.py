"""The byte examples of schemas/README.md, read from the README itself.

Services in other languages copy these bytes and numbers (the example ``JobCommand``, the
murmur2 partition vectors) to check their own producers; a README that drifted from what the
codec and the partitioner do would send them the wrong way. The README is the one source of
these facts: the test parses its tables and its hex block rather than keeping a copy.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from fastavro import schemaless_writer

from jobwheel.schemas.codec import SINGLE_OBJECT_MAGIC, SchemaCatalogue, default_codec
from jobwheel.schemas.conversions import KINDS
from jobwheel.schemas.models import After, JobCommand, ScheduleJob, State, StatusBatch, StatusEvent
from jobwheel.schemas.partitioning import murmur2, partition_for

README = Path(__file__).resolve().parents[2] / "schemas" / "README.md"


def _section(text: str, start: str) -> str:
    """The README from the line containing ``start`` on (fails naming it if it is gone)."""
    at = text.find(start)
    assert at >= 0, f"schemas/README.md no longer contains {start!r}; update this test"
    return text[at:]


def _example_command_bytes(text: str) -> bytes:
    """The hex block that follows the README's example ``JobCommand`` paragraph."""
    after = _section(text, "Example, a `JobCommand`")
    block = re.search(r"```\n(.*?)```", after, re.S)
    assert block is not None, "no code block after the example JobCommand paragraph"
    return bytes.fromhex(block.group(1))


def _vector_rows(text: str) -> list[tuple[str, int, int, int, int]]:
    """The rows of the murmur2 test-vector table: job id, murmur2, masked, p(12), p(4)."""
    table = _section(text, "Test vectors").split("\n\n")[1]
    rows = []
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        job_id = re.fullmatch(r"`([^`]*)`(?: \(UTF-8\))?", cells[0])
        assert job_id is not None, f"unreadable job id cell {cells[0]!r}"
        rows.append((job_id.group(1), *(int(c) for c in cells[1:5])))  # type: ignore[arg-type]
    return rows


def test_the_example_job_command_is_what_a_v2_writer_produces_and_decodes_as_described() -> None:
    data = _example_command_bytes(README.read_text(encoding="utf-8"))
    v2 = next(
        v
        for v in SchemaCatalogue.load().versions
        if v.full_name == "io.jobwheel.JobCommand" and v.version == 2
    )
    assert data[:2] == SINGLE_OBJECT_MAGIC
    assert data[2:10] == v2.fingerprint, "the example's header names no v2 JobCommand"

    # What the paragraph says it is: demo.echo with {"x":1}, after 5 s.
    command = default_codec().decode(data)
    assert isinstance(command, JobCommand)
    assert command.job_id == "job-1"
    assert isinstance(command.body, ScheduleJob)
    assert command.body.task == "demo.echo"
    assert command.body.args_json == '{"x":1}'
    assert command.body.trigger == After(delay_ms=5000)

    # Byte for byte what a v2 writer (Java's BinaryMessageEncoder) makes of that command.
    out = io.BytesIO()
    schemaless_writer(out, v2.parsed, KINDS["io.jobwheel.JobCommand"].to_avro(command))
    assert SINGLE_OBJECT_MAGIC + v2.fingerprint + out.getvalue() == data


def test_every_partition_vector_row_matches_murmur2_and_the_partitioner() -> None:
    rows = _vector_rows(README.read_text(encoding="utf-8"))
    assert "ünïcødé" in [r[0] for r in rows], "the non-ASCII vector is gone from the table"
    for job_id, h, masked, p12, p4 in rows:
        assert murmur2(job_id.encode("utf-8")) == h, job_id
        assert h & 0x7FFFFFFF == masked, job_id
        assert (partition_for(job_id, 12), partition_for(job_id, 4)) == (p12, p4), job_id


def test_the_example_status_batch_holds_the_two_events_described_byte_for_byte() -> None:
    after = _section(README.read_text(encoding="utf-8"), "Example, a batch of two events")
    block = re.search(r"```\n(.*?)```", after, re.S)
    assert block is not None, "no code block after the example StatusBatch paragraph"
    data = bytes.fromhex(block.group(1))
    codec = default_codec()
    items = codec.batch_items(data)
    assert items is not None, "the example is not a StatusBatch"
    assert [len(i) for i in items] == [43, 45]
    first, second = (codec.decode(i) for i in items)
    assert first == StatusEvent("e1", "j", State.SCHEDULED, 1, "scheduler", seq=1)
    assert second == StatusEvent("e2", "j", State.DISPATCHED, 2, "scheduler", run_id="r", seq=2)
    assert codec.encode(StatusBatch(items)) == data  # what a writer of v1 makes of them
