"""A key index directory whose file system is full: a `LakesinkError` naming `index_dir`.

LMDB says so as `mdb_txn_commit: Input/output error` (its page writes came back short) or
`No space left on device`, and the published copies a cold host downloads there fail with
ENOSPC. Nothing is lost either way: the write transaction is aborted whole, the task fails,
its batch is never committed, and the next sync undoes whatever the task's earlier
transactions wrote. What the user needs is the option to look at and what to do.
"""

from __future__ import annotations

import errno
import os

import lmdb

from lakesink_datasource.errors import LakesinkError

__all__ = ["IndexDirFull", "no_room"]

# A failed write leaves the file system (nearly) full: a short write took what was left.
# An I/O error with more room than this is the disk's own failure, not this one.
_NEARLY_FULL = 64 << 20
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXT = ("no space left", "disk quota exceeded", "input/output error")


class IndexDirFull(LakesinkError, RuntimeError):
    """The file system of the key index directory (option `index_dir`) has no room left."""


def _free_bytes(path: str) -> int | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        stats = os.statvfs(path or "/")
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def no_room(index_dir: str, exc: BaseException) -> IndexDirFull | None:
    """The IndexDirFull that `exc`, raised writing a key index under `index_dir` (the
    option's directory), stands for (None: it says something else)."""
    path = index_dir
    if isinstance(exc, (lmdb.MapFullError, lmdb.MemoryError, lmdb.MapResizedError)):
        return None
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        full = True
    elif isinstance(exc, (lmdb.Error, OSError)):
        text = str(exc).lower()
        free = _free_bytes(path)
        full = any(t in text for t in _NO_SPACE_TEXT) and (free is None or free < _NEARLY_FULL or "input/output" not in text)
    else:
        return None
    if not full:
        return None
    free = _free_bytes(path)
    where = f" ({free / (1 << 20):,.1f} MiB free there)" if free is not None else ""
    return IndexDirFull(
        f"the key index directory {path} (option 'index_dir') has no room left{where}: writing the key index failed "
        f"({type(exc).__name__}: {exc}). Free space "
        "there, or set option 'index_dir' to a directory on a file system with room (the index is a cache: a new "
        "directory is filled from the table). Nothing of this batch was committed; the table is as it was, and the "
        "batch can run again once there is room",
    )
