"""One LMDB environment of the key index (`KeyIndex`): a shard of the keys, or the file table.

A table's index on a host is sharded (`sharded_index.py`): under its directory, each
``shard-NN/`` is an environment holding the keys that hash to it, with their undo log and
state, and ``files/`` is the environment of the one file table that every shard's
locations point into, with the compactions' move maps. Every environment is a `KeyIndex`
and opens the same sub-databases; a shard leaves ``files`` and ``moves`` empty (its keyed
transactions take ordinals from the file table: `transact`'s `ordinal_of`), the file
table leaves ``keys`` and ``undo`` empty. Both record the state they reflect.

* ``keys``  encoded key -> packed `Location` (`location_codec.py`)
* ``undo``  the undo records of pending tokens (`undo_log.py`)
* ``files`` ``b"o" + u32be ordinal`` -> data file path, ``b"p" + path`` -> u32be ordinal
* ``moves`` u32be ordinal -> the file's move map, ``b"m" + u32be ordinal`` -> b"" for a
  file only move maps lead into (`row_moves.py`)
* ``meta``  the `IndexState`, the target of a catch-up under way, the last published
  copy's sequence number, and the next file ordinal and undo sequence number

LMDB allows one open handle per environment per process, and Spark reuses worker
processes, so `open_index` caches the `KeyIndex` per absolute path; several processes on
one host share the files through LMDB's own multi-process locking (one writer at a time,
readers never block). An environment found damaged or replaced (`damage.py`) is reopened,
or started empty for the next sync to rebuild from the table. Keys too long for LMDB are
fitted to its limit (`lmdb_env.py`).
"""

from __future__ import annotations

import operator
import os
import shutil
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import compress, repeat
from typing import Any, cast

import lmdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.arrays import take_items
from lakesink_datasource.index import lmdb_env
from lakesink_datasource.index.damage import damage, data_inode, remove_environment
from lakesink_datasource.index.lmdb_env import T, Txn, fit_key, fit_keys
from lakesink_datasource.index.location_codec import Found, Location, decode_locations, pack_location, unpack_location
from lakesink_datasource.index.undo_log import UndoLog

__all__ = ["IndexState", "KeyIndex", "drop_index", "open_index", "reopen_empty"]


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

_DB_KEYS, _DB_FILES, _DB_UNDO, _DB_META, _DB_MOVES = b"keys", b"files", b"undo", b"meta", b"moves"
_MAP_ONLY = b"m"  # in the moves table: a file only move maps lead into (see move_maps)
_META_NEXT_ORDINAL = b"next_ordinal"
_META_STATE = b"state"
# The target snapshot of a catch-up under way: its writes carry no undo (overwrite_packed),
# so until the state moves, keys may already point where that snapshot put them.
_META_CATCH_UP = b"catch_up"
# The sequence number of the last snapshot this host published a copy of (published.py).
_META_LAST_PUBLISHED = b"last_published"

_STATE_ENCODER = msgspec.msgpack.Encoder()
_STATE_DECODER = msgspec.msgpack.Decoder(IndexState)


def _last_per_key(keys: list[bytes], values: list[bytes | None]) -> tuple[list[bytes], list[bytes | None]]:
    """The last entry per key, in key (B-tree) order: one Arrow sort by (key, entry), in C."""
    if not keys:
        return keys, values
    column = pa.array(keys, pa.binary())
    order = pc.sort_indices(
        pa.table({"k": column, "i": pa.array(np.arange(len(keys)))}), sort_keys=[("k", "ascending"), ("i", "ascending")]
    ).to_numpy()
    ordered = column.take(pa.array(order))
    last = np.append(pc.not_equal(ordered.slice(0, len(keys) - 1), ordered.slice(1)).to_numpy(zero_copy_only=False), True)
    picked = order[last]
    return take_items(keys, picked), take_items(values, picked)


# ----------------------------------------------------------------------------- the index


