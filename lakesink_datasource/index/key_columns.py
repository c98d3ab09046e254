"""Which table columns a key index holds, and the index's own markers in them."""

from __future__ import annotations

from dataclasses import dataclass

TOMBSTONE = 0xFFFF_FFFF  # file ordinal of a deleted key that remembers its sequence
SEQUENCE = "__lakesink_sequence"  # the sequence column's name in tombstone files
TOMBSTONE_DIR = "lakesink-tombstones"  # under the data path: the files keyed tasks report deletes in


@dataclass(frozen=True)
class KeyColumns:
    """Which table columns form the key and the sequence (as stored in data files)."""

    key: tuple[str, ...]
    sequence: str | None  # None when no sequence column, or it is not stored in the table
