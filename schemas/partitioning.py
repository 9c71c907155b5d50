"""Which partition a job lives in: the key bytes and Kafka's murmur2 partitioner.

Every producer of the co-partitioned topics (the SDK and the workers via confluent-kafka, a
service in another language) must put one job in the same partition number, or the scheduler
that owns the job never sees its commands or acknowledgements. So the key is fixed to the job id
as raw UTF-8 bytes and the partitioner to the Java client's default: murmur2 of the key bytes,
made positive with ``& 0x7fffffff``, modulo the partition count. librdkafka's ``murmur2_random``
and aiokafka's ``DefaultPartitioner`` compute the same thing for keyed records; librdkafka's
default ``consistent_random`` (CRC32) does not. (The scheduler writes each output to the
partition of its input, by number.)

:func:`murmur2` is C (``schemas/_murmur2.c``) when the install built it, and the Python here,
:func:`murmur2_python`, otherwise; the Python is the reference the tests hold the C to. The
scheduler checks every command's partition, and the Python loop was a few per cent of a
command's cost.
"""

from __future__ import annotations

import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def key_for(job_id: str) -> bytes:
    """The record key of every message about ``job_id``: its UTF-8 bytes, nothing else."""
    return job_id.encode("utf-8")


def murmur2_python(data: bytes) -> int:
    """Kafka's murmur2 (Java ``Utils.murmur2``) as an unsigned 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - (length % 4)
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length - whole
    if rest >= 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


try:
    from jobwheel.schemas._murmur2 import murmur2
except ImportError:  # not built (no C compiler at install): the same result, slower
    murmur2 = murmur2_python


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a record with ``key`` among ``partitions`` (Java default partitioner)."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def partition_for(job_id: str, partitions: int) -> int:
    """The partition every record about ``job_id`` lands in, on every co-partitioned topic."""
    return partition_for_key(key_for(job_id), partitions)
