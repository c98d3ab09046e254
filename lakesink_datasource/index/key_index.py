"""LMDB-backed primary-key index: encoded key -> where the live row sits.

One LMDB environment per table directory (the caller picks `index_dir/<table-uuid>`).
LMDB allows one open handle per environment per process, and Spark reuses worker
processes, so `open_index` caches the `KeyIndex` per absolute path; several processes on
one host share the files through LMDB's own multi-process locking (one writer at a time,
readers never block).

Sub-databases of the environment:

* ``keys``  encoded key -> packed `Location`
* ``files`` ``b"o" + u32be ordinal`` -> data file path, ``b"p" + path`` -> u32 ordinal
* ``undo``  ``b"t" + token`` -> token record, ``b"c" + u64be seq`` -> packed undo chunk
* ``meta``  counters and the `IndexState` marker

Undo model. Every `apply` writes, in the same transaction as the change, one undo record
per key it actually changes: ``(key, previous value or absent, new value or absent)``,
packed into chunks numbered by a global sequence. Rolling back replays the chunks of the
chosen tokens newest first, so when one token touched a key twice the older record is
replayed last and the key ends at its value from before the token (the "first previous
value wins" rule falls out of the replay order, without reading old chunks on every
apply). A record is only replayed while the key still holds the value that record wrote:
if a surviving token (e.g. a retried task attempt that was committed) overwrote the key
afterwards, rolling back the failed one must not clobber the survivor.

Keys longer than LMDB's key limit (511 bytes by default) are stored as a prefix plus a
256-bit BLAKE2b digest of the full key; the result always has exactly the limit's length,
which no short key has, so the mapping stays injective up to digest collisions. Such keys
lose bytewise ordering among themselves inside LMDB, which only costs lookup locality.
"""

from __future__ import annotations

import hashlib
import operator
import os
import shutil
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import compress, repeat
from types import TracebackType
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import lmdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.arrays import take_items

__all__ = [
    "Found",
    "IndexState",
    "KeyIndex",
    "Location",
    "drop_index",
    "open_index",
]

T = TypeVar("T")


class _Cursor(Protocol):
    def set_range(self, key: bytes) -> bool: ...
    def __iter__(self) -> Iterator[tuple[bytes, bytes]]: ...
    def putmulti(self, items: Iterable[tuple[bytes, bytes]]) -> tuple[int, int]: ...


class _Txn(Protocol):
    """What the index uses of an lmdb transaction. lmdb's stubs type values as
    `bytes | memoryview` to cover `buffers=True`; lakesink asks for buffers only to read
    move maps as numpy views (`KeyIndex.move_maps`, which takes them as buffers), so every
    other value is `bytes` (the one cast is in `KeyIndex._begin`)."""

    def get(self, key: bytes, default: bytes | None = None, db: Any = None) -> bytes | None: ...
    def put(self, key: bytes, value: bytes, db: Any = None) -> bool: ...
    def delete(self, key: bytes, value: bytes = b"", db: Any = None) -> bool: ...
    def cursor(self, db: Any = None) -> _Cursor: ...
    def drop(self, db: Any, delete: bool = True) -> None: ...
    def stat(self, db: Any) -> dict[str, int]: ...
    def abort(self) -> None: ...
    def __enter__(self) -> _Txn: ...
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None: ...


class Location(msgspec.Struct, array_like=True, frozen=True):
    """Where a key's live row is: a data file (by compact ordinal) and a row position.

    `sequence` is an order-preserving encoded sequence value (compared bytewise) when the
    table resolves conflicting upserts by a sequence column, else None.
    """

    file_ordinal: int
    position: int
    sequence: bytes | None = None


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


# ------------------------------------------------------------------------------ packing

# u32 file ordinal + u64 row position; a sequence follows after a 0x01 marker so that an
# empty sequence (b"") stays distinct from no sequence (None).
_LOCATION = struct.Struct("<IQ")
_SEQUENCE_MARKER = b"\x01"
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U32BE = struct.Struct(">I")
_U64 = struct.Struct("<Q")
_U64BE = struct.Struct(">Q")
_ABSENT = 0xFFFF  # undo length sentinel: the key had / gets no value

