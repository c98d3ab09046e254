"""LMDB plumbing of the key index's environments: what the index uses of a transaction,
how an environment is opened, and keys fitted to LMDB's key size limit (the memory map's
size, and its growth, are `environment.IndexEnvironment`'s).

Keys longer than LMDB's key limit (511 bytes by default) are stored as a prefix plus a
256-bit BLAKE2b digest of the full key; the result always has exactly the limit's length,
which no short key has, so the mapping stays injective up to digest collisions. Such keys
lose bytewise ordering among themselves inside LMDB, which only costs lookup locality.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

import lmdb

__all__ = ["Cursor", "Txn", "fit_key", "fit_keys", "open_environment"]

T = TypeVar("T")


class Cursor(Protocol):
    def set_range(self, key: bytes) -> bool: ...
    def __iter__(self) -> Iterator[tuple[bytes, bytes]]: ...
    def putmulti(self, items: Iterable[tuple[bytes, bytes]]) -> tuple[int, int]: ...


class Txn(Protocol):
    """What the index uses of an lmdb transaction. lmdb's stubs type values as
    `bytes | memoryview` to cover `buffers=True`; lakesink asks for buffers only to read
    move maps as numpy views (`FileTable.move_maps`, which takes them as buffers), so every
    other value is `bytes` (the one cast is in `begin`)."""

    def get(self, key: bytes, default: bytes | None = None, db: Any = None) -> bytes | None: ...
    def put(self, key: bytes, value: bytes, db: Any = None) -> bool: ...
    def delete(self, key: bytes, value: bytes = b"", db: Any = None) -> bool: ...
    def cursor(self, db: Any = None) -> Cursor: ...
    def drop(self, db: Any, delete: bool = True) -> None: ...
    def stat(self, db: Any) -> dict[str, int]: ...
    def abort(self) -> None: ...
    def __enter__(self) -> Txn: ...
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None: ...


def open_environment(path: str, map_size: int) -> lmdb.Environment:
    """The LMDB environment in directory `path` (created when absent)."""
    env = lmdb.open(
        path,
        map_size=map_size,
        subdir=True,
        lock=True,
        max_dbs=8,
        max_readers=1024,  # many Spark worker processes and threads per host
        readahead=False,  # random point lookups: OS readahead only pollutes the cache
        # The index is a cache of the table: commits need not wait for the disk. A killed
        # process loses nothing (the OS has the pages); an OS crash may leave the file
        # damaged, which open_index detects and answers with a rebuild from the table.
        sync=False,
        metasync=False,
    )
    # Free reader slots left behind by worker processes that died mid-transaction.
    env.reader_check()
    return env


def fit_key(key: bytes, max_key: int) -> bytes:
    """`key` as LMDB can store it: itself when short enough, else a prefix and its digest."""
    if not key:
        raise ValueError("index keys must not be empty")
    if len(key) < max_key:
        return key
    digest = hashlib.blake2b(key, digest_size=32).digest()
    return key[: max_key - len(digest)] + digest


def fit_keys(keys: Sequence[bytes], max_key: int) -> list[bytes]:
    # Fast path: the common case has no long key and needs no per-key Python call.
    if keys and min(map(len, keys)) > 0 and max(map(len, keys)) < max_key:
        return list(keys)
    return [fit_key(k, max_key) for k in keys]
