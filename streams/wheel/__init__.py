"""The pure timing wheel: a time-ordered index of upcoming fires over a per-partition store."""

from __future__ import annotations

from streams.wheel.entry import (
    ENTRY_VERSION,
    TAG_FIRE,
    TAG_RETRY,
    WheelEntry,
    encode_key,
    visibility_tag,
)
from streams.wheel.wheel import TimingWheel

__all__ = [
    "ENTRY_VERSION",
    "TAG_FIRE",
    "TAG_RETRY",
    "TimingWheel",
    "WheelEntry",
    "encode_key",
    "visibility_tag",
]