# Records per undo chunk: ~300 KiB for typical keys, a few MiB at worst (511-byte keys),
# so no single LMDB value needs a huge run of contiguous overflow pages.
_UNDO_CHUNK_RECORDS = 8192

_DB_KEYS, _DB_FILES, _DB_UNDO, _DB_META, _DB_MOVES = b"keys", b"files", b"undo", b"meta", b"moves"
_MAP_ONLY = b"m"  # in the moves table: a file only move maps lead into (see move_maps)
_META_NEXT_ORDINAL = b"next_ordinal"
_META_NEXT_UNDO_SEQ = b"next_undo_seq"
_META_STATE = b"state"
# The target snapshot of a catch-up under way: its writes carry no undo (overwrite_packed),
# so until the state moves, keys may already point where that snapshot put them.
_META_CATCH_UP = b"catch_up"
# The sequence number of the last snapshot this host published a copy of (published.py).
_META_LAST_PUBLISHED = b"last_published"

_STATE_ENCODER = msgspec.msgpack.Encoder()
_STATE_DECODER = msgspec.msgpack.Decoder(IndexState)


def _check_sequence_length(length: int) -> None:
    # Undo records store value lengths as u16 with 0xFFFF meaning "absent".
    if length >= _ABSENT - _LOCATION.size - 1:
        raise ValueError(f"sequence value of {length} bytes is too long for the index")


def pack_location(loc: Location) -> bytes:
    head = _LOCATION.pack(loc.file_ordinal, loc.position)
    if loc.sequence is not None:
        _check_sequence_length(len(loc.sequence))
    return head if loc.sequence is None else head + _SEQUENCE_MARKER + loc.sequence


def pack_locations(ordinal: int, first_position: int, count: int, sequences: Sequence[bytes] | None = None) -> list[bytes]:
    """`pack_location` for `count` consecutive positions of one file, vectorised."""
    return pack_positions(ordinal, np.arange(first_position, first_position + count, dtype=np.uint64), sequences)


def pack_positions(ordinal: int, positions: np.ndarray, sequences: Sequence[bytes | None] | None = None) -> list[bytes]:
    """`pack_location` for rows at `positions` of one file, vectorised."""
    width = _fixed_width(sequences) if sequences is not None and len(positions) else None
    fields = [("ordinal", "<u4"), ("position", "<u8")]
    if width is not None:
        # Every row has a sequence of one width (an integer or timestamp column): the whole
        # value is one numpy record, so no row costs a Python concatenation.
        _check_sequence_length(width)
        fields += [("marker", "u1"), ("sequence", f"V{width}")]
    packed = np.empty(len(positions), dtype=fields)
    packed["ordinal"] = ordinal
    packed["position"] = positions
    if width is not None:
        packed["marker"] = _SEQUENCE_MARKER[0]
        packed["sequence"] = np.frombuffer(b"".join(cast(Sequence[bytes], sequences)), dtype=f"V{width}")
    # A void dtype's tolist() gives one bytes object per record, all in C.
    heads: list[bytes] = packed.view(f"V{packed.dtype.itemsize}").tolist()
    if sequences is None or width is not None:
        return heads
    lengths = [len(s) for s in sequences if s is not None]
    if lengths:
        _check_sequence_length(max(lengths))
    return [h if s is None else h + _SEQUENCE_MARKER + s for h, s in zip(heads, sequences)]


def _fixed_width(values: Sequence[bytes | None]) -> int | None:
    """The one length of `values` when none is None (nor empty) and all are as long."""
    if not values or None in values:
        return None
    widths = set(map(len, cast(Sequence[bytes], values)))
    width = widths.pop()
    return width if not widths and width > 0 else None


def unpack_location(raw: bytes) -> Location:
    if len(raw) == _LOCATION.size:  # the common no-sequence case, kept cheap
        return Location(*_LOCATION.unpack(raw))
    ordinal, position = _LOCATION.unpack_from(raw)
    return Location(ordinal, position, raw[_LOCATION.size + 1 :])  # skip the marker byte


