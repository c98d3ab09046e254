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

import itertools
import os
import shutil
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import lmdb
import msgspec

from lakesink_datasource.index import address_space, lmdb_env
from lakesink_datasource.index.damage import damage, data_inode, remove_environment
from lakesink_datasource.index.lmdb_env import T, Txn, fit_key, fit_keys
from lakesink_datasource.index.no_room import no_room

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

    def __init__(self, path: str, map_size: int | None = None):
        self.path = os.path.abspath(path)
        self._pid = os.getpid()
        # One transaction or map resize at a time in this process (set_mapsize needs no live
        # transaction); reentrant, as a write may look up file ordinals (another environment)
        # while a read view of this one is open.
        self._lock = threading.RLock()
        # Read views that outlive a call, by thread (None: handed to another thread, a
        # published copy's transactions): the map is not resized under them.
        self._views: Counter[int | None] = Counter()
        self._views_done = threading.Condition()
        self.last_used = 0  # when a transaction last began (least recently used: closed first)
        self._env = self._map(map_size)
        self._page = self._env.stat()["psize"]
        self.inode = data_inode(self.path)
        self._max_key = self._env.max_key_size()
        self._keys, self._files, self._undo, self._meta, self._moves = self._write(self._open_dbs)
        self.closed = False

    # -- the memory map (address_space.py) ---------------------------------------------------

    def _map(self, requested: int | None) -> lmdb.Environment:
        """The environment opened with a map the process has room for."""
        try:
            data = os.path.getsize(os.path.join(self.path, "data.mdb"))
        except OSError:
            data = 0
        size = address_space.initial(self.path, data, requested)
        try:
            env = lmdb_env.open_environment(self.path, size)
        except lmdb.MemoryError as exc:  # the mmap itself failed: the heap took what was measured free
            limit = address_space.cap()
            if limit is None:
                raise
            raise address_space.too_large(self.path, size, limit) from exc
        except lmdb.Error as exc:
            self._raise_if_full(exc)
            raise
        address_space.mapped(self.path, env.info()["map_size"])
        return env

    def _resize(self) -> None:
        """Grow the map: a write found it full, or another process's writes outgrew it. By
        doubling, within the address space the process may map (IndexTooLarge when even
        the data does not fit). The caller holds `_lock`."""
        info = self._env.info()
        current = info["map_size"]
        size = address_space.grown(self.path, current, (info["last_pgno"] + 1) * self._page)
        me = threading.get_ident()
        with self._views_done:
            if self._views[me]:
                raise RuntimeError(f"key index {self.path}: its map must grow under a read view this thread holds")
            self._views_done.wait_for(lambda: not +self._views)  # a published copy being made
            self._env.set_mapsize(size)
        address_space.mapped(self.path, self._env.info()["map_size"])

    def make_room(self, extra: int) -> None:
        """Grow the map now unless `extra` bytes are left in it: for writes made while this
        thread holds a read view of the environment, which cannot grow it then."""
        with self._lock:
            info = self._env.info()
            if info["map_size"] - (info["last_pgno"] + 1) * self._page < extra:
                self._resize()

    @contextmanager
    def _viewing(self, thread: int | None) -> Iterator[None]:
        with self._views_done:
            self._views[thread] += 1
        try:
            yield
        finally:
            with self._views_done:
                self._views[thread] -= 1
                self._views_done.notify_all()

    def _raise_if_full(self, exc: BaseException) -> None:
        # <index_dir>/<table's index>/<environment>: the option names the first.
        full = no_room(os.path.dirname(os.path.dirname(self.path)), exc)
        if full is not None:
            raise full from exc

    # -- transactions --------------------------------------------------------------------------

    def _open_dbs(self, txn: Txn) -> tuple[Any, Any, Any, Any, Any]:
        keys, files, undo, meta, moves = (
            self._env.open_db(name, txn=cast(lmdb.Transaction, txn), create=True)  # the real one, see Txn
            for name in (DB_KEYS, DB_FILES, DB_UNDO, DB_META, DB_MOVES)
        )
        return keys, files, undo, meta, moves

    def _begin(self, write: bool, buffers: bool = False) -> Txn:
        """A transaction on the current map (the caller holds `_lock`); a map another
        process's writes outgrew is grown first."""
        self.last_used = next(_USES)
        while True:
            try:
                if buffers:
                    return cast(Txn, self._env.begin(write=write, buffers=True))
                return cast(Txn, self._env.begin(write=write))
            except lmdb.MapResizedError:
                self._resize()

    def _write(self, body: Callable[[Txn], T]) -> T:
        """Run `body` in one write transaction, growing the map and running it again when
        the map is full (the full transaction was aborted whole: `body` starts over)."""
        with self._lock:
            while True:
                try:
                    with self._begin(write=True) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    self._resize()
                except lmdb.Error as exc:
                    self._raise_if_full(exc)
                    raise

    def _read(self, body: Callable[[Txn], T]) -> T:
        with self._lock, self._begin(write=False) as txn:
            return body(txn)

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
        """A read transaction on this environment, for a consistent copy (`copy_to`); it may
        be used from another thread, and is ended with `end_read`. The map does not grow
        while it is open."""
        with self._lock:
            txn = self._begin(write=False)
            with self._views_done:
                self._views[None] += 1
        return txn

    def end_read(self, txn: Any) -> None:
        txn.abort()
        with self._views_done:
            self._views[None] -= 1
            self._views_done.notify_all()

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
                address_space.unmapped(self.path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}{', closed' if self.closed else ''})"


# --------------------------------------------------------------------- per-process cache

E = TypeVar("E", bound=IndexEnvironment)

_CACHE: dict[str, IndexEnvironment] = {}
_CACHE_LOCK = threading.RLock()  # reentrant: open_index may close a stale index
_USES = itertools.count(1)


def _release_idle(keep: str, wanted: int) -> int:
    """Close idle environments of indexes other than the one in directory `keep`, least
    recently used first, until their maps free `wanted` bytes of address space; returns the
    bytes freed. Idle: no transaction or read view of this process is open on it. They open
    again when a write needs them (`open_index`); their files stay."""
    with _CACHE_LOCK:
        candidates = sorted(
            (e for e in _CACHE.values() if not e.closed and os.path.dirname(e.path) != keep), key=lambda e: e.last_used
        )
    freed = 0
    for env in candidates:
        if freed >= wanted:
            break
        if not env._lock.acquire(blocking=False):
            continue  # in a transaction in another thread
        try:
            with env._views_done:
                viewed = bool(+env._views)
            if viewed or env.closed:
                continue
            size = env._env.info()["map_size"]
            env.close()  # reentrant: this thread holds its lock
            freed += size
        finally:
            env._lock.release()
    return freed


address_space.set_releaser(_release_idle)


def reopen_empty(kind: type[E], path: str, map_size: int | None = None) -> E:
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


def open_index(kind: type[E], path: str, map_size: int | None = None) -> E:
    """The process-wide environment of `kind` for `path`, opening it on first use.

    `map_size` (default: address_space.initial's choice) only matters for the first open in
    a process; the map grows on demand.
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
