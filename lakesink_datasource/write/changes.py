"""Keyed input -> one change per key, vectorised on Arrow (no Spark, no index).

A keyed batch may carry several rows for one key. Within one chunk of input the winner per
key is the row with the highest sequence value (ties: the later row), or simply the last
row when there is no sequence column; dedupe keeps the first row instead. Each winner is either a write (insert or replace)
or a delete. Across batches the key index applies the same rule (see `write/keyed.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.arrays import take_items
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.index.key_encoding import NullKeyError, encode_keys

WRITE_OPS = ("c", "r", "u")  # Debezium: create, read (snapshot), update


class KeyedInputError(LakesinkError, ValueError):
    """A keyed row cannot be applied (null key, unknown op...). The task fails, nothing commits."""


@dataclass(frozen=True)
class Changes:
    """The winning row per key of one Arrow batch, in the order of their encoded keys (the
    index then reads and writes neighbouring B-tree pages one after the other)."""

    rows: np.ndarray  # int64 indices into the input batch
    keys: list[bytes]  # encoded primary key per winner
    is_delete: np.ndarray  # bool per winner
    sequences: list[bytes] | None  # encoded sequence per winner (None: no sequence column)

    def take(self, which: np.ndarray) -> Changes:
        """The changes at indices `which` (one shard's keys), in that order."""
        if len(which) == len(self.keys):
            return self  # one shard got every key: `which` is 0..n-1 (split keeps input order)
        return Changes(
            self.rows[which],
            take_items(self.keys, which),
            self.is_delete[which],
            None if self.sequences is None else take_items(self.sequences, which),
        )


def op_kinds(ops: pa.Array, op_column: str, delete_ops: Sequence[str]) -> np.ndarray:
    """True where the row deletes its key; raises on null or unknown op values."""
    if ops.null_count:
        raise KeyedInputError(f"op column '{op_column}' has {ops.null_count} null value(s)")
    ops = ops.cast(pa.string())
    is_delete = pc.is_in(ops, value_set=pa.array(list(delete_ops), pa.string()))
    is_write = pc.is_in(ops, value_set=pa.array(list(WRITE_OPS), pa.string()))
    unknown = pc.invert(pc.or_(is_delete, is_write))
    if pc.any(unknown).as_py():
        bad = sorted(set(pc.filter(ops, unknown).to_pylist()))[:5]
        raise KeyedInputError(
            f"op column '{op_column}' has unknown value(s) {bad}: expected one of "
            f"{', '.join(WRITE_OPS)} (write) or {', '.join(delete_ops)} (delete)"
        )
    return is_delete.to_numpy(zero_copy_only=False)


def resolve_changes(
    batch: pa.RecordBatch | pa.Table,
    key_columns: Sequence[str],
    *,
    op_column: str | None = None,
    delete_ops: Sequence[str] = ("d",),
    sequence_columns: Sequence[str] = (),
    keep: str = "last",
) -> Changes:
    """keep="last": the winner is the highest sequence, else the last row (upsert, cdc);
    keep="first": the first row (dedupe: a key's first arrival is the one inserted, so the
    choice does not depend on how Spark cut the input into batches)."""
    n = batch.num_rows
    try:
        keys = encode_keys([batch.column(c) for c in key_columns], names=list(key_columns)) if n else []
    except NullKeyError as exc:
        raise KeyedInputError(f"primary key column '{exc.column_name}' has {exc.null_count} null value(s)") from None
    is_delete = op_kinds(batch.column(op_column), op_column, delete_ops) if op_column else np.zeros(n, dtype=bool)
    sequences: list[bytes] | None = None
    if sequence_columns and n:
        try:
            sequences = encode_keys([batch.column(c) for c in sequence_columns], names=list(sequence_columns))
        except NullKeyError as exc:
            raise KeyedInputError(f"sequence column '{exc.column_name}' has {exc.null_count} null value(s)") from None
    if n == 0:
        return Changes(np.zeros(0, dtype=np.int64), [], np.zeros(0, dtype=bool), [] if sequence_columns else None)

    # Group rows by key, then pick the winner in each group: sort by (key, sequence, row)
    # and keep each group's last row.
    key_array = pa.array(keys, pa.binary())
    sort_columns = [("k", "ascending")]
    arrays = {"k": key_array}
    if sequences is not None:
        arrays["s"] = pa.array(sequences, pa.binary())
        sort_columns.append(("s", "ascending"))
    arrays["r"] = pa.array(np.arange(n, dtype=np.int64))
    sort_columns.append(("r", "ascending" if keep == "last" else "descending"))
    order = pc.sort_indices(pa.table(arrays), sort_keys=sort_columns).to_numpy()
    sorted_keys = key_array.take(pa.array(order))
    # A row is its group's last when the next sorted key differs.
    different_next = pc.not_equal(sorted_keys.slice(0, n - 1), sorted_keys.slice(1)).to_numpy(zero_copy_only=False)
    last = np.append(different_next, True)
    winners = order[last].astype(np.int64)  # in key order
    return Changes(
        rows=winners,
        keys=take_items(keys, winners),
        is_delete=is_delete[winners],
        sequences=take_items(sequences, winners) if sequences is not None else None,
    )
