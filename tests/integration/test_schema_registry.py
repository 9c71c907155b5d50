"""The Confluent wire format end to end, on the real broker (``JOBWHEEL_SCHEMA_REGISTRY_URL``).

What jobwheel promises with a registry configured (schemas/README.md, "Framing"): every value
it writes is ``00`` + the 4-byte big-endian id the registry gave its schema + the Avro body,
the subjects follow the record-name strategy (``io.jobwheel.JobCommand``, ``io.jobwheel.Run``,
``io.jobwheel.StatusEvent``), and a reader with a registry still reads single-object records,
so a deployment can switch framing without a flag day.

No real Schema Registry can run here (no container registry, no JVM service of it in
deploy/lib), so the registry is a small in-process HTTP server speaking the documented Schema
Registry REST API (https://docs.confluent.io/platform/current/schema-registry/develop/api.html):
``POST /subjects/{subject}/versions`` answers ``{"id": N}`` with global ids (the same schema
text under another subject keeps its id), ``GET /schemas/ids/{id}`` answers ``{"schema": ...}``
or 404 with error code 40403, in ``application/vnd.schemaregistry.v1+json``. Jobwheel's
processes talk to it through Confluent's own client (``schemas/registry.py``), over HTTP, as
they would to a real one.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from jobwheel.errors import SchemaDecodeError
from jobwheel.producers.client import JobClient
from jobwheel.producers.workers import read_workers
from jobwheel.schemas.codec import Codec, SchemaCatalogue, default_codec
from jobwheel.schemas.models import JobCommand, Run, State, StatusBatch, StatusEvent
from tests.integration.scheduler_support import start_scheduler
from tests.support import (
    DEMO_TASKS,
    Tail,
    read_all,
    scaled,
    start_worker,
    wait_for_group,
    wait_until,
)

_JSON = "application/vnd.schemaregistry.v1+json"


class RegistryServer:
    """The documented Schema Registry REST API, the part a serializer uses, in memory."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}  # schema text -> global id
        self.subjects: dict[str, list[int]] = {}  # subject -> ids of its versions
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet: the test reads .requests
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", _JSON)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                path = urlparse(self.path).path.strip("/").split("/")
                registry.requests.append(("POST", self.path))
                if len(path) != 3 or path[0] != "subjects" or path[2] != "versions":
                    self._answer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("schemaType", "AVRO") != "AVRO":
                    self._answer(422, {"error_code": 42201, "message": "Invalid schema"})
                    return
                self._answer(200, {"id": registry.register(unquote(path[1]), body["schema"])})

            def do_GET(self) -> None:
                path = urlparse(self.path).path.strip("/").split("/")
                registry.requests.append(("GET", self.path))
                if len(path) == 3 and path[:2] == ["schemas", "ids"]:
                    text = registry.schema(int(path[2]))
                    if text is not None:
                        self._answer(200, {"schema": text})
                        return
                    self._answer(404, {"error_code": 40403, "message": "Schema not found"})
                    return
                self._answer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def register(self, subject: str, text: str) -> int:
        with self._lock:
            schema_id = self.ids.setdefault(text, len(self.ids) + 1)
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id

    def schema(self, schema_id: int) -> str | None:
        with self._lock:
            return next((t for t, i in self.ids.items() if i == schema_id), None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def registry() -> Iterator[RegistryServer]:
    server = RegistryServer()
    yield server
    server.close()


def _framing(value: bytes) -> tuple[int, int]:
    """(magic byte, schema id) of a Confluent-framed value."""
    assert len(value) > 5, value
    magic, schema_id = struct.unpack(">bI", value[:5])
    return magic, schema_id


class _Item:
    """An event of a StatusBatch, read as the records around it are (``value()``)."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


def test_every_record_is_confluent_framed_under_its_record_name_subject(
    settings, jobwheel_env, procs, tmp_path, registry
):
    """A job submitted by the SDK runs through a scheduler and a worker all configured with the
    registry; its result comes back through ``client.wait`` (which reads the status and acks
    topics with the registry). Then every record on the requests, runs, status and acks topics
    is read raw: each is ``00`` + an id the registry gave under the subject of its record's
    full name, for the current schema version. A command sent single-object (a producer that
    has not switched yet) is run as well."""
    with_registry = settings.model_copy(update={"schema_registry_url": registry.url})
    env = {**jobwheel_env, "JOBWHEEL_SCHEMA_REGISTRY_URL": registry.url}
    start_scheduler(procs, env, tmp_path / "s1")
    worker = start_worker(procs, env, tmp_path / "w1.log", tasks=DEMO_TASKS)
    wait_for_group(settings, settings.worker_group, settings.topics.runs)
    # Announced too, so the SDK's check of the task finds it (no UnknownTaskWarning).
    wait_until(
        lambda: any(w.pid == worker.pid for w in getattr(read_workers(settings), "live", ())),
        scaled(30),
        0.2,
        "the worker never announced itself on the workers topic",
    )

    since = datetime.now(UTC) - timedelta(minutes=1)
    # A producer still on single-object encoding: the scheduler, with a registry, reads it.
    with JobClient(settings) as client:
        plain = client.schedule("plain", task="demo.echo", args={"y": 2}, now=True)
    with JobClient(with_registry) as client:
        framed = client.schedule("framed", task="demo.echo", args={"x": 1}, now=True)
        assert client.wait(framed, timeout=scaled(60)) == {"x": 1}
        assert client.wait(plain, timeout=scaled(60), since=since) == {"y": 2}

    catalogue = SchemaCatalogue.load()
    current = {v.full_name: catalogue.current(v.full_name) for v in catalogue.versions}
    reader = Codec(registry_url=registry.url)
    t = settings.topics
    wanted = {t.requests: JobCommand, t.runs: Run, t.status: StatusEvent, t.acks: StatusEvent}
    seen: dict[str, list[Any]] = {topic: [] for topic in wanted}

    def keep(msg: Any) -> None:
        seen[msg.topic()].append(msg)

    def plain_succeeded() -> bool:
        for msg in tail.poll():
            keep(msg)
        return any(
            (e := reader.decode(m.value())).state is State.SUCCEEDED and e.job_id == plain
            for m in seen[t.acks]
        )

    tail = Tail(settings, list(wanted))
    try:
        wait_until(plain_succeeded, scaled(30), 0.1, "the reader never saw 'plain' SUCCEEDED")
        tail.read_to_end(keep)
    finally:
        tail.close()

    plain_command = next(m for m in seen[t.requests] if m.key() == plain.encode())
    assert plain_command.value()[:2] == b"\xc3\x01", "the plain command was not single-object"
    # The scheduler's events of one transaction and partition come as a StatusBatch (a job
    # run now has its SCHEDULED and DISPATCHED in one): the batch and each event in it are
    # framed the same way, each under its own subject.
    batches = [m for m in seen[t.status] if isinstance(reader.decode(m.value()), StatusBatch)]
    assert batches, "no StatusBatch on the status topic"
    seen[t.status] = [m for m in seen[t.status] if m not in batches]
    seen["batch"] = batches
    seen["batched"] = [_Item(i) for m in batches for i in reader.decode(m.value()).events]
    wanted.update({"batch": StatusBatch, "batched": StatusEvent})
    for topic, model in wanted.items():
        records = [m for m in seen[topic] if m is not plain_command]
        assert records, f"nothing on {topic}"
        subject = current[f"io.jobwheel.{model.__name__}"].full_name
        for m in records:
            magic, schema_id = _framing(m.value())
            assert magic == 0, f"{topic}: not Confluent-framed: {m.value()[:10].hex(' ')}"
            assert schema_id in registry.subjects.get(subject, []), (topic, schema_id)
            assert isinstance(reader.decode(m.value()), model)
        # The registered text is the current version's schema.
        (schema_id,) = {_framing(m.value())[1] for m in records}
        assert json.loads(registry.schema(schema_id) or "null") == current[subject].source
    assert sorted(registry.subjects) == sorted(current)
    # A reader without a registry cannot read them: they are not single-object in disguise.
    with pytest.raises(SchemaDecodeError, match="no Schema Registry"):
        default_codec().decode(seen[t.runs][0].value())
    assert read_all(settings, t.dead_letter) == []
