"""status_event.v2 adds ``started_ms``: a quick run's start, carried by its terminal event."""

from __future__ import annotations

import io

from fastavro import schemaless_writer

from jobwheel.schemas.codec import SchemaCatalogue, default_codec
from jobwheel.schemas.models import State, StatusEvent


def test_started_ms_round_trips_and_v2_is_what_is_written() -> None:
    codec = default_codec()
    written = codec.catalogue.current("io.jobwheel.StatusEvent")  # what encode writes
    assert written.version >= 2  # v2 or a later version that keeps it
    event = StatusEvent(
        "r@1:1:SUCCEEDED", "r", State.SUCCEEDED, 2_000, "worker", run_id="r@1", started_ms=1_990
    )
    assert codec.decode(codec.encode(event)) == event


def test_a_v1_event_is_read_with_no_start() -> None:
    """A worker not yet upgraded writes v1; its events read as v2 with started_ms None."""
    v1 = next(v for v in SchemaCatalogue.load().versions if v.label() == "status_event.v1")
    body = io.BytesIO()
    schemaless_writer(
        body,
        v1.parsed,
        {
            "event_id": "r@1:1:SUCCEEDED",
            "job_id": "r",
            "run_id": "r@1",
            "seq": 4,
            "attempt": 1,
            "state": "SUCCEEDED",
            "event_time_ms": 2_000,
            "source": "worker",
            "duration_ms": 3,
        },
    )
    decoded = default_codec().decode(b"\xc3\x01" + v1.fingerprint + body.getvalue())
    assert decoded == StatusEvent(
        "r@1:1:SUCCEEDED",
        "r",
        State.SUCCEEDED,
        2_000,
        "worker",
        run_id="r@1",
        seq=4,
        attempt=1,
        duration_ms=3,
    )
    assert decoded.started_ms is None
