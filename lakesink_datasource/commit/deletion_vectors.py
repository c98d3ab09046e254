"""Turn a commit's pending row positions into deletion vectors, merged with the base's.

Tasks report the positions they hide per data file; several tasks may hide rows of one
file, and the file may already have a live DV in the base the commit lands on (its own or
another writer's). The spec allows at most one DV per data file, so each attempt merges
the pending positions with the file's live DV *in that attempt's base* and writes all of
the merged DVs into one Puffin file; the carry-over step then removes the replaced DVs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestEntry
from pyiceberg.typedef import Record
from pyroaring import BitMap64

from lakesink_datasource.iceberg.data_files import dv_data_file
from lakesink_datasource.iceberg.live_files import read_deletion_vector
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
        positions = BitMap64(pending[path].positions)
        old = live_dvs.get(path)
        if old is not None:
            positions |= read_deletion_vector(io, old.data_file)
        writer.add_deletion_vector(path, positions)
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
