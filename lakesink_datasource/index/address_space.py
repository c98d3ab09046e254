"""How much address space the key index's memory maps may take in this process.

LMDB maps an environment's whole map size into the process's address space when it opens
it (pages are backed only once touched, so an unused map costs address space, not memory).
Without a limit that is free, and every environment maps 64 GiB: it never fills, so no
write ever has to grow it.

Under an address-space limit (`RLIMIT_AS`) it is not free. Spark sets one in every Python
worker when `spark.executor.pyspark.memory` is set (`pyspark.worker_util.setup_memory_limits`,
called by `worker.py` and by the data source's planning, writing and commit workers), as
YARN and Kubernetes deployments do so that the workers' memory counts in the container;
`ulimit -v` sets one anywhere else. There, 64 GiB maps fail at once (`lmdb.MemoryError:
Cannot allocate memory`), so under a limit:

- the maps of every environment the process holds share half of the address space the
  process does not otherwise use (the other half stays for the heap: Arrow buffers, the
  rolling writer, threads' stacks);
- a map starts at twice the environment's data (at least `MIN_MAP`) and grows when a write
  finds it full (`IndexEnvironment`), by doubling where there is room;
- when the environments being opened or grown do not fit, the least recently used idle
  environments of other indexes are closed first (they open again when a write needs
  them: a write routed to many tables keeps only as many tables' indexes open as fit);
- when even then the index does not fit, `IndexTooLarge` says how much to give
  `spark.executor.pyspark.memory`.

This is the one process-wide registry of the package, because the address space is the
process's: every environment of the process draws on it.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Callable

from lakesink_datasource.errors import LakesinkError

__all__ = ["MIN_MAP", "UNCAPPED_MAP", "IndexTooLarge", "cap", "grown", "initial", "mapped", "set_releaser", "unmapped"]

UNCAPPED_MAP = 1 << 36  # 64 GiB: what every map gets without a limit (it never fills)
MIN_MAP = 4 << 20  # the smallest map under a limit: an index of a few thousand keys
MAP_SHARE = 0.5  # of the address space the process does not otherwise use
_MIB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class IndexTooLarge(LakesinkError, RuntimeError):
    """The key index needs more address space than the process's limit leaves it."""


def cap() -> int | None:
    """The process's address-space limit in bytes (its soft RLIMIT_AS), None without one."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def in_use() -> int:
    """The address space the process maps now (VmSize), 0 where /proc cannot say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _pages(size: int) -> int:
    return -(-size // _PAGE) * _PAGE


# Closes idle environments of indexes other than the one at `keep` (a directory) until
# `wanted` bytes of maps are free; returns the bytes it unmapped (environment.py's cache).
Releaser = Callable[[str, int], int]

_lock = threading.Lock()
_sizes: dict[str, int] = {}  # environment path -> the size it maps
_releaser: list[Releaser] = []


def set_releaser(releaser: Releaser) -> None:
    """Who closes idle environments when maps need room (the per-process cache of them)."""
    _releaser[:] = [releaser]


def mapped(path: str, size: int) -> None:
    """The environment at `path` maps `size` bytes now."""
    with _lock:
        _sizes[path] = size


def unmapped(path: str) -> None:
    with _lock:
        _sizes.pop(path, None)


def _free(limit: int, own: int) -> tuple[int, int, int]:
    """(bytes the maps may still take, counting `own`'s current map as free; the process's
    use outside the maps; the maps' total)."""
    with _lock:
        maps = sum(_sizes.values())
    other = max(0, in_use() - maps)
    allowed = int((limit - other) * MAP_SHARE)
    return allowed - maps + own, other, maps


def _fit(path: str, *, needed: int, wanted: int, own: int) -> int:
    """A map size for `path` between `needed` and `wanted` that fits the limit, closing idle
    environments of other indexes when it would not; IndexTooLarge when nothing fits."""
    limit = cap()
    if limit is None:
        return max(wanted, needed)
    needed, wanted = _pages(needed), _pages(max(wanted, needed))
    free, _other, _maps = _free(limit, own)
    if free < wanted and _releaser:
        # Not under the registry's lock: closing takes each environment's own lock.
        _releaser[0](os.path.dirname(path), wanted - free)
        free, _other, _maps = _free(limit, own)
    if free < needed:
        raise too_large(path, needed, limit, own)
    return min(wanted, free // _PAGE * _PAGE)


def _unopened(index: str, opening: str) -> int:
    """What the environments of the index in directory `index` that this process has not
    mapped yet (besides `opening`) will want: twice their data."""
    with _lock:
        open_now = set(_sizes)
    wanted = 0
    try:
        names = os.listdir(index)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(index, name)
        if path != opening and path not in open_now:
            try:
                wanted += max(MIN_MAP, 2 * os.path.getsize(os.path.join(path, "data.mdb")))
            except OSError:
                pass
    return wanted


def too_large(path: str, needed: int, limit: int, own: int = 0) -> IndexTooLarge:
    free, other, maps = _free(limit, own)
    # Maps may take MAP_SHARE of what the rest of the process leaves: the limit that fits
    # them, the index's environments not opened yet counted in, with a quarter to spare.
    fitting = other + (maps - own + needed + _unopened(os.path.dirname(path), path)) / MAP_SHARE
    suggest = -(-int(fitting * 1.25) // (512 * _MIB)) * 512
    return IndexTooLarge(
        f"the key index at {os.path.dirname(path)} needs {needed / _MIB:,.0f} MiB of address space for the memory map "
        f"of {os.path.basename(path)}, but this Python process may map {limit / _MIB:,.0f} MiB in all (its RLIMIT_AS: "
        f"Spark sets it in every Python worker from spark.executor.pyspark.memory; ulimit -v elsewhere), of which "
        f"{other / _MIB:,.0f} MiB are in use and {maps / _MIB:,.0f} MiB mapped by key indexes, leaving "
        f"{max(free, 0) / _MIB:,.0f} MiB for them. Set spark.executor.pyspark.memory to at least {suggest}m (or leave "
        "it unset: the key index then maps what it needs), or route the keyed rows over more executors with "
        "cluster_by_key so each holds a smaller part of the index. Nothing of this batch was committed"
    )


def initial(path: str, data_bytes: int, requested: int | None = None) -> int:
    """The map size to open the environment at `path` with, whose data file holds
    `data_bytes`: `requested` if given, else 64 GiB without a limit, else twice the data
    (at least MIN_MAP) where it fits, at least the data and some room to write."""
    needed = data_bytes + max(MIN_MAP // 4, data_bytes // 8)
    if requested is not None:
        return _fit(path, needed=max(requested, data_bytes), wanted=requested, own=0) if cap() is not None else max(requested, data_bytes)
    if cap() is None:
        return max(UNCAPPED_MAP, needed)
    return _fit(path, needed=needed, wanted=max(MIN_MAP, 2 * data_bytes), own=0)


def grown(path: str, current: int, used: int) -> int:
    """The size to grow the map of `path` to, now `current` bytes with `used` of them taken,
    after a write found it full (or another process's writes outgrew it)."""
    step = max(MIN_MAP, current // 4)
    return _fit(path, needed=max(current, used) + step, wanted=2 * max(current, used), own=current)
