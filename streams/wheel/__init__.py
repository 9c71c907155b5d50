"""The pure timing wheel: a time-ordered index of upcoming fires over a per-partition store."""

from __future__ import annotations

from jobwheel.streams.wheel.entry import ENTRY_VERSION, WheelEntry, encode_key, entry_key
from jobwheel.streams.wheel.wheel import TimingWheel

__all__ = ["ENTRY_VERSION", "TimingWheel", "WheelEntry", "encode_key", "entry_key"]