class KeyIndex:
    """One environment of the key index. Use `open_index` to get the cached one."""

    def __init__(self, path: str, map_size: int = 1 << 36):
        self.path = os.path.abspath(path)
        self._pid = os.getpid()
        self._lock = threading.RLock()  # set_mapsize needs no live txn in this process
        self._env = lmdb_env.open_environment(self.path, map_size)
        self.inode = data_inode(self.path)
        self._max_key = self._env.max_key_size()
        self._keys, self._files, self._undo, self._meta, self._moves = self._write(self._open_dbs)
        self._undo_log = UndoLog(self._keys, self._undo, self._meta, self._max_key)
        self.closed = False

    def _open_dbs(self, txn: Txn) -> tuple[Any, Any, Any, Any, Any]:
        keys, files, undo, meta, moves = (
            self._env.open_db(name, txn=cast(lmdb.Transaction, txn), create=True)  # the real one, see Txn
            for name in (_DB_KEYS, _DB_FILES, _DB_UNDO, _DB_META, _DB_MOVES)
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

    # -- file ordinals ---------------------------------------------------------------------

    def file_ordinal(self, path: str) -> int:
        return self.file_ordinals([path])[0]

    def file_ordinals(self, paths: Iterable[str]) -> list[int]:
        """Compact ordinals for data file paths, assigning new ones atomically."""
        paths = list(paths)
        path_keys = [self._fit(b"p" + p.encode()) for p in paths]
        found = self._read(lambda txn: [txn.get(k, db=self._files) for k in path_keys])
        known = [v for v in found if v is not None]
        if len(known) == len(found):
            return [_U32BE.unpack(v)[0] for v in known]
        return self._write(lambda txn: self._assign_ordinals(txn, paths, path_keys))

    def known_ordinals(self, paths: Iterable[str]) -> list[int | None]:
        """The ordinals `paths` already have (None for a path never given one), assigning none."""
        path_keys = [self._fit(b"p" + p.encode()) for p in paths]
        found = self._read(lambda txn: [txn.get(k, db=self._files) for k in path_keys])
        return [None if v is None else _U32BE.unpack(v)[0] for v in found]

    def has_ordinal(self, ordinal: int) -> bool:
        return self._read(lambda txn: txn.get(b"o" + _U32BE.pack(ordinal), db=self._files)) is not None

    def _assign_ordinals(self, txn: Txn, paths: list[str], path_keys: list[bytes]) -> list[int]:
        # Re-read inside the write txn: another process may have assigned them meanwhile.
        raw_next = txn.get(_META_NEXT_ORDINAL, db=self._meta)
        next_ordinal = _U32BE.unpack(raw_next)[0] if raw_next else 0
        result = []
        for path, key in zip(paths, path_keys):
            raw = txn.get(key, db=self._files)
            if raw is None:
                raw = _U32BE.pack(next_ordinal)
                txn.put(key, raw, db=self._files)
                txn.put(b"o" + raw, path.encode(), db=self._files)
                next_ordinal += 1
            result.append(_U32BE.unpack(raw)[0])
        txn.put(_META_NEXT_ORDINAL, _U32BE.pack(next_ordinal), db=self._meta)
        return result

    def forget_files(self, paths: Iterable[str]) -> int:
        """Drop the ordinals of data files the table no longer has (no key points into them
        any more), so the file table does not grow with every file ever written."""

        def drop(txn: Txn) -> int:
            gone = 0
            for path in paths:
                key = self._fit(b"p" + path.encode())
                raw = txn.get(key, db=self._files)
                if raw is not None:
                    txn.delete(key, db=self._files)
                    txn.delete(b"o" + raw, db=self._files)
                    gone += 1
            return gone

        return self._write(drop)

    def file_count(self) -> int:
        """Data files the index has ordinals for."""
        return self._read(lambda txn: txn.stat(self._files)["entries"]) // 2

    def file_path(self, ordinal: int) -> str:
        raw = self._read(lambda txn: txn.get(b"o" + _U32BE.pack(ordinal), db=self._files))
        if raw is None:
            raise KeyError(f"no data file with ordinal {ordinal} in index {self.path}")
        return raw.decode()

    # -- move maps (index/row_moves.py) ----------------------------------------------------
    # The `moves` table holds a map per moved file (key: the u32 ordinal) and a marker per
    # file that only maps lead into (key: b"m" + ordinal): no key points at such a file
    # directly, so when it moves in turn, only the maps leading into it need re-aiming.

    @contextmanager
    def move_maps(self) -> Iterator[dict[int, np.ndarray]]:
        """The stored move maps (old file ordinal -> int64 places), as read-only views of the
        map that stay valid inside the `with` block only: no copy, however large they grow."""
        with self._lock:
            txn = self._begin(write=False, buffers=True)
            try:
                yield {
                    _U32BE.unpack(k)[0]: np.frombuffer(v, dtype="<i8")
                    for k, v in txn.cursor(db=self._moves)
                    if len(k) == _U32BE.size
                }
            finally:
                txn.abort()

    def map_only_ordinals(self, ordinals: Iterable[int]) -> set[int]:
        """Which of `ordinals` are files no key points at directly (only move maps do)."""
        wanted = list(ordinals)
        found = self._read(lambda txn: [txn.get(_MAP_ONLY + _U32BE.pack(o), db=self._moves) for o in wanted])
        return {o for o, raw in zip(wanted, found) if raw is not None}

    def put_move_maps(
        self, maps: Mapping[int, np.ndarray], *, dropped: Iterable[int] = (), map_only: Iterable[int] = ()
    ) -> None:
        """Store `maps`, forget the maps and markers of `dropped` files, mark `map_only` files."""

        def body(txn: Txn) -> None:
            for ordinal in dropped:
                txn.delete(_U32BE.pack(ordinal), db=self._moves)
                txn.delete(_MAP_ONLY + _U32BE.pack(ordinal), db=self._moves)
            for ordinal, places in maps.items():
                txn.put(_U32BE.pack(ordinal), np.ascontiguousarray(places, dtype="<i8").tobytes(), db=self._moves)
            for ordinal in map_only:
                txn.put(_MAP_ONLY + _U32BE.pack(ordinal), b"", db=self._moves)

        self._write(body)

    def mark_direct(self, ordinal: int) -> None:
        """Keys now point at this file directly (it was indexed): it needs a map when it moves."""
        marker = _MAP_ONLY + _U32BE.pack(ordinal)
        if self._read(lambda txn: txn.get(marker, db=self._moves)) is not None:
            self._write(lambda txn: txn.delete(marker, db=self._moves))

    # -- keys ------------------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> list[Location | None]:
        """Locations of `keys` (None when absent), in input order, from one read txn."""
        if not keys:
            return []
        fitted = self._fit_all(keys)
        # Probing in key order walks neighbouring B-tree pages, which stay hot. A plain
        # txn.get loop measured faster than Cursor.getmulti here: getmulti builds a
        # (key, value) tuple with a copied key per hit that we would only throw away.
        order = sorted(range(len(fitted)), key=fitted.__getitem__)

        def probe(txn: Txn) -> list[bytes | None]:
            get, db = txn.get, self._keys
            return [get(fitted[i], None, db) for i in order]

        result: list[Location | None] = [None] * len(fitted)
        for i, raw in zip(order, self._read(probe)):
            if raw is not None:
                result[i] = unpack_location(raw)
        return result

    def apply(self, token: str, puts: Sequence[tuple[bytes, Location]], deletes: Sequence[bytes]) -> None:
        """Write `puts` then `deletes` (a key in both ends absent) with undo under `token`.

        Within `puts` the last entry for a key wins.
        """
        self.apply_packed(token, [k for k, _ in puts], [pack_location(loc) for _, loc in puts], deletes)

    def apply_packed(self, token: str, keys: Sequence[bytes], values: Sequence[bytes], deletes: Sequence[bytes] = ()) -> None:
        """`apply` of puts whose locations are already packed (`pack_positions`)."""
        fitted, news = _last_per_key(self._fit_all(keys) + self._fit_all(deletes), [*values, *([None] * len(deletes))])
        token_raw = token.encode()

        def body(txn: Txn) -> None:
            prevs = list(map(txn.get, fitted, repeat(None), repeat(self._keys)))
            self._write_changes(txn, token_raw, fitted, prevs, news)

        self._write(body)

    def overwrite_packed(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """Put packed locations without undo: for catch-up and rebuild only.

        Those writes are idempotent and ordered by the table's history, and the index's state
        moves only after all of them: a crash halfway leaves keys that the next sync, starting
        again from the old state, puts again with the same values. Skipping the undo record
        also skips the lookup it needs, which were two thirds of a catch-up's time.
        """
        fitted, news = _last_per_key(self._fit_all(keys), list(values))
        if fitted:
            self._write(lambda txn: txn.cursor(db=self._keys).putmulti(zip(fitted, news)))  # type: ignore[arg-type]  # no None

    def remove_keys(self, keys: Sequence[bytes]) -> None:
        """Delete `keys` without undo: for catch-up only (see `overwrite_packed`)."""
        fitted = sorted(set(self._fit_all(keys)))
        if fitted:
            self._write(lambda txn: [txn.delete(k, db=self._keys) for k in fitted])

    def transact(
        self,
        token: str,
        keys: Sequence[bytes],
        decide: Callable[[Found, Callable[[str], int]], tuple[np.ndarray, list[bytes | None]]],
        ordinal_of: Callable[[str], int] | None = None,
    ) -> None:
        """Look `keys` up and apply what `decide` makes of them in ONE write transaction.

        `keys` must be distinct (one change per key); in key order they walk neighbouring
        B-tree pages. `decide` gets the current locations as columns (`Found`, input order)
        and a function giving a file's ordinal inside this transaction, and returns which
        keys change (distinct indices into `keys`, in any order) and their new packed
        locations (`pack_positions`; None deletes the key). One transaction means one lock
        round and one read per key (the undo record reuses the lookup). `decide` must not touch the index. The map is
        not grown here (decide may have side effects and must not run twice): the default
        map is 64 GiB of address space. `ordinal_of` replaces this environment's own file
        table (a sharded index keeps one file table for all its shards).
        """
        fitted = self._fit_all(keys)
        token_raw = token.encode()
        with self._lock, self._begin(write=True) as txn:
            prevs = list(map(txn.get, fitted, repeat(None), repeat(self._keys)))

            def own_ordinal(path: str) -> int:
                return self._assign_ordinals(txn, [path], [self._fit(b"p" + path.encode())])[0]

            changed, values = decide(decode_locations(prevs), ordinal_of or own_ordinal)
            # Only the changed keys are written, back in key order (neighbouring pages).
            order = np.argsort(changed, kind="stable")
            which = changed[order]
            self._write_changes(txn, token_raw, take_items(fitted, which), take_items(prevs, which), take_items(values, order))

    def _write_changes(
        self, txn: Txn, token: bytes, order: list[bytes], all_prevs: list[bytes | None], all_news: list[bytes | None]
    ) -> None:
        """Write `all_news` over `all_prevs` for the distinct keys `order`, with undo."""
        db = self._keys
        # Only real changes need undo; no-op writes and deletes of absent keys are skipped.
        # (map/compress keep this per-row filtering in C.)
        changed = list(map(operator.ne, all_prevs, all_news))
        keys = list(compress(order, changed))
        prevs = list(compress(all_prevs, changed))
        news = list(compress(all_news, changed))
        # Undo first (same txn, so atomic either way; the order documents the intent).
        self._undo_log.record(txn, token, keys, prevs, news)
        if None in news:
            txn.cursor(db=db).putmulti([(k, v) for k, v in zip(keys, news) if v is not None])
            for key, new in zip(keys, news):
                if new is None:
                    txn.delete(key, db=db)
        else:
            txn.cursor(db=db).putmulti(zip(keys, news))  # type: ignore[arg-type]  # no None here

    # -- undo ------------------------------------------------------------------------------

    def pending_tokens(self) -> list[str]:
        """Tokens applied but neither committed nor rolled back, oldest first."""
        return self._read(self._undo_log.pending)

    def commit_tokens(self, tokens: Iterable[str], state: IndexState | None = None) -> None:
        """Drop the undo of `tokens` (their batch reached the table), optionally setting state."""
        tokens = list(tokens)

        def body(txn: Txn) -> None:
            self._undo_log.commit(txn, tokens)
            if state is not None:
                self._put_state(txn, state)

        self._write(body)

    def rollback_tokens(self, tokens: Iterable[str]) -> None:
        """Restore what `tokens` overwrote (newest change first) and drop their undo."""
        tokens = list(tokens)
        self._write(lambda txn: self._undo_log.roll_back(txn, tokens))

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

    def count(self) -> int:
        return self._read(lambda txn: txn.stat(self._keys)["entries"])

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
        return f"KeyIndex({self.path!r}{', closed' if self.closed else ''})"


# --------------------------------------------------------------------- per-process cache

_CACHE: dict[str, KeyIndex] = {}
_CACHE_LOCK = threading.RLock()  # reentrant: open_index may close a stale index


def reopen_empty(path: str, map_size: int = 1 << 36) -> KeyIndex:
    """Close this process's handle of the index at `path`, delete its files and open a new,
    empty one (the next sync rebuilds it from the table)."""
    key = os.path.abspath(path)
    with _CACHE_LOCK:
        index = _CACHE.pop(key, None)
        if index is not None:
            index.close()
        remove_environment(key)
        os.makedirs(key, exist_ok=True)
        index = KeyIndex(key, map_size=map_size)
        _CACHE[key] = index
        return index


def open_index(path: str, map_size: int = 1 << 36) -> KeyIndex:
    """The process-wide `KeyIndex` for `path`, opening it on first use.

    `map_size` only matters for the first open in a process; the map grows on demand.
    """
    key = os.path.abspath(path)
    with _CACHE_LOCK:
        index = _CACHE.get(key)
        if index is not None and not index.closed and index.inode != data_inode(key):
            # The directory was deleted (or replaced) under this process: its handle points
            # at unlinked files other processes no longer see. Reopen what is there now.
            index.close()
            os.makedirs(key, exist_ok=True)
        if index is not None and not index.closed and damage(key) is not None:
            # Truncated under this (reused) process: touching the mapped pages would kill it.
            index.close()
        if index is not None and not index.closed:
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
            index = KeyIndex(key, map_size=map_size)
        except lmdb.Error:
            # A damaged cache (an OS crash with unsynced pages, a truncated or overwritten
            # file): start empty; the next sync finds no state and rebuilds from the table.
            remove_environment(key)
            os.makedirs(key, exist_ok=True)
            index = KeyIndex(key, map_size=map_size)
        _CACHE[key] = index
        return index


def drop_index(path: str) -> None:
    """Close the cached index at `path` (if open here) and delete its directory."""
    key = os.path.abspath(path)
    with _CACHE_LOCK:
        index = _CACHE.pop(key, None)
    if index is not None:
        index.close()
    shutil.rmtree(key, ignore_errors=True)
