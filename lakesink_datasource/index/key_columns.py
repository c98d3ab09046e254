"""Which table columns a key index holds, and the index's own markers in them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.key_shards import KeyShard

TOMBSTONE = 0xFFFF_FFFF  # file ordinal of a deleted key that remembers its sequence
SEQUENCE = "__lakesink_sequence"  # the (first) sequence column's name in tombstone files
TOMBSTONE_DIR = "lakesink-tombstones"  # under the data path: the files keyed tasks report deletes in
# The keys a commit decided against concurrent commits (commit/key_conflicts.py): key
# columns, SEQUENCE (the winner's, null without one), the winning row's encoded file ref and
# position (null: the key is deleted).
WINNER_FILE = "__lakesink_winner_file"
WINNER_POSITION = "__lakesink_winner_position"


@dataclass(frozen=True)
class KeyColumns:
    """Which table columns form the key and the sequence (as stored in data files)."""

    key: tuple[str, ...]
    sequence: tuple[str, ...] = ()  # the sequence columns, compared in order (): none, or not stored in the table
    route: KeyShard | None = None  # the one key shard an index holds (None: every key)
    # A history table's end column: only rows where it is null (each key's current version)
    # are the key's; the others are versions that ended.
    current: str | None = None

    def skips_file(self, path: str) -> bool:
        """A data file an index of one key shard need not read: it holds another shard's keys."""
        return self.route is not None and self.route.skips(path)

    def own_rows(self, table: pa.Table) -> tuple[pa.Table, np.ndarray | None]:
        """The rows of `table` (with the key columns) whose key is the index's to hold, and
        the mask that chose them (None: all of them)."""
        if self.route is None or table.num_rows == 0:
            return table, None
        keep = self.route.keeps([table.column(c) for c in self.route.key_order(self.key)])
        if keep.all():
            return table, None
        return table.filter(pa.array(keep)), keep


def sequence_names(count: int) -> tuple[str, ...]:
    """The names `count` sequence columns take in tombstone and outcome files: SEQUENCE, then
    SEQUENCE_2, SEQUENCE_3... (a single sequence keeps the one name files always had)."""
    return (SEQUENCE, *(f"{SEQUENCE}_{i}" for i in range(2, count + 1)))


def sequence_columns_in(table: pa.Table) -> list[str]:
    """The sequence columns a tombstone or outcome file holds, in order."""
    names = []
    for name in sequence_names(len(table.column_names)):
        if name not in table.column_names:
            break
        names.append(name)
    return names


def encode_sequences(table: pa.Table) -> list[bytes] | None:
    """Each row's sequence, encoded (`key_encoding.encode_keys` over the sequence columns in
    order, so comparing the bytes compares the columns one after another); None when the file
    holds no sequence or a row has none (a delete without one)."""
    names = sequence_columns_in(table)
    if not names or any(table.column(n).null_count or pa.types.is_null(table.column(n).type) for n in names):
        return None
    return encode_keys([table.column(n) for n in names], names=names)
