"""Bytes <-> models for every record jobwheel puts on a topic.

Every message carries the identity of the schema it was written with, so a reader can always
tell which version it holds and resolve it against its own (current) version:

* **Avro single-object encoding** (default): ``C3 01`` + the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's Parsing Canonical Form + the Avro binary body. No registry
  is needed; the fingerprints of all known versions are compiled in from ``schemas/avro``.
* **Confluent wire format** (when a Schema Registry URL is given): ``00`` + the 4-byte big-endian
  schema id + the Avro binary body. Subjects use the record-name strategy
  (``io.jobwheel.JobCommand`` ...), because one codec serves several topics.

A reader with a registry decodes both framings, so a deployment can switch framing without a
flag day. Schema files are ``<name>.v<N>.avsc``; the highest ``N`` of a name is the current
version: it is what :meth:`Codec.encode` writes and what :meth:`Codec.decode` resolves every older
writer version to (Avro schema resolution fills added fields with their defaults).

The pieces it frames with live next to it: the schema versions and their fingerprints in
:mod:`jobwheel.schemas.catalogue`, the conversions of models to Avro dicts in
:mod:`jobwheel.schemas.conversions`, the Schema Registry adapter in
:mod:`jobwheel.schemas.registry`.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import to_parsing_canonical_form

from jobwheel.errors import SchemaDecodeError, ValidationError
from jobwheel.schemas.catalogue import SchemaCatalogue, SchemaVersion
from jobwheel.schemas.catalogue import crc64_avro as crc64_avro  # the fingerprint, re-exported
from jobwheel.schemas.conversions import KINDS, RECORD_MODELS, values_maker
from jobwheel.schemas.flat import FlatError, FlatRecord, nested_writer
from jobwheel.schemas.models import (
    JobCommand,
    Run,
    StatusBatch,
    StatusEvent,
)
from jobwheel.schemas.registry import ConfluentSchemaRegistry, SchemaRegistry

log = logging.getLogger(__name__)

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0
_SINGLE_HEADER = len(SINGLE_OBJECT_MAGIC) + 8
_CONFLUENT_HEADER = 5
_BATCH = "io.jobwheel.StatusBatch"

Model = JobCommand | Run | StatusEvent | StatusBatch


# --- the codec ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Writer:
    version: SchemaVersion
    to_avro: Callable[[Any], dict[str, Any]]
    #: The fast path when the model's fields are the schema's: ``write(value, header)``.
    write: Callable[[Any, bytes], bytes] | None = None


@dataclass(frozen=True)
class _Reader:
    """How to read a body written with ``writer``: resolve to ``reader`` (None: same schema)."""

    writer: dict[str, Any]
    reader: dict[str, Any] | None
    from_avro: Callable[[dict[str, Any]], Any]
    label: str
    full_name: str = ""
    flat: FlatRecord | None = None  # the fast path for a flat writer schema (Run, StatusEvent)
    #: The fast reader of the model: ``flat``, or one of nested records (JobCommand) ...
    fast: FlatRecord | None = None
    make: Callable[[list[Any]], Any] | None = None  # ... and its values -> model


def _flat_writer(
    version: SchemaVersion, model: type, native: bool
) -> Callable[[Any, bytes], bytes] | None:
    """A fast writer when every schema field is a model attribute of the same name (in the
    records nested in it too: a command's body and trigger)."""
    flat = FlatRecord.compile(version.parsed, native=native)
    if flat is None:
        return nested_writer(version.parsed, RECORD_MODELS, native=native)
    if not dataclasses.is_dataclass(model):
        return None
    attributes = {f.name for f in dataclasses.fields(model)}
    return flat.writer() if set(flat.names) <= attributes else None


def _flat_reader(
    writer: dict[str, Any], current: SchemaVersion, model: type, native: bool
) -> FlatRecord | None:
    """A fast reader for ``writer`` when resolving it to ``current`` is only "fields the writer
    lacks take their defaults", and those defaults are the model's own."""
    flat = FlatRecord.compile(writer, native=native)
    if flat is None or not dataclasses.is_dataclass(model):
        return None
    reader_fields = {f["name"]: f for f in current.parsed["fields"]}
    if not set(flat.names) <= set(reader_fields):
        return None
    defaults = {f.name: f.default for f in dataclasses.fields(model)}
    for name, f in reader_fields.items():
        if name in flat.names:
            if f["type"] != next(w["type"] for w in writer["fields"] if w["name"] == name):
                return None  # a promotion or a changed type: leave it to fastavro
        elif "default" not in f or defaults.get(name, dataclasses.MISSING) != f["default"]:
            return None
    return flat


class Codec:
    """Encode models with the current schema versions; decode any known version to the current.

    Thread-safe for encode/decode (no shared mutable state besides the registry-id caches,
    whose races only cost a repeated registry call).

    ``native=False`` keeps the fast path (:mod:`jobwheel.schemas.flat`) on its generated
    Python where the C module is built: the tests and benchmarks compare the two.
    """

    def __init__(
        self,
        registry_url: str | None = None,
        *,
        registry: SchemaRegistry | None = None,
        catalogue: SchemaCatalogue | None = None,
        native: bool = True,
    ) -> None:
        self.catalogue = catalogue or SchemaCatalogue.load()
        self._native = native
        if registry is None and registry_url:
            registry = ConfluentSchemaRegistry(registry_url)
        self.registry = registry
        self._writers: dict[type, _Writer] = {}
        self._readers: dict[bytes, _Reader] = {}
        self._current: dict[str, SchemaVersion] = {}
        for full_name, kind in KINDS.items():
            current = self.catalogue.current(full_name)
            self._current[full_name] = current
            self._writers[kind.model] = _Writer(
                current, kind.to_avro, _flat_writer(current, kind.model, native)
            )
        for v in self.catalogue.versions:
            kind = KINDS.get(v.full_name)
            if kind is None:
                continue
            self._readers[v.fingerprint] = self._reader_for(v.parsed, v.full_name, v.label())
        self._headers: dict[type, bytes] = {}
        if registry is None:
            for model, w in self._writers.items():
                self._headers[model] = SINGLE_OBJECT_MAGIC + w.version.fingerprint
        self._registry_readers: dict[int, _Reader] = {}

    def _reader_for(self, writer: dict[str, Any], full_name: str, label: str) -> _Reader:
        current = self._current[full_name]
        same = to_parsing_canonical_form(writer) == current.canonical
        kind = KINDS[full_name]
        flat = _flat_reader(writer, current, kind.model, self._native)
        # A record with records in it (a command: its body, its trigger) has a fast reader
        # when it was written with the current schema (nothing to resolve).
        if flat is not None or not same:
            fast = flat
        else:
            fast = FlatRecord.compile_nested(writer, native=self._native)
        return _Reader(
            writer=writer,
            reader=None if same else current.parsed,
            from_avro=kind.from_avro,
            label=label,
            full_name=full_name,
            flat=flat,
            fast=fast,
            make=None if fast is None else values_maker(writer),
        )

    # encode ----------------------------------------------------------------------------

    def encode(self, value: Model) -> bytes:
        """``value`` framed and encoded with the current version of its schema."""
        writer = self._writers.get(type(value))
        if writer is None:
            raise ValidationError(
                "value",
                f"cannot encode {type(value).__name__}; expected one of "
                "JobCommand/Run/StatusEvent/StatusBatch",
            )
        header = self._headers.get(type(value)) or self._registry_header(type(value), writer)
        if writer.write is not None:
            try:
                return writer.write(value, header)
            except (FlatError, UnicodeEncodeError):  # a lone surrogate in a string field
                pass  # fastavro decides: it encodes the value or says what is wrong with it
        out = io.BytesIO()
        out.write(header)
        try:
            schemaless_writer(out, writer.version.parsed, writer.to_avro(value))
        except ValidationError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
            raise ValidationError(
                "value", f"{type(value).__name__} does not fit {writer.version.label()}: {exc}"
            ) from exc
        return out.getvalue()

    def _registry_header(self, model: type, writer: _Writer) -> bytes:
        assert self.registry is not None
        v = writer.version
        schema_id = self.registry.register(v.full_name, json.dumps(v.source))
        header = struct.pack(">bI", CONFLUENT_MAGIC, schema_id)
        self._headers[model] = header
        self._registry_readers.setdefault(
            schema_id, self._reader_for(v.parsed, v.full_name, f"registry id {schema_id}")
        )
        log.info(
            "schema registered",
            extra={"subject": v.full_name, "schema_id": schema_id, "version": v.version},
        )
        return header

    # decode ----------------------------------------------------------------------------

    def decode(self, data: bytes) -> Model:
        """The model in ``data``, resolved to the current schema version.

        Raises :class:`SchemaDecodeError` (with ``raw`` = ``data``) for anything that is not a
        complete message of a known schema version.
        """
        if type(data) is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise SchemaDecodeError(f"expected bytes, got {type(data).__name__}", raw=None)
            data = bytes(data)
        if data[:2] == SINGLE_OBJECT_MAGIC:
            fingerprint = data[2:_SINGLE_HEADER]
            reader = self._readers.get(fingerprint)
            if reader is None:
                if len(fingerprint) < 8:
                    raise SchemaDecodeError(
                        f"truncated header: {len(data)} bytes, a single-object header is "
                        f"{_SINGLE_HEADER}",
                        raw=data,
                    )
                raise SchemaDecodeError(
                    f"unknown schema fingerprint {int.from_bytes(fingerprint, 'little'):016x}: "
                    "written with a schema version this reader does not know; upgrade the reader",
                    raw=data,
                )
            start = _SINGLE_HEADER
        elif data[:1] == b"\x00":
            reader = self._registry_reader(data)
            start = _CONFLUENT_HEADER
        else:
            raise SchemaDecodeError(
                f"not a jobwheel message: starts with {data[:4].hex() or 'nothing'}, expected "
                "c301 (Avro single-object) or 00 (Confluent wire format)",
                raw=data,
            )
        if reader.make is not None:
            try:
                return reader.make(reader.fast.decode(data, start))  # type: ignore[union-attr]
            except (FlatError, ValueError, TypeError, KeyError):
                pass  # fastavro decides, with its own error message
        body = io.BytesIO(data)
        body.seek(start)
        try:
            record = schemaless_reader(body, reader.writer, reader.reader, return_record_name=True)
        except Exception as exc:
            raise SchemaDecodeError(
                f"body does not decode as {reader.label}: {type(exc).__name__}: {exc}", raw=data
            ) from exc
        if body.tell() != len(data):
            raise SchemaDecodeError(
                f"{len(data) - body.tell()} trailing bytes after a {reader.label} body", raw=data
            )
        try:
            return reader.from_avro(record)
        except Exception as exc:
            raise SchemaDecodeError(
                f"{reader.label} record is not a valid value: {type(exc).__name__}: {exc}",
                raw=data,
            ) from exc

    def _registry_reader(self, data: bytes) -> _Reader:
        if len(data) < _CONFLUENT_HEADER:
            raise SchemaDecodeError(
                f"truncated header: {len(data)} bytes, a Confluent header is 5", raw=data
            )
        (schema_id,) = struct.unpack(">I", data[1:5])
        reader = self._registry_readers.get(schema_id)
        if reader is not None:
            return reader
        if self.registry is None:
            raise SchemaDecodeError(
                f"Confluent-framed message (schema id {schema_id}) but no Schema Registry is "
                "configured; set JOBWHEEL_SCHEMA_REGISTRY_URL",
                raw=data,
            )
        schema_str = self.registry.lookup(schema_id)
        if schema_str is None:
            raise SchemaDecodeError(f"schema id {schema_id} is unknown to the registry", raw=data)
        try:
            writer = parse_schema(json.loads(schema_str))
        except Exception as exc:
            raise SchemaDecodeError(
                f"schema id {schema_id} is not a usable Avro schema: {exc}", raw=data
            ) from exc
        full_name = writer.get("name") if isinstance(writer, dict) else None
        if full_name not in KINDS:
            raise SchemaDecodeError(
                f"schema id {schema_id} is {full_name!r}, not a jobwheel record", raw=data
            )
        reader = self._reader_for(writer, full_name, f"{full_name} (registry id {schema_id})")
        self._registry_readers[schema_id] = reader
        return reader

    def decode_fields(self, data: bytes) -> tuple[str, tuple[str, ...], list[Any]] | None:
        """``(record full name, field names, values)`` of a single-object framed record of a
        flat schema, straight from the bytes without building a model (readers that only
        copy fields, like the status sink); None when the fast path does not apply or refuses
        the bytes: use :meth:`decode`, which also says what is wrong with them."""
        if type(data) is not bytes or data[:2] != SINGLE_OBJECT_MAGIC:
            return None
        reader = self._readers.get(data[2:_SINGLE_HEADER])
        if reader is None or reader.flat is None:
            return None
        try:
            values = reader.flat.decode(data, _SINGLE_HEADER)
        except FlatError:
            return None
        return reader.full_name, reader.flat.names, values

    def batch_items(self, data: bytes) -> tuple[bytes, ...] | None:
        """The event messages a :class:`StatusBatch` record carries, oldest first; None when
        ``data`` is not a batch (one event, or bytes :meth:`decode` will say are wrong). A
        batch whose body is damaged raises :class:`SchemaDecodeError`."""
        if data[:2] == SINGLE_OBJECT_MAGIC:
            reader = self._readers.get(data[2:_SINGLE_HEADER])
        elif data[:1] == b"\x00":
            try:
                reader = self._registry_reader(data)
            except SchemaDecodeError:
                return None
        else:
            return None
        if reader is None or reader.full_name != _BATCH:
            return None
        batch = self.decode(data)
        assert isinstance(batch, StatusBatch)
        return batch.events

    def decode_events(self, data: bytes) -> list[Model]:
        """Every record ``data`` holds: a :class:`StatusBatch`'s events decoded one by one, or
        the one record. For readers of the status topic that want models."""
        items = self.batch_items(data)
        return [self.decode(data)] if items is None else [self.decode(i) for i in items]


@functools.cache
def default_codec(registry_url: str | None = None) -> Codec:
    """A process-wide codec (schemas parsed once). Pass ``settings.schema_registry_url``."""
    return Codec(registry_url)