class Found(NamedTuple):
    """The current locations of a chunk of keys, as columns in the keys' order."""

    present: np.ndarray  # bool: the index has the key
    ordinal: np.ndarray  # int64 file ordinal (0 where absent)
    position: np.ndarray  # int64 row position (0 where absent)
    sequence: list[bytes | None] | None  # per key, None: no sequence; the list is None when no key has one


def decode_locations(raw: Sequence[bytes | None]) -> Found:
    """`unpack_location` of a whole lookup at once: the fixed heads are cut out of one joined
    buffer by numpy, so only keys that carry a sequence cost a Python slice."""
    n = len(raw)
    values = [r or b"" for r in raw]  # a stored location is never empty
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    present = lengths > 0
    blob = np.frombuffer(b"".join(values), dtype=np.uint8)
    size = _LOCATION.size
    if blob.size == size * int(present.sum()):
        heads = blob  # no sequences: the heads are the whole buffer
    else:
        starts = (np.cumsum(lengths) - lengths)[present]
        heads = blob[(starts[:, None] + np.arange(size)).ravel()]
    fields = np.ascontiguousarray(heads).view(np.dtype([("ordinal", "<u4"), ("position", "<u8")]))
    ordinal = np.zeros(n, dtype=np.int64)
    position = np.zeros(n, dtype=np.int64)
    ordinal[present] = fields["ordinal"]
    position[present] = fields["position"].astype(np.int64)
    sequence = None
    if blob.size != size * int(present.sum()):
        sequence = _sequences(values, lengths, blob)
    return Found(present, ordinal, position, sequence)


def _sequences(values: list[bytes], lengths: np.ndarray, blob: np.ndarray) -> list[bytes | None]:
    """Each value's sequence (after the head and the marker byte), None where it has none."""
    size = _LOCATION.size
    has = lengths > size
    widths = lengths[has] - size - 1
    if len(widths) and int(widths.min()) == int(widths.max()) > 0:
        # One width (an integer or timestamp sequence column): cut every sequence out of
        # the joined buffer at once instead of slicing each value in Python.
        width = int(widths[0])
        starts = (np.cumsum(lengths) - lengths)[has] + size + 1
        cut = np.ascontiguousarray(blob[(starts[:, None] + np.arange(width)).ravel()]).view(f"V{width}")
        sequence = np.full(len(values), None, dtype=object)
        sequence[has] = cut.tolist()
        return cast(list[bytes | None], sequence.tolist())
    return [v[size + 1 :] if len(v) > size else None for v in values]  # skip the marker byte


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


def _value_lengths(values: Sequence[bytes | None]) -> np.ndarray:
    # map/compress keep the per-value work in C: this runs for every changed key.
    present = np.fromiter(map(operator.is_not, values, repeat(None)), dtype=bool, count=len(values))
    lengths = np.full(len(values), _ABSENT, dtype=np.int64)
    kept = cast(Iterator[bytes], compress(values, present))  # the Nones are filtered out
    lengths[present] = np.fromiter(map(len, kept), dtype=np.int64, count=int(present.sum()))
    return lengths


def _pack_undo_chunk(keys: Sequence[bytes], prevs: Sequence[bytes | None], news: Sequence[bytes | None]) -> bytes:
    """Columnar undo chunk: u32 count, three u16 length arrays, then the three byte runs.

    Columnar packing lets numpy and bytes.join do the work instead of one struct call per
    record; 0xFFFF as a length means absent (None).
    """
    key_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    lengths = np.stack([key_lengths, _value_lengths(prevs), _value_lengths(news)]).astype("<u2")
    return b"".join(
        [
            _U32.pack(len(keys)),
            lengths.tobytes(),
            b"".join(keys),
            b"".join(filter(None, prevs)),  # absent values (and empty ones) add no bytes
            b"".join(filter(None, news)),
        ]
    )


