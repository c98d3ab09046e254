"""What an overwrite replaces, decided against each attempt's base.

Three scopes, all landing as one snapshot with the overwrite's new files:

* `table` (static overwrite): every live file;
* `partitions` (`overwrite_mode=dynamic`, Spark's dynamic partition overwrite and Iceberg's
  `ReplacePartitions`): the live files, data and delete, in the partitions the new files are
  written to; nothing when the overwrite writes no rows, the whole table when it is
  unpartitioned;
* `filter` (`replace_where`, Delta's `replaceWhere`): the live rows the filter matches.
  A file whose partition or column bounds show that all its rows match is removed; a file
  that may hold rows of both kinds is read, and its matching rows are hidden with a deletion
  vector (a v2 position-delete file), merged with the file's live ones like any delete;
* `before` (a source table's truncate, `cdc_format=debezium`): the live rows whose sequence
  is below the truncate's position, the batch's own rows included (another task of the
  batch may have written rows ordered before it). Files are read for their sequence
  columns; a base file all of whose rows go is removed.

An overwrite takes the table as it is when the attempt is built (Iceberg's snapshot
isolation): rows another writer committed meanwhile into the replaced scope are replaced
too, never kept half.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyroaring import BitMap64

from lakesink_datasource.commit.deletion_vectors import PendingDeletes
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.manifests import deleted_data_file
from lakesink_datasource.iceberg.row_filter import Placement, matching_positions, parse_filter, placer
from lakesink_datasource.index.key_encoding import encode_keys

ScopeKind = Literal["table", "partitions", "filter", "before"]


@dataclass(frozen=True)
class OverwriteScope:
    kind: ScopeKind
    filter_text: str | None = None  # kind "filter": Iceberg expression syntax
    # kind "before": the table's sequence columns and the position (encoded as the keyed
    # write encodes sequences) below which rows go.
    sequence: tuple[str, ...] = ()
    position: bytes = b""


def _partition_of(f: DataFile) -> tuple[int, tuple[object, ...]]:
    record = f.partition
    return f.spec_id, tuple(record[i] for i in range(len(record)))


@dataclass
class Replaced:
    """One attempt's decision: data files removed whole, rows hidden in others, and which
    delete files go with the scope (besides those of removed data files)."""

    scope: OverwriteScope
    data_files: set[str] = field(default_factory=set)
    hidden: dict[str, PendingDeletes] = field(default_factory=dict)
    partitions: set[tuple[int, tuple[object, ...]]] = field(default_factory=set)

    def drops_delete_file(self, entry: ManifestEntry) -> bool:
        target = deleted_data_file(entry.data_file)
        if target is not None and target in self.data_files:
            return True
        if self.scope.kind == "table":
            return True
        if self.scope.kind == "before":
            return False
        if self.scope.kind == "partitions":
            # Equality deletes and multi-file position deletes of another engine apply by
            # partition too: they go with the partition's data.
            return _partition_of(entry.data_file) in self.partitions
        return False


def replaced_by(
    io: FileIO, base: TableMetadata, parent: Snapshot | None, scope: OverwriteScope, added: Iterable[DataFile]
) -> Replaced:
    out = Replaced(scope)
    if scope.kind == "before":
        # A table's first snapshot too: other tasks' rows of this batch ordered before a
        # truncate go (a table created by the batch that truncates it).
        return _before(io, parent, scope, added, out)
    if parent is None:
        return out
    specs = base.specs()
    unpartitioned = all(not spec.fields for spec in specs.values())
    if scope.kind == "partitions":
        out.partitions = {_partition_of(f) for f in added}
        if not out.partitions:
            return out  # an empty dynamic overwrite replaces nothing
    row_filter = parse_filter(scope.filter_text or "", base.schema()) if scope.kind == "filter" else None
    placers: dict[int, Callable[[DataFile], Placement]] = {}
    for entry in live_data_files(io, parent):
        f = entry.data_file
        if scope.kind == "table" or (scope.kind == "partitions" and (unpartitioned or _partition_of(f) in out.partitions)):
            out.data_files.add(f.file_path)
            continue
        if row_filter is None:
            continue
        place = placers.get(f.spec_id)
        if place is None:
            place = placers[f.spec_id] = placer(row_filter, specs[f.spec_id])
        placement = place(f)
        if placement is Placement.ALL:
            out.data_files.add(f.file_path)
        elif placement is Placement.SOME:
            positions = matching_positions(io, f.file_path, row_filter)
            if len(positions) == f.record_count:
                out.data_files.add(f.file_path)
            elif positions:
                out.hidden[f.file_path] = PendingDeletes(f.spec_id, f.partition, positions)
    return out


def _before(io: FileIO, parent: Snapshot | None, scope: OverwriteScope, added: Iterable[DataFile], out: Replaced) -> Replaced:
    """Every live row, and every row of the batch's own files, ordered before the position."""
    live = live_data_files(io, parent) if parent is not None else []
    for f, own in [*((e.data_file, False) for e in live), *((f, True) for f in added)]:
        with io.new_input(f.file_path).open() as stream:
            columns = pq.read_table(stream, columns=list(scope.sequence))
        if columns.num_rows == 0:
            continue
        encoded = encode_keys([columns.column(c) for c in scope.sequence], names=list(scope.sequence))
        before = np.flatnonzero(np.array(encoded, dtype=object) < scope.position)
        if not len(before):
            continue
        if len(before) == columns.num_rows and not own:
            out.data_files.add(f.file_path)  # its delete file goes with it (drops_delete_file)
        else:
            # A file of this very commit cannot be left out of it any more (its manifest is
            # written once for every attempt): its rows are hidden like any other's.
            out.hidden[f.file_path] = PendingDeletes(f.spec_id, f.partition, BitMap64(before.astype(np.uint64)))
    return out
