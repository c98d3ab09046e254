"""A shard of a table's key index on a host: the keys that hash to it, where each one's live
row is, and the undo log of the changes not yet committed to the table.

Keys map to packed `Location`s (file ordinal, position, sequence; `location_codec.py`);
the ordinals come from the index's one `FileTable`. Every keyed change is written under a
token (`<write>/<host>/<task>/<attempt>`) with undo records (`undo_log.py`), committed
when its snapshot reaches the table and rolled back when it never will. Catch-up and
rebuild write without undo (`overwrite_packed`, `remove_keys`): see there why that is safe.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat

import lmdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.arrays import take_items
from lakesink_datasource.index.environment import IndexEnvironment, IndexState
from lakesink_datasource.index.lmdb_env import Txn
from lakesink_datasource.index.location_codec import Found, Location, decode_locations, pack_location, unpack_location
from lakesink_datasource.index.undo_log import UndoLog

__all__ = ["KeyShard"]


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


class KeyShard(IndexEnvironment):
    """The keys of one shard with their undo log. Use `open_index(KeyShard, path)`."""

    def __init__(self, path: str, map_size: int = 1 << 36):
        super().__init__(path, map_size)
        self._undo_log = UndoLog(self._keys, self._undo, self._meta, self._max_key)

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
        ordinal_of: Callable[[str], int],
    ) -> None:
        """Look `keys` up and apply what `decide` makes of them in ONE write transaction.

        `keys` must be distinct (one change per key); in key order they walk neighbouring
        B-tree pages. `decide` gets the current locations as columns (`Found`, input order)
        and a function giving a file's ordinal inside this transaction, and returns which
        keys change (distinct indices into `keys`, in any order) and their new packed
        locations (`pack_positions`; None deletes the key). One transaction means one lock
        round and one read per key (the undo record reuses the lookup). `decide` must not
        touch the index, and runs once: it places rows (side effects). So when the map is
        full, the transaction (aborted whole) is written again from what `decide` made of
        it, on a grown map; the shard's host lock, which the caller holds from the lookup to
        here, has kept every other writer of the host out, so what it looked up still holds
        (checked). `ordinal_of` gives a data file's ordinal in the index's file table.
        """
        fitted = self._fit_all(keys)
        token_raw = token.encode()
        with self._lock:
            try:
                with self._begin(write=True) as txn:
                    prevs = list(map(txn.get, fitted, repeat(None), repeat(self._keys)))
                    changed, values = decide(decode_locations(prevs), ordinal_of)
                    # Only the changed keys are written, back in key order (neighbouring pages).
                    order = np.argsort(changed, kind="stable")
                    which = changed[order]
                    keys_out, prevs_out, news_out = take_items(fitted, which), take_items(prevs, which), take_items(values, order)
                    self._write_changes(txn, token_raw, keys_out, prevs_out, news_out)
                return
            except lmdb.MapFullError:
                pass
            except lmdb.Error as exc:
                self._raise_if_full(exc)
                raise
            self._resize()

            def again(txn: Txn) -> None:
                if list(map(txn.get, keys_out, repeat(None), repeat(self._keys))) != prevs_out:
                    raise RuntimeError(f"key index {self.path} changed under its host lock during a keyed transaction")
                self._write_changes(txn, token_raw, keys_out, prevs_out, news_out)

            self._write(again)  # grows the map further if need be

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

    def count(self) -> int:
        return self._read(lambda txn: txn.stat(self._keys)["entries"])
