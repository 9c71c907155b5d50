"""The schema catalogue: every ``schemas/avro/<name>.v<N>.avsc`` parsed once, with its Parsing
Canonical Form and CRC-64-AVRO fingerprint (what single-object encoding frames a body with);
the highest ``N`` of a name is its current version."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from jobwheel.errors import ConfigError

AVRO_DIR = Path(__file__).resolve().parent / "avro"
NAMESPACE = "io.jobwheel"
_FILE_RE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")


def crc64_avro(data: bytes) -> int:
    """The Avro spec's CRC-64-AVRO (Rabin) fingerprint of ``data`` as an unsigned int,
    computed by fastavro (which returns the little-endian bytes as hex, as framed on the
    wire)."""
    return int.from_bytes(_fingerprint_bytes(data.decode("utf-8")), "little")


def _fingerprint_bytes(canonical: str) -> bytes:
    return bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


@dataclass(frozen=True)
class SchemaVersion:
    """One ``.avsc`` file, parsed once: everything encode/decode needs without recomputing."""

    name: str  # file stem, e.g. "job_command"
    version: int
    full_name: str  # e.g. "io.jobwheel.JobCommand"
    source: dict[str, Any]  # the JSON as written (with docs), what a registry is given
    parsed: dict[str, Any]  # fastavro-parsed
    canonical: str  # Parsing Canonical Form
    fingerprint: bytes  # 8 bytes, little-endian, as framed on the wire

    def label(self) -> str:
        return f"{self.name}.v{self.version}"


def load_version(path: Path) -> SchemaVersion:
    match = _FILE_RE.match(path.name)
    if match is None:
        raise ConfigError(f"schema file {path.name!r} is not named <name>.v<N>.avsc")
    source = json.loads(path.read_text(encoding="utf-8"))
    # Parse from a copy: fastavro annotates the dict it parses.
    parsed = parse_schema(json.loads(json.dumps(source)))
    canonical = to_parsing_canonical_form(parsed)
    return SchemaVersion(
        name=match["name"],
        version=int(match["version"]),
        full_name=parsed["name"],
        source=source,
        parsed=parsed,
        canonical=canonical,
        fingerprint=_fingerprint_bytes(canonical),
    )


@dataclass(frozen=True)
class SchemaCatalogue:
    """All versions of all schemas in a directory; the highest version of a name is current."""

    versions: tuple[SchemaVersion, ...]

    @classmethod
    def load(cls, directory: Path = AVRO_DIR) -> SchemaCatalogue:
        versions = tuple(
            load_version(p) for p in sorted(directory.glob("*.avsc")) if _FILE_RE.match(p.name)
        )
        if not versions:
            raise ConfigError(f"no <name>.v<N>.avsc schema files in {directory}")
        seen: dict[bytes, SchemaVersion] = {}
        for v in versions:
            other = seen.setdefault(v.fingerprint, v)
            if other is not v:
                raise ConfigError(
                    f"{v.name}.v{v.version} and {other.name}.v{other.version} have the same "
                    "canonical form; a new version must change the fields"
                )
        return cls(versions)

    def current(self, full_name: str) -> SchemaVersion:
        candidates = [v for v in self.versions if v.full_name == full_name]
        if not candidates:
            raise ConfigError(f"no schema for record {full_name}")
        return max(candidates, key=lambda v: v.version)
