"""Turn a commit's pending row positions into delete files, merged with the base's.

Tasks report the positions they hide per data file; several tasks may hide rows of one
file, and the file may already have live deletes in the base the commit lands on (its own or
another writer's). The spec allows at most one DV per data file, so each attempt merges
the pending positions with the file's live deletes *in that attempt's base* and writes all of
the merged DVs into one Puffin file; the carry-over step then removes the replaced ones.

Format version 2 has no DVs: there the merged positions of each data file go into one
file-scoped position-delete Parquet file (Java's default granularity), which replaces the
file's earlier one the same way, so a v2 data file also has at most one live delete file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry
from pyiceberg.typedef import Record
from pyroaring import BitMap64

from lakesink_datasource.iceberg.data_files import dv_data_file, position_delete_data_file
from lakesink_datasource.iceberg.live_files import read_hidden_positions
from lakesink_datasource.iceberg.manifests import DELETE_FILE_PATH_ID, DELETE_POS_ID
from lakesink_datasource.iceberg.puffin import PuffinWriter


@dataclass
class PendingDeletes:
    """Positions to hide in one data file, before merging with the file's live DV."""

    spec_id: int
    partition: Record
    positions: BitMap64


@dataclass(frozen=True)
class WrittenDeletionVectors:
    files: list[DataFile]  # one DV manifest entry per data file, all in one Puffin file
    puffin_path: str


def write_deletion_vectors(
    io: FileIO,
    location: str,
    pending: Mapping[str, PendingDeletes],
    live_dvs: Mapping[str, ManifestEntry],
    created_by: str,
) -> WrittenDeletionVectors:
    """Merge `pending` (data file path -> positions) with `live_dvs` (data file path -> its
    live DV entry in the base) and write the results into one Puffin file at `location`."""
    writer = PuffinWriter()
    merged: list[tuple[str, PendingDeletes]] = []
    for path in sorted(pending):
        writer.add_deletion_vector(path, _merged(io, path, pending, live_dvs))
        merged.append((path, pending[path]))
    data = writer.finish(created_by=created_by)
    with io.new_output(location).create(overwrite=True) as out:
        out.write(data)
    files = [
        dv_data_file(
            puffin_path=location,
            puffin_size=len(data),
            referenced_data_file=path,
            spec_id=deletes.spec_id,
            partition=deletes.partition,
            cardinality=ref.cardinality,
            content_offset=ref.offset,
            content_size_in_bytes=ref.length,
        )
        for (path, deletes), ref in zip(merged, writer.refs)
    ]
    return WrittenDeletionVectors(files, location)


def _merged(io: FileIO, path: str, pending: Mapping[str, PendingDeletes], live: Mapping[str, ManifestEntry]) -> BitMap64:
    """The positions of data file `path` hidden after this commit: its pending ones and those
    its live delete file in the base already hides."""
    positions = BitMap64(pending[path].positions)
    old = live.get(path)
    if old is not None:
        positions |= read_hidden_positions(io, old.data_file)
    return positions


# The position-delete file schema (spec: "Position Delete Files"), with its reserved ids.
POSITION_DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(DELETE_FILE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(DELETE_POS_ID).encode()}),
])


def write_position_delete_files(
    io: FileIO,
    location_for: Callable[[int], str],
    pending: Mapping[str, PendingDeletes],
    live_deletes: Mapping[str, ManifestEntry],
    compression: str,
) -> list[DataFile]:
    """v2: one position-delete file per data file (`location_for(n)` names the n-th), its
    positions merged with the file's live delete file in the base, rows sorted by position
    (the spec's order: file_path, then pos; one file_path per file)."""
    files = []
    for n, path in enumerate(sorted(pending)):
        positions = _merged(io, path, pending, live_deletes)
        pos = np.fromiter(positions, dtype=np.int64, count=len(positions))
        rows = pa.table([pa.array([path] * len(pos), pa.string()), pa.array(pos)], schema=POSITION_DELETE_SCHEMA)
        location = location_for(n)
        with io.new_output(location).create(overwrite=True) as out:
            pq.write_table(rows, out, compression=compression)
        size = len(io.new_input(location))
        files.append(position_delete_data_file(
            path=location, size=size, data_file=path, spec_id=pending[path].spec_id,
            partition=pending[path].partition, count=len(pos),
        ))
    return files
