"""One LMDB environment of a table's key index on a host, and the per-process cache of them.

A table's index is sharded (`sharded_index.py`): under its directory, each ``shard-NN/`` is
a `KeyShard` (`key_shard.py`: the keys that hash to it, their undo log and state) and
``files/`` is the `FileTable` (`file_table.py`: the data file ordinals every shard's
locations point into, and the compactions' move maps). Both are an `IndexEnvironment`:
this module keeps what they share, the environment, its state and the copies of it.

Every environment opens the same five sub-databases, so the layout on disk is the one the
index has always had (a shard leaves ``files`` and ``moves`` empty, the file table ``keys``
and ``undo``):

* ``keys``  encoded key -> packed `Location` (`location_codec.py`)
* ``undo``  the undo records of pending tokens (`undo_log.py`)
* ``files`` ``b"o" + u32be ordinal`` -> data file path, ``b"p" + path`` -> u32be ordinal
* ``moves`` u32be ordinal -> the file's move map, ``b"m" + u32be ordinal`` -> b"" for a
  file only move maps lead into (`row_moves.py`)
* ``meta``  the `IndexState`, the target of a catch-up under way, the last published
  copy's sequence number, and the next file ordinal and undo sequence number

LMDB allows one open handle per environment per process, and Spark reuses worker
processes, so `open_index` caches each environment per absolute path; several processes on
one host share the files through LMDB's own multi-process locking (one writer at a time,
readers never block). An environment found damaged or replaced (`damage.py`) is reopened,
or started empty for the next sync to rebuild from the table. Keys too long for LMDB are
fitted to its limit (`lmdb_env.py`).
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

import lmdb
import msgspec

from lakesink_datasource.index import lmdb_env
from lakesink_datasource.index.damage import damage, data_inode, remove_environment
from lakesink_datasource.index.lmdb_env import T, Txn, fit_key, fit_keys

__all__ = ["IndexEnvironment", "IndexState", "cached_paths", "close_cached", "drop_index", "open_index", "reopen_empty"]


class IndexState(msgspec.Struct, frozen=True):
    """Which table snapshot / streaming batch the index reflects (for catch-up on open)."""

    table_uuid: str
    snapshot_id: int | None = None
    query_id: str | None = None
    batch_id: int | None = None
    sequence_number: int | None = None  # the snapshot's, to recognise it once it expired
    # Set when the index was rebuilt without the companion table's tombstones (unreadable):
    # the highest sequence a delete the index cannot see may have (encoded). A change to a
    # key the index does not hold, at or below it, cannot be decided and is refused.
    tombstone_floor: bytes | None = None


_U32BE = struct.Struct(">I")
_U64 = struct.Struct("<Q")

DB_KEYS, DB_FILES, DB_UNDO, DB_META, DB_MOVES = b"keys", b"files", b"undo", b"meta", b"moves"
META_NEXT_ORDINAL = b"next_ordinal"  # the file table's
_META_STATE = b"state"
# The target snapshot of a catch-up under way: its writes carry no undo (overwrite_packed),
# so until the state moves, keys may already point where that snapshot put them.
_META_CATCH_UP = b"catch_up"
# The sequence number of the last snapshot this host published a copy of (published.py).
_META_LAST_PUBLISHED = b"last_published"

_STATE_ENCODER = msgspec.msgpack.Encoder()
_STATE_DECODER = msgspec.msgpack.Decoder(IndexState)


class IndexEnvironment:
    """One environment of the key index. Use `open_index` to get the process's cached one."""

    def __init__(self, path: str, map_size: int = 1 << 36):
        self.path = os.path.abspath(path)
        self._pid = os.getpid()
        self._lock = threading.RLock()  # set_mapsize needs no live txn in this process
        self._env = lmdb_env.open_environment(self.path, map_size)
        self.inode = data_inode(self.path)
        self._max_key = self._env.max_key_size()
        self._keys, self._files, self._undo, self._meta, self._moves = self._write(self._open_dbs)
        self.closed = False

    def _open_dbs(self, txn: Txn) -> tuple[Any, Any, Any, Any, Any]:
        keys, files, undo, meta, moves = (
            self._env.open_db(name, txn=cast(lmdb.Transaction, txn), create=True)  # the real one, see Txn
            for name in (DB_KEYS, DB_FILES, DB_UNDO, DB_META, DB_MOVES)
        )
        return keys, files, undo, meta, moves

    def _begin(self, write: bool, buffers: bool = False) -> Txn:
        return lmdb_env.begin(self._env, write, buffers)

    def _write(self, body: Callable[[Txn], T]) -> T:
        return lmdb_env.write(self._env, self._lock, body)

    def _read(self, body: Callable[[Txn], T]) -> T:
        return lmdb_env.read(self._env, self._lock, body)

    def _fit(self, key: bytes) -> bytes:
        return fit_key(key, self._max_key)

    def _fit_all(self, keys: Sequence[bytes]) -> list[bytes]:
        return fit_keys(keys, self._max_key)

    # -- state -----------------------------------------------------------------------------

    def get_state(self) -> IndexState | None:
        raw = self._read(lambda txn: txn.get(_META_STATE, db=self._meta))
        return None if raw is None else _STATE_DECODER.decode(raw)

    def set_state(self, state: IndexState) -> None:
        self._write(lambda txn: self._put_state(txn, state))

    def _put_state(self, txn: Txn, state: IndexState) -> None:
        txn.put(_META_STATE, _STATE_ENCODER.encode(state), db=self._meta)
        txn.delete(_META_CATCH_UP, db=self._meta)  # the state now covers whatever it wrote

    def last_published(self) -> int | None:
        raw = self._read(lambda txn: txn.get(_META_LAST_PUBLISHED, db=self._meta))
        return None if raw is None else _U64.unpack(raw)[0]

    def set_last_published(self, sequence_number: int) -> None:
        self._write(lambda txn: txn.put(_META_LAST_PUBLISHED, _U64.pack(sequence_number), db=self._meta))

    def read_transaction(self) -> Any:
        """A read transaction on this environment, for a consistent copy (`copy_to`); the
        caller aborts it. It may be used from another thread."""
        return self._env.begin(write=False)

    def copy_to(self, path: str, txn: Any) -> str:
        """A compacted copy of the environment as `txn` sees it, in directory `path`;
        returns the copy's data file."""
        os.makedirs(path, exist_ok=True)
        self._env.copy(path, compact=True, txn=txn)
        return os.path.join(path, "data.mdb")

    def begin_catch_up(self, target: str) -> None:
        """Record that undo-less writes toward snapshot `target` start (ended by a new state)."""
        self._write(lambda txn: txn.put(_META_CATCH_UP, target.encode(), db=self._meta))

    def catch_up_under_way(self) -> str | None:
        """The target of a catch-up that started and never reached its state (a crash)."""
        raw = self._read(lambda txn: txn.get(_META_CATCH_UP, db=self._meta))
        return None if raw is None else raw.decode()

    # -- maintenance -----------------------------------------------------------------------

    def clear(self) -> None:
        """Empty keys, files, undo, meta (counters included) and move maps in one txn, for a rebuild."""

        def body(txn: Txn) -> None:
            for db in (self._keys, self._files, self._undo, self._meta, self._moves):
                txn.drop(db, delete=False)

        self._write(body)

    def close(self) -> None:
        """Close the environment and forget it in the per-process cache."""
        with _CACHE_LOCK:
            if _CACHE.get(self.path) is self:
                del _CACHE[self.path]
        with self._lock:
            if not self.closed:
                self.closed = True
                self._env.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}{', closed' if self.closed else ''})"