def _unpack_undo_chunk(chunk: bytes) -> list[tuple[bytes, bytes | None, bytes | None]]:
    (count,) = _U32.unpack_from(chunk)
    lengths = np.frombuffer(chunk, dtype="<u2", count=3 * count, offset=_U32.size).astype(np.int64)
    present = lengths != _ABSENT
    sizes = np.where(present, lengths, 0)
    ends = _U32.size + 6 * count + np.cumsum(sizes)
    starts = ends - sizes
    bounds = list(zip(starts.tolist(), ends.tolist(), present.tolist()))
    keys = [chunk[start:end] for start, end, _ in bounds[:count]]  # keys are never absent
    values = [chunk[start:end] if here else None for start, end, here in bounds[count:]]
    return list(zip(keys, values[:count], values[count:]))


def _pack_token_record(token: bytes, first_seq: int, chunk_seqs: Sequence[int]) -> bytes:
    # The token text lives in the value so it survives key hashing of very long tokens.
    return b"".join(
        [_U16.pack(len(token)), token, _U64.pack(first_seq), *(_U64.pack(s) for s in chunk_seqs)]
    )


def _unpack_token_record(raw: bytes) -> tuple[str, int, list[int]]:
    (tlen,) = _U16.unpack_from(raw)
    token = raw[2 : 2 + tlen].decode()
    pos = 2 + tlen
    count = (len(raw) - pos) // _U64.size
    numbers = list(struct.unpack_from(f"<{count}Q", raw, pos))
    return token, numbers[0], numbers[1:]


# ----------------------------------------------------------------------------- the index


