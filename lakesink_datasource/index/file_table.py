"""The file table of a table's key index on a host: compact ordinals for data file paths
(what every shard's key locations point into), and the compactions' move maps.

An ordinal is four bytes where a path is a hundred, so a location stays small; the table
forgets the files the table no longer has (`forget_files`), so it does not grow with every
file ever written. The ``moves`` sub-database holds a move map per moved file (key: the u32
ordinal; `row_moves.py`) and a marker per file that only maps lead into (key: b"m" +
ordinal): no key points at such a file directly, so when it moves in turn, only the maps
leading into it need re-aiming.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np

from lakesink_datasource.index.environment import META_NEXT_ORDINAL, IndexEnvironment
from lakesink_datasource.index.lmdb_env import Txn

__all__ = ["FileTable"]

_U32BE = struct.Struct(">I")
_MAP_ONLY = b"m"  # in the moves table: a file only move maps lead into (see move_maps)


class FileTable(IndexEnvironment):
    """Data file ordinals and move maps. Use `open_index(FileTable, path)`."""

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
        raw_next = txn.get(META_NEXT_ORDINAL, db=self._meta)
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
        txn.put(META_NEXT_ORDINAL, _U32BE.pack(next_ordinal), db=self._meta)
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

    @contextmanager
    def move_maps(self) -> Iterator[dict[int, np.ndarray]]:
        """The stored move maps (old file ordinal -> int64 places), as read-only views of the
        map that stay valid inside the `with` block only: no copy, however large they grow."""
        with self._lock, self._viewing(threading.get_ident()):
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
