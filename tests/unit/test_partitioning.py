"""The SDK must put a job in the partition the scheduler (aiokafka) and the Java client expect."""

from __future__ import annotations

import random
import uuid

import pytest
from aiokafka.partitioner import DefaultPartitioner

from schemas.partitioning import key_for, murmur2, partition_for, partition_for_key


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
def test_murmur2_matches_the_java_client(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected & 0xFFFFFFFF


@pytest.mark.parametrize("partitions", [1, 2, 3, 4, 12, 32, 100, 1000])
def test_partition_matches_aiokafka_default_partitioner(partitions: int) -> None:
    everything = list(range(partitions))
    partitioner = DefaultPartitioner()
    for job_id in _keys():
        expected = partitioner(key_for(job_id), everything, everything)
        assert partition_for(job_id, partitions) == expected, job_id
        assert partition_for_key(key_for(job_id), partitions) == expected


def test_partitions_must_be_positive() -> None:
    with pytest.raises(ValueError):
        partition_for("job", 0)
