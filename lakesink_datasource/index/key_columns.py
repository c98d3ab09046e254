"""Which table columns a key index holds, and the index's own markers in them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lakesink_datasource.index.key_route import KeyRoute

TOMBSTONE = 0xFFFF_FFFF  # file ordinal of a deleted key that remembers its sequence
SEQUENCE = "__lakesink_sequence"  # the sequence column's name in tombstone files
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
    sequence: str | None  # None when no sequence column, or it is not stored in the table
    route: KeyRoute | None = None  # the one key shard an index holds (None: every key)

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