# --------------------------------------------------------------------- per-process cache

E = TypeVar("E", bound=IndexEnvironment)

_CACHE: dict[str, IndexEnvironment] = {}
_CACHE_LOCK = threading.RLock()  # reentrant: open_index may close a stale index


def reopen_empty(kind: type[E], path: str, map_size: int = 1 << 36) -> E:
    """Close this process's handle of the index at `path`, delete its files and open a new,
    empty one (the next sync rebuilds it from the table)."""
    key = os.path.abspath(path)
    with _CACHE_LOCK:
        index = _CACHE.pop(key, None)
        if index is not None:
            index.close()
        remove_environment(key)
        os.makedirs(key, exist_ok=True)
        fresh = kind(key, map_size=map_size)
        _CACHE[key] = fresh
        return fresh


def open_index(kind: type[E], path: str, map_size: int = 1 << 36) -> E:
    """The process-wide environment of `kind` for `path`, opening it on first use.

    `map_size` only matters for the first open in a process; the map grows on demand.
    """
    key = os.path.abspath(path)
    with _CACHE_LOCK:
        index = _CACHE.get(key)
        if index is not None and not isinstance(index, kind):
            index.close()  # the same directory opened in another role: one handle per process
        if index is not None and not index.closed and index.inode != data_inode(key):
            # The directory was deleted (or replaced) under this process: its handle points
            # at unlinked files other processes no longer see. Reopen what is there now.
            index.close()
            os.makedirs(key, exist_ok=True)
        if index is not None and not index.closed and damage(key) is not None:
            # Truncated under this (reused) process: touching the mapped pages would kill it.
            index.close()
        if isinstance(index, kind) and not index.closed:
            if index._pid != os.getpid():
                # LMDB handles do not survive fork(); the child must not touch the parent's.
                raise RuntimeError(
                    f"key index {key} was opened before fork(); open it in the child process only"
                )
            return index
        try:
            reason = damage(key)
            if reason is not None:
                raise lmdb.CorruptedError(f"key index {key}: {reason}")
            opened = kind(key, map_size=map_size)
        except lmdb.Error:
            # A damaged cache (an OS crash with unsynced pages, a truncated or overwritten
            # file): start empty; the next sync finds no state and rebuilds from the table.
            remove_environment(key)
            os.makedirs(key, exist_ok=True)
            opened = kind(key, map_size=map_size)
        _CACHE[key] = opened
        return opened


def drop_index(path: str) -> None:
    """Close the cached index at `path` (if open here) and delete its directory."""
    key = os.path.abspath(path)
    with _CACHE_LOCK:
        index = _CACHE.pop(key, None)
    if index is not None:
        index.close()
    shutil.rmtree(key, ignore_errors=True)


def cached_paths() -> set[str]:
    """The index environments this process holds open."""
    with _CACHE_LOCK:
        return set(_CACHE)


def close_cached(paths: Iterable[str]) -> None:
    """Close this process's handles of the environments at `paths` (their files stay): a
    process writing many tables keeps only the indexes of the ones it wrote last open (each
    environment maps its file and holds descriptors)."""
    with _CACHE_LOCK:
        closing = [index for path in paths if (index := _CACHE.pop(path, None)) is not None]
    for index in closing:
        index.close()
