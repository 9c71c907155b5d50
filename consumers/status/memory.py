"""The status service's memory budget (``JOBWHEEL_STATUS_MEMORY_MIB``, 1 GiB by default) and the
bounds derived from it.

What the sink's resident memory is made of, measured with the resident set of a ``jobwheel
sink`` sampled every 10 s under a steady load (docs/operations.md, "Memory"):

- about 450 MiB of the embedded engine's own code (a 530 MiB shared library, file pages the
  kernel may drop but counts), and some 60 MiB of interpreter and libraries: fixed;
- the embedded engine's heap (its own allocator): inserts, merges, caches, and the freed pages it
  keeps for reuse. Unbounded by default: the engine sizes itself for the machine (a limit of
  90 % of RAM, mark and primary index caches of 5 GiB each, freed pages returned to the system
  only past 20 % of that limit), so it kept what it once touched and grew with every wider
  merge;
- the consumer's fetch queue (librdkafka prefetches up to 64 MiB by default while the sink is
  behind) and the batches of decoded rows (about 1 KiB of Python objects per row; one being
  filled, one being inserted), allocated with the C library's allocator, which keeps freed
  memory in its heaps unless asked to give it back.

Each of these is bounded here, as a share of the budget: the engine by its own server settings
(``max_server_memory_usage``, which also makes it purge freed pages early, and each cache's
size), the fetch queue by ``queued.max.messages.kbytes``, a batch by its row count; the sink keeps
large buffers out of the C heap (:func:`limit_heap_growth`) and returns its freed memory to
the system after its inserts (:func:`release_freed_memory`).
The shares leave room for the fixed part: the engine gets 5/16 of the budget, the fetch queue
1/32, and two batches about 1/16.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobwheel.settings import Settings

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: Rows a batch may hold per MiB of budget: 1 GiB allows 32,768 rows, about 35 MiB of decoded
#: rows in Python (measured: about 600 B per row of a plain event, more with a job's spec).
BATCH_ROWS_PER_MIB = 32


@dataclass(frozen=True)
class StatusMemory:
    """The bounds one status service process keeps to, from its budget in MiB."""

    budget_mib: int

    @classmethod
    def from_settings(cls, settings: Settings) -> StatusMemory:
        return cls(settings.status_memory_mib)

    @property
    def engine_bytes(self) -> int:
        """The embedded engine's hard limit (``max_server_memory_usage``): a query, insert or
        merge that would pass it fails with ``MEMORY_LIMIT_EXCEEDED`` (an insert is retried by
        the sink, a merge by the engine; a 50,000-row insert needs under 128 MiB)."""
        return self.budget_mib * MIB * 5 // 16

    def engine_options(self) -> dict[str, str]:
        """Server settings given to the embedded engine when it starts (chdb takes them as
        startup arguments; they cannot change while it runs).

        Merges may take half of the engine's limit before new ones wait; the caches that
        MergeTree reads keep (marks, primary index, secondary index marks, query conditions,
        compiled expressions) get small fixed shares, and the uncompressed caches stay off.
        """
        budget = self.budget_mib * MIB
        return {
            "max_server_memory_usage": str(self.engine_bytes),
            "merges_mutations_memory_usage_soft_limit": str(self.engine_bytes // 2),
            "mark_cache_size": str(budget // 32),
            "primary_index_cache_size": str(budget // 64),
            "index_mark_cache_size": str(budget // 128),
            "query_condition_cache_size": str(budget // 128),
            "compiled_expression_cache_size": str(budget // 64),
            "uncompressed_cache_size": "0",
            "index_uncompressed_cache_size": "0",
        }

    @property
    def fetch_queue_kib(self) -> int:
        """librdkafka's ``queued.max.messages.kbytes`` of the sink's consumer: how much it
        prefetches while the sink is behind (its default, 64 MiB, is a sixteenth of a 1 GiB
        budget by itself)."""
        return self.budget_mib * 1024 // 32

    @property
    def batch_rows(self) -> int:
        """The most rows an insert batch holds (``JOBWHEEL_STATUS_BATCH_SIZE`` is capped at
        this): under load a batch grows while the previous insert runs, and two are alive."""
        return self.budget_mib * BATCH_ROWS_PER_MIB


def engine_settings_differing(actual: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """``name: actual (wanted value)`` of each wanted server setting the engine does not have
    (it was started before, by another open in this process, with other options)."""
    return [
        f"{name}: {actual.get(name)} (wanted {value})"
        for name, value in wanted.items()
        if actual.get(name) != value
    ]


@functools.cache
def _glibc() -> Any:
    """The C library if it is glibc (it has ``malloc_trim`` and ``mallopt``), else None."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
            return None
    except OSError:  # not loadable: nothing to tune this way
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


#: glibc's mallopt parameters (malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
#: Allocations from this size up get pages of their own, returned when freed.
MMAP_THRESHOLD_BYTES = 128 * 1024


def limit_heap_growth() -> bool:
    """Keep the C heap from holding large freed buffers (glibc ``mallopt``); False where there
    is no glibc. Call it before the process starts its threads.

    Why: glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), so
    after the first batches the fetch buffers, the encoded inserts (MiBs each) and the lists of
    a batch's rows came from the heap and left it fragmented; and each thread that allocates
    may get an arena of its own (up to 8 per core), each keeping its own free memory. A fixed
    threshold of 128 KiB and two arenas keep that from growing with the data.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_ARENA_MAX, 2)
    return True


def release_freed_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``); False where
    there is no such call.

    Why: the fetched records and the decoded rows are many small allocations, and glibc keeps
    the pages of freed ones in its heaps for reuse; measured, 120 to 170 MiB of such free memory
    stayed resident in the sink after a backlog was worked off.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
