"""Tombstones outlive snapshot expiry: a commit that expires snapshots carries their files.

A sequenced delete leaves a tombstone file (the deleted keys with their sequence), named in
its snapshot's summary; an index rebuilt from the table reads the tombstones of the current
snapshot's ancestors, so a late change older than the delete is still refused. Expiring
that snapshot would forget the delete. So the commit that expires snapshots names their
tombstone files in its own summary too, and once more than `MAX_CARRIED` files are carried it
merges them into one (the newest sequence per key), and the merged-away files are deleted
after the commit lands.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.iceberg.history import ancestors
from lakesink_datasource.iceberg.summary_keys import TOMBSTONES
from lakesink_datasource.index.sync import SEQUENCE, TOMBSTONE_DIR

MAX_CARRIED = 16


@dataclass
class CarriedTombstones:
    paths: list[str] = field(default_factory=list)  # what the new snapshot's summary names
    written: list[str] = field(default_factory=list)  # a merged file this attempt wrote
    obsolete: list[str] = field(default_factory=list)  # merged away: delete once committed


def tombstone_paths(summary_value: str | None) -> list[str]:
    return [p for p in (summary_value or "").split(",") if p]


def carry(io: FileIO, base: TableMetadata, expired: Iterable[int], own: list[str], data_dir: str) -> CarriedTombstones:
    """The tombstone files the commit's snapshot names: its own plus the expiring ancestors'."""
    gone = set(expired)
    inherited: list[str] = []
    for snapshot in ancestors(base):
        if snapshot.snapshot_id in gone and snapshot.summary is not None:
            inherited += tombstone_paths(snapshot.summary.additional_properties.get(TOMBSTONES))
    inherited = sorted(set(inherited) - set(own))
    if len(inherited) <= MAX_CARRIED:
        return CarriedTombstones(paths=own + inherited)
    merged = f"{data_dir}/{TOMBSTONE_DIR}/merged-{uuid.uuid4().hex}.parquet"
    _merge(io, inherited, merged)
    return CarriedTombstones(paths=[*own, merged], written=[merged], obsolete=inherited)


def _merge(io: FileIO, paths: list[str], location: str) -> None:
    tables = []
    for path in paths:
        try:
            with io.new_input(path).open() as stream:
                tables.append(pq.read_table(stream))
        except FileNotFoundError:
            continue  # already gone (an operator's clean-up): nothing left to carry
    if not tables:
        table = pa.table({SEQUENCE: pa.array([], pa.int64())})
    else:
        table = pa.concat_tables(tables, promote_options="permissive")
        keys = [c for c in table.column_names if c != SEQUENCE]
        newest = table.group_by(keys, use_threads=False).aggregate([(SEQUENCE, "max")])
        table = pa.table({**{k: newest.column(k) for k in keys}, SEQUENCE: newest.column(f"{SEQUENCE}_max")})
    with io.new_output(location).create(overwrite=True) as out:
        pq.write_table(table, out, compression="zstd")
