"""The companion table that keeps a keyed table's sequenced deletes safe from any maintenance.

A tombstone (a deleted key with the delete's sequence) lets a rebuilt key index refuse a late
change older than the delete. Its file is named in the batch's snapshot summary, which is
not enough on its own: Iceberg Java's `expire_snapshots` drops that snapshot without
carrying the name anywhere, and its `remove_orphan_files` deletes the file (it does not read
summaries). So the tombstones are also stored as rows of a companion Iceberg table in the
same catalog, `<namespace>.<table>__lakesink_tombstones` (format v2, key columns plus the
sequence). Every engine's standard maintenance keeps a table's live rows, so they survive
rewrite, expiry and orphan removal of either table.

The companion's table property `lakesink.stored-through` records the sequence number of the
last main-table snapshot whose tombstones it holds (set by the commit that stored them). Storing is done
after a batch's commit (`maintenance/tombstone_storing.py`) and catches up every main
snapshot after that mark, so a process that died between the two commits loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakesink_datasource.iceberg.summary_keys import TOMBSTONES

log = logging.getLogger("lakesink")

SUFFIX = "__lakesink_tombstones"
STORED_THROUGH = "lakesink.stored-through"  # companion property: main sequence number stored up to


def companion_identifier(identifier: str) -> str:
    return f"{identifier}{SUFFIX}"


def load_companion(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(companion_identifier(identifier))
    except NoSuchTableError:
        return None


def stored_through(companion: Table | None) -> int:
    """The main table's sequence number whose tombstones (and all before) are stored; -1: none."""
    if companion is None:
        return -1
    return int(companion.metadata.properties.get(STORED_THROUGH, -1))


def unstored_tombstone_snapshots(table: Table, identifier: str, candidates: Iterable[int]) -> set[int]:
    """Which of the snapshots `candidates` name tombstone files the companion table does not
    hold yet (all that name any, when the companion cannot be read)."""
    named = {
        s.snapshot_id: s.sequence_number or 0
        for s in table.metadata.snapshots
        if s.snapshot_id in set(candidates) and s.summary is not None and s.summary.additional_properties.get(TOMBSTONES)
    }
    if not named:
        return set()
    try:
        through = stored_through(load_companion(table.catalog, identifier))
    except Exception:
        log.warning("lakesink: cannot read %s; snapshots naming tombstones are kept from expiry", companion_identifier(identifier), exc_info=True)
        return set(named)
    return {snapshot_id for snapshot_id, sequence in named.items() if sequence > through}


def read_stored(catalog: Catalog, identifier: str) -> pa.Table | None:
    """Every stored tombstone row (key columns + sequence); None without a companion table."""
    companion = load_companion(catalog, identifier)
    if companion is None or companion.metadata.current_snapshot() is None:
        return None
    return companion.scan().to_arrow()
