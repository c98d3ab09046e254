"""An environment's files, inspected and removed without opening them.

The index is written without fsync (a cache of the table), so an OS crash may leave an
environment damaged, and a deleted or replaced index directory leaves a reused worker
process holding a handle on unlinked files. Both must be noticed before LMDB touches the
file: `open_index` answers either by reopening, or by starting empty for a rebuild.
"""

from __future__ import annotations

import os
import struct

__all__ = ["damage", "data_inode", "remove_environment"]

# LMDB's meta pages (pages 0 and 1): a 16-byte page header, then magic, version, address,
# map size, two 48-byte database records, the last used page number and the transaction id.
_META_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<IIQQ96xQQ")
_PAGE_HEADER = 16
_PAGE = 4096  # LMDB's page size is the OS page size: 4 KiB on the platforms lakesink runs on


def data_inode(path: str) -> int | None:
    """The inode of the environment's data file at `path` (None: there is none): a handle
    opened on another inode is stale."""
    try:
        return os.stat(os.path.join(path, "data.mdb")).st_ino
    except FileNotFoundError:
        return None


def damage(path: str) -> str | None:
    """Why the index at `path` cannot be opened safely, or None. LMDB maps its file into
    memory: a file shorter than the pages its meta page says are used makes the process die
    of SIGBUS on first touch, so truncation is detected before opening."""
    if os.path.lexists(path) and not os.path.isdir(path):
        return "not a directory"
    data = os.path.join(path, "data.mdb")
    try:
        with open(data, "rb") as f:
            head = f.read(2 * _PAGE)
            # The size after the meta pages: another process's commit writes its pages before
            # its meta page, so a size read first (before a commit that grew the file) made a
            # live index look truncated, and open_index deleted it under its writer.
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None  # no index yet
    if size == 0:
        return None
    metas = []
    for page in (0, 1):
        raw = head[page * _PAGE + _PAGE_HEADER : page * _PAGE + _PAGE_HEADER + _META.size]
        if len(raw) == _META.size:
            magic, _version, _address, _map_size, last_page, txn_id = _META.unpack(raw)
            if magic == _META_MAGIC:
                metas.append((txn_id, last_page))
    if not metas:
        return "no valid meta page"
    _txn, last_page = max(metas)
    if size < (last_page + 1) * _PAGE:
        return f"truncated ({size} bytes, its meta page uses {(last_page + 1) * _PAGE})"
    return None


def remove_environment(path: str) -> None:
    """Delete the LMDB files at `path` (or a file standing where the directory should be),
    keeping anything else in the directory (the host's writer lock)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        os.remove(path)
        return
    for name in ("data.mdb", "lock.mdb"):
        try:
            os.remove(os.path.join(path, name))
        except FileNotFoundError:
            pass
