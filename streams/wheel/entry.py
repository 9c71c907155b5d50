"""The on-disk form of a wheel entry: a byte-ordered key and a versioned value.

Key: ``due_ms`` as 8 bytes big-endian, then the job id in UTF-8, a NUL byte, then the tag in
UTF-8. Big-endian first means byte order == time order, so "everything due by ``now``" is the key
range ``[.., (now + 1) as 8 bytes)``. Entries due in the same millisecond sort by job id, then tag,
which keeps a batch deterministic. The job id comes before the tag so that one job can hold several
entries at the same instant (its fire and an attempt's visibility deadline); the NUL separator is
why a job id may not contain NUL. Tags are opaque to the wheel (the processor defines them).

Value: one version byte (:data:`ENTRY_VERSION`) then the caller's payload, so a later release can
change what it stores and still recognise (or knowingly skip) what an older one wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobwheel.errors import StateError, ValidationError

ENTRY_VERSION = 1
_DUE_BYTES = 8
MAX_DUE_MS = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class WheelEntry:
    due_ms: int
    job_id: str
    tag: str
    payload: bytes
    key: bytes


def due_prefix(due_ms: int) -> bytes:
    """The 8-byte key prefix of ``due_ms``: every key of that millisecond starts with it."""
    if not 0 <= due_ms <= MAX_DUE_MS:
        raise ValidationError(
            "due_ms", f"{due_ms} is outside 0..2^63-1 epoch milliseconds; pass a real instant"
        )
    return due_ms.to_bytes(_DUE_BYTES, "big")


def encode_key(due_ms: int, job_id: str, tag: str) -> bytes:
    if "\x00" in job_id:
        raise ValidationError("job_id", "must not contain NUL characters; use printable ids")
    return due_prefix(due_ms) + job_id.encode() + b"\x00" + tag.encode()


def entry_key(due_ms: int, job_key: bytes, tag: bytes) -> bytes:
    """:func:`encode_key` for a job id and tag that are already UTF-8 bytes (the state layer
    indexes records by their raw keys; checking them again here would cost every write)."""
    return due_ms.to_bytes(_DUE_BYTES, "big") + job_key + b"\x00" + tag


def encode_value(payload: bytes) -> bytes:
    return bytes((ENTRY_VERSION,)) + payload


def decode_due_ms(key: bytes) -> int:
    return int.from_bytes(key[:_DUE_BYTES], "big")


def decode_entry(key: bytes, value: bytes) -> WheelEntry:
    """Rebuild an entry; :class:`StateError` if the record is not one this version understands."""
    separator = key.find(b"\x00", _DUE_BYTES)
    if len(key) < _DUE_BYTES + 1 or separator < 0:
        raise StateError(f"wheel key {key!r} is not <8-byte due><job id>\\0<tag>")
    if not value or value[0] != ENTRY_VERSION:
        version = value[0] if value else None
        raise StateError(
            f"wheel entry {key!r} has version {version}, this build reads {ENTRY_VERSION}; "
            "run a release that knows it"
        )
    try:
        job_id = key[_DUE_BYTES:separator].decode()
        tag = key[separator + 1 :].decode()
    except UnicodeDecodeError as exc:
        raise StateError(f"wheel key {key!r} is not UTF-8: {exc}") from exc
    return WheelEntry(decode_due_ms(key), job_id, tag, bytes(value[1:]), bytes(key))
