"""The live files of a snapshot, read with lakesink's v3-aware manifest reader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.snapshots import Snapshot
from pyroaring import BitMap64

from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import (
    content_offset,
    content_size_in_bytes,
    is_deletion_vector,
    read_entries,
    referenced_data_file,
)
from lakesink_datasource.iceberg.puffin import read_blob


def live_entries(io: FileIO, snapshot: Snapshot | None, content: ManifestContent) -> list[ManifestEntry]:
    if snapshot is None:
        return []
    out: list[ManifestEntry] = []
    for manifest in read_manifest_list(io, snapshot.manifest_list):
        if manifest.content == content:
            out.extend(read_entries(io, manifest))
    return out


def data_entries_changed_by(io: FileIO, snapshot: Snapshot, status: ManifestEntryStatus) -> list[ManifestEntry]:
    """The data-file entries `snapshot` itself wrote with `status` (ADDED: the files it
    added; DELETED: the files it removed), from the manifests it added."""
    out: list[ManifestEntry] = []
    for manifest in read_manifest_list(io, snapshot.manifest_list):
        if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        count = manifest.added_files_count if status == ManifestEntryStatus.ADDED else manifest.deleted_files_count
        if count == 0:
            continue
        out += [e for e in read_entries(io, manifest, live_only=False) if e.status == status]
    return out


def live_data_files(io: FileIO, snapshot: Snapshot | None) -> list[ManifestEntry]:
    return [e for e in live_entries(io, snapshot, ManifestContent.DATA) if e.data_file.content == DataFileContent.DATA]


def live_deletion_vectors(io: FileIO, snapshot: Snapshot | None) -> dict[str, ManifestEntry]:
    """Live DV entries keyed by the data file they reference (at most one per file)."""
    out: dict[str, ManifestEntry] = {}
    for entry in live_entries(io, snapshot, ManifestContent.DELETES):
        target = referenced_data_file(entry.data_file)
        if is_deletion_vector(entry.data_file) and target is not None:
            out[target] = entry
    return out


def read_deletion_vector(io: FileIO, dv: DataFile) -> BitMap64:
    """Read one DV blob by the manifest's offset and length (never the Puffin footer)."""
    offset, length = content_offset(dv), content_size_in_bytes(dv)
    assert offset is not None and length is not None, f"DV entry {dv.file_path} lacks content_offset/size"
    with io.new_input(dv.file_path).open() as stream:
        stream.seek(offset)
        blob = stream.read(length)
    return read_blob(blob, 0, length, dv.record_count)


def without_hidden_rows(io: FileIO, table: pa.Table, deletion_vector: ManifestEntry | None) -> tuple[pa.Table, np.ndarray]:
    """A data file's rows minus those its DV hides, with each kept row's position in the file."""
    positions = np.arange(table.num_rows, dtype=np.int64)
    if deletion_vector is None:
        return table, positions
    hidden = np.fromiter(read_deletion_vector(io, deletion_vector.data_file), dtype=np.int64)
    keep = ~np.isin(positions, hidden)
    return table.filter(pa.array(keep)), positions[keep]
