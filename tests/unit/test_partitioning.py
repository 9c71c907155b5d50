"""Every producer must put a job in the partition the Java client (and librdkafka's
``murmur2_random``) would: the scheduler owns jobs by that partition. Each murmur2 test runs on
the C (``schemas/_murmur2.c``, what a built install uses) and on the Python reference; the
first test fails when the C could have been built and was not."""

from __future__ import annotations

import importlib
import importlib.util
import random
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from jobwheel.schemas import partitioning
from jobwheel.schemas.partitioning import (
    key_for,
    murmur2,
    murmur2_python,
    partition_for,
    partition_for_key,
)
from tests.support import built_c_module

REPO = Path(__file__).resolve().parents[2]
_native = importlib.util.find_spec("jobwheel.schemas._murmur2")
#: Each implementation of murmur2, by name; a test takes ``impl``.
IMPLS: dict[str, Callable[[bytes], int]] = {"python": murmur2_python}
if _native is not None:
    IMPLS["c"] = importlib.import_module("jobwheel.schemas._murmur2").murmur2
impls = pytest.mark.parametrize("impl", ["c", "python"])


def _impl(name: str) -> Callable[[bytes], int]:
    if name not in IMPLS:
        pytest.skip("schemas/_murmur2.c is not built (the first test says whether it should be)")
    return IMPLS[name]


def test_the_c_murmur2_is_built_and_is_what_the_partitioner_uses() -> None:
    module = built_c_module("jobwheel.schemas._murmur2", REPO / "schemas" / "_murmur2.c")
    assert murmur2 is module.murmur2 and partitioning.murmur2 is module.murmur2


def _keys() -> list[str]:
    rnd = random.Random(7)
    keys = [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "abcde",
        "job-1",
        "ünïcødé-job",
        "日本語のジョブ",
        "x" * 257,
    ]
    keys += [uuid.UUID(int=rnd.getrandbits(128)).hex for _ in range(2000)]
    keys += [f"tenant-{i}:{i * 7919}" for i in range(2000)]
    keys += [
        "".join(chr(rnd.randrange(32, 0x3000)) for _ in range(rnd.randrange(1, 40)))
        for _ in range(500)
    ]
    return keys


def test_key_is_raw_utf8_of_the_job_id() -> None:
    assert key_for("job-1") == b"job-1"
    assert key_for("ü") == b"\xc3\xbc"


# Values from the Java client's test suite (UtilsTest.testMurmur2).
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
@impls
def test_murmur2_matches_the_java_client(impl: str, data: bytes, expected: int) -> None:
    assert _impl(impl)(data) == expected & 0xFFFFFFFF


def _java_partition(key: bytes, partitions: int) -> int:
    """``Utils.toPositive(Utils.murmur2(key)) % partitions``, transcribed from the Java client
    with its signed 32-bit arithmetic: an independent reading of the same algorithm."""

    def i32(x: int) -> int:
        x &= 0xFFFFFFFF
        return x - (1 << 32) if x & 0x80000000 else x

    def ushr(x: int, n: int) -> int:  # Java's >>>
        return (x & 0xFFFFFFFF) >> n

    m, r = 0x5BD1E995, 24
    length = len(key)
    h = i32(0x9747B28C ^ length)
    for i in range(length // 4):
        k = int.from_bytes(key[4 * i : 4 * i + 4], "little")
        k = i32(k * m)
        k ^= ushr(k, r)
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    rest, tail = length % 4, length & ~3
    if rest == 3:
        h = i32(h ^ ((key[tail + 2] & 0xFF) << 16))
    if rest >= 2:
        h = i32(h ^ ((key[tail + 1] & 0xFF) << 8))
    if rest >= 1:
        h = i32(h ^ (key[tail] & 0xFF))
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    h = i32(h ^ ushr(h, 15))
    return (h & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 12, 32, 100, 1000])
def test_partition_matches_the_java_default_partitioner(partitions: int) -> None:
    for job_id in _keys():
        expected = _java_partition(key_for(job_id), partitions)
        assert partition_for(job_id, partitions) == expected, job_id
        assert partition_for_key(key_for(job_id), partitions) == expected


@impls
def test_murmur2_matches_an_independent_reading_of_the_java_client(impl: str) -> None:
    """Every key length modulo 4, bytes of every value (the C reads them unsigned), and keys
    long enough for many rounds."""
    rnd = random.Random(11)
    keys = [bytes(rnd.randrange(256) for _ in range(n)) for n in range(70) for _ in range(20)]
    keys += [bytes([b]) * n for b in (0, 0x7F, 0x80, 0xFF) for n in range(1, 9)]
    keys.append(bytes(range(256)) * 40)
    for key in keys:
        expected = _java_partition(key, 0x7FFFFFFF)
        assert (_impl(impl)(key) & 0x7FFFFFFF) % 0x7FFFFFFF == expected, key


def test_the_c_murmur2_takes_only_bytes() -> None:
    c = _impl("c")
    for wrong in ("job-1", bytearray(b"job-1"), memoryview(b"job-1"), None, 7):
        with pytest.raises(TypeError, match="takes bytes"):
            c(wrong)  # type: ignore[arg-type]


def test_partitions_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_for("job", 0)