class KeyIndex:
    """Primary-key index in one LMDB environment. Use `open_index` to get the cached one."""

    def __init__(self, path: str, map_size: int = 1 << 36):
        self.path = os.path.abspath(path)
        self._pid = os.getpid()
        self._lock = threading.RLock()  # set_mapsize needs no live txn in this process
        self._env = lmdb.open(
            self.path,
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
        self._env.reader_check()
        self.inode = _data_inode(self.path)
        self._max_key = self._env.max_key_size()
        self._keys, self._files, self._undo, self._meta, self._moves = self._write(self._open_dbs)
        self.closed = False

    def _open_dbs(self, txn: _Txn) -> tuple[Any, Any, Any, Any, Any]:
        keys, files, undo, meta, moves = (
            self._env.open_db(name, txn=cast(lmdb.Transaction, txn), create=True)  # the real one, see _Txn
            for name in (_DB_KEYS, _DB_FILES, _DB_UNDO, _DB_META, _DB_MOVES)
        )
        return keys, files, undo, meta, moves

    # -- transactions with map growth ------------------------------------------------------

    def _begin(self, write: bool, buffers: bool = False) -> _Txn:
        """A transaction on the current map; a map another process grew is adopted first."""
        while True:
            try:
                if buffers:
                    return cast(_Txn, self._env.begin(write=write, buffers=True))
                return cast(_Txn, self._env.begin(write=write))
            except lmdb.MapResizedError:
                self._env.set_mapsize(0)  # 0: take the size the other process set

    def _write(self, body: Callable[[_Txn], T]) -> T:
        """Run `body` in one write txn, growing the map and retrying when it is full."""
        with self._lock:
            while True:
                try:
                    with self._begin(write=True) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    # The txn was aborted, so `body` re-runs from scratch on a bigger map.
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def _read(self, body: Callable[[_Txn], T]) -> T:
        with self._lock, self._begin(write=False) as txn:
            return body(txn)

    # -- key fitting -----------------------------------------------------------------------

    def _fit(self, key: bytes) -> bytes:
        if not key:
            raise ValueError("index keys must not be empty")
        if len(key) < self._max_key:
            return key
        digest = hashlib.blake2b(key, digest_size=32).digest()
        return key[: self._max_key - len(digest)] + digest

    def _fit_all(self, keys: Sequence[bytes]) -> list[bytes]:
        # Fast path: the common case has no long key and needs no per-key Python call.
        if keys and min(map(len, keys)) > 0 and max(map(len, keys)) < self._max_key:
            return list(keys)
        return [self._fit(k) for k in keys]

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

    def _assign_ordinals(self, txn: _Txn, paths: list[str], path_keys: list[bytes]) -> list[int]:
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

        def drop(txn: _Txn) -> int:
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

        def body(txn: _Txn) -> None:
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

        def probe(txn: _Txn) -> list[bytes | None]:
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

        def body(txn: _Txn) -> None:
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
        self, txn: _Txn, token: bytes, order: list[bytes], all_prevs: list[bytes | None], all_news: list[bytes | None]
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
        self._record_undo(txn, token, keys, prevs, news)
        if None in news:
            txn.cursor(db=db).putmulti([(k, v) for k, v in zip(keys, news) if v is not None])
            for key, new in zip(keys, news):
                if new is None:
                    txn.delete(key, db=db)
        else:
            txn.cursor(db=db).putmulti(zip(keys, news))  # type: ignore[arg-type]  # no None here

    def _record_undo(
        self,
        txn: _Txn,
        token: bytes,
        keys: list[bytes],
        prevs: list[bytes | None],
        news: list[bytes | None],
    ) -> None:
        step = _UNDO_CHUNK_RECORDS
        chunks = [
            _pack_undo_chunk(keys[i : i + step], prevs[i : i + step], news[i : i + step])
            for i in range(0, len(keys), step)
        ]
        raw_seq = txn.get(_META_NEXT_UNDO_SEQ, db=self._meta)
        seq = _U64.unpack(raw_seq)[0] if raw_seq else 0
        # Each apply consumes at least one sequence number so tokens order by first apply.
        apply_seq = seq
        chunk_seqs = list(range(seq, seq + len(chunks)))
        for chunk_seq, chunk in zip(chunk_seqs, chunks):
            txn.put(b"c" + _U64BE.pack(chunk_seq), chunk, db=self._undo)
        txn.put(_META_NEXT_UNDO_SEQ, _U64.pack(seq + max(1, len(chunks))), db=self._meta)

        token_key = self._fit(b"t" + token)
        existing = txn.get(token_key, db=self._undo)
        if existing is None:
            record = _pack_token_record(token, apply_seq, chunk_seqs)
        else:
            # Appending keeps the earlier chunks, hence the pre-token values, for rollback.
            record = existing + b"".join(_U64.pack(s) for s in chunk_seqs)
        txn.put(token_key, record, db=self._undo)

    # -- undo ------------------------------------------------------------------------------

    def pending_tokens(self) -> list[str]:
        """Tokens applied but neither committed nor rolled back, oldest first."""

        def scan(txn: _Txn) -> list[tuple[int, str]]:
            cursor = txn.cursor(db=self._undo)
            found = []
            if cursor.set_range(b"t"):
                for key, value in cursor:
                    if not key.startswith(b"t"):
                        break
                    token, first_seq, _ = _unpack_token_record(value)
                    found.append((first_seq, token))
            return found

        return [token for _, token in sorted(self._read(scan))]

    def commit_tokens(self, tokens: Iterable[str], state: IndexState | None = None) -> None:
        """Drop the undo of `tokens` (their batch reached the table), optionally setting state."""
        tokens = list(tokens)

        def body(txn: _Txn) -> None:
            for chunk_seq in self._take_token_chunks(txn, tokens):
                txn.delete(b"c" + _U64BE.pack(chunk_seq), db=self._undo)
            if state is not None:
                self._put_state(txn, state)

        self._write(body)

    def rollback_tokens(self, tokens: Iterable[str]) -> None:
        """Restore what `tokens` overwrote (newest change first) and drop their undo."""
        tokens = list(tokens)

        def body(txn: _Txn) -> None:
            superseded: dict[bytes, dict[bytes | None, bytes | None]] = {}
            for chunk_seq in sorted(self._take_token_chunks(txn, tokens), reverse=True):
                chunk_key = b"c" + _U64BE.pack(chunk_seq)
                chunk = txn.get(chunk_key, db=self._undo)
                if chunk is not None:
                    self._replay_undo(txn, _unpack_undo_chunk(chunk), superseded)
                    txn.delete(chunk_key, db=self._undo)
            if superseded:
                self._splice_undo(txn, superseded)

        self._write(body)

    def _splice_undo(self, txn: _Txn, superseded: dict[bytes, dict[bytes | None, bytes | None]]) -> None:
        """Take rolled-back writes out of the undo chains of surviving tokens.

        When a surviving token overwrote a key after a rolled-back one, its undo record says
        "restore the rolled-back value". That value never existed as far as the table is
        concerned, so the record must restore what the rolled-back write had replaced.
        """
        cursor = txn.cursor(db=self._undo)
        if not cursor.set_range(b"c"):
            return
        rewrites = []
        for chunk_key, chunk in cursor:
            if not chunk_key.startswith(b"c"):
                break
            records = _unpack_undo_chunk(chunk)
            changed = False
            for i, (key, prev, new) in enumerate(records):
                chain = superseded.get(key)
                if chain is None or prev not in chain:
                    continue
                # Follow what each rolled-back write had replaced; values can repeat (a key
                # written back to an earlier value), so stop at the first one seen twice.
                seen: set[bytes | None] = set()
                while prev in chain and prev not in seen:
                    seen.add(prev)
                    prev = chain[prev]
                records[i] = (key, prev, new)
                changed = True
            if changed:
                keys, prevs, news = (list(column) for column in zip(*records))
                rewrites.append((chunk_key, _pack_undo_chunk(keys, prevs, news)))
        for chunk_key, chunk in rewrites:
            txn.put(chunk_key, chunk, db=self._undo)

    def _take_token_chunks(self, txn: _Txn, tokens: list[str]) -> list[int]:
        """Delete the token records of `tokens` and return their chunk sequence numbers."""
        seqs: list[int] = []
        for token in tokens:
            token_key = self._fit(b"t" + token.encode())
            raw = txn.get(token_key, db=self._undo)
            if raw is None:
                continue  # unknown or already resolved: both operations are idempotent
            seqs.extend(_unpack_token_record(raw)[2])
            txn.delete(token_key, db=self._undo)
        return seqs

    def _replay_undo(
        self,
        txn: _Txn,
        records: list[tuple[bytes, bytes | None, bytes | None]],
        superseded: dict[bytes, dict[bytes | None, bytes | None]],
    ) -> None:
        # Records of one chunk have distinct keys (one apply), so their order is free.
        get, put, delete, db = txn.get, txn.put, txn.delete, self._keys
        for key, prev, new in records:
            if get(key, None, db) != new:
                # A later write that is not being rolled back owns the key now; remember
                # that `new` stood for `prev`, so that write's undo can skip over it.
                superseded.setdefault(key, {})[new] = prev
                continue
            if prev is None:
                delete(key, db=db)
            else:
                put(key, prev, db=db)

    # -- state -----------------------------------------------------------------------------

    def get_state(self) -> IndexState | None:
        raw = self._read(lambda txn: txn.get(_META_STATE, db=self._meta))
        return None if raw is None else _STATE_DECODER.decode(raw)

    def set_state(self, state: IndexState) -> None:
        self._write(lambda txn: self._put_state(txn, state))

    def _put_state(self, txn: _Txn, state: IndexState) -> None:
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

        def body(txn: _Txn) -> None:
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


def _data_inode(path: str) -> int | None:
    try:
        return os.stat(os.path.join(path, "data.mdb")).st_ino
    except FileNotFoundError:
        return None


# LMDB's meta pages (pages 0 and 1): a 16-byte page header, then magic, version, address,
# map size, two 48-byte database records, the last used page number and the transaction id.
_META_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<IIQQ96xQQ")
_PAGE_HEADER = 16


def damage(path: str) -> str | None:
    """Why the index at `path` cannot be opened safely, or None. LMDB maps its file into
    memory: a file shorter than the pages its meta page says are used makes the process die
    of SIGBUS on first touch, so truncation is detected before opening."""
    if os.path.lexists(path) and not os.path.isdir(path):
        return "not a directory"
    data = os.path.join(path, "data.mdb")
    try:
        size = os.path.getsize(data)
        with open(data, "rb") as f:
            head = f.read(2 * _PAGE)
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


_PAGE = 4096  # LMDB's page size is the OS page size: 4 KiB on the platforms lakesink runs on


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
        if index is not None and not index.closed and index.inode != _data_inode(key):
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
