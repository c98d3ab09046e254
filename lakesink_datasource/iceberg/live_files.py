"""The live files of a snapshot, read with lakesink's v3-aware manifest reader."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.snapshots import Snapshot
from pyroaring import BitMap64

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import (
    content_offset,
    content_size_in_bytes,
    deleted_data_file,
    is_deletion_vector,
    read_entries,
)
from lakesink_datasource.iceberg.puffin import read_blob


class UnsupportedDeletes(LakesinkError, ValueError):
    """Delete files another engine wrote in a shape lakesink cannot maintain exactly."""


def live_entries(io: FileIO, snapshot: Snapshot | None, content: ManifestContent) -> list[ManifestEntry]:
    if snapshot is None:
        return []
    out: list[ManifestEntry] = []
    for manifest in read_manifest_list(io, snapshot.manifest_list):
        if manifest.content == content:
            out.extend(read_entries(io, manifest))
    return out


def entries_changed_by(
    io: FileIO, snapshot: Snapshot, status: ManifestEntryStatus, content: ManifestContent = ManifestContent.DATA
) -> list[ManifestEntry]:
    """The entries of `content` that `snapshot` itself wrote with `status` (ADDED: the files
    it added; DELETED: the files it removed), from the manifests it added."""
    out: list[ManifestEntry] = []
    for manifest in read_manifest_list(io, snapshot.manifest_list):
        if manifest.content != content or manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        count = manifest.added_files_count if status == ManifestEntryStatus.ADDED else manifest.deleted_files_count
        if count == 0:
            continue
        out += [e for e in read_entries(io, manifest, live_only=False) if e.status == status]
    return out


def data_entries_changed_by(io: FileIO, snapshot: Snapshot, status: ManifestEntryStatus) -> list[ManifestEntry]:
    """The data-file entries `snapshot` itself wrote with `status`."""
    return entries_changed_by(io, snapshot, status)


def live_data_files(io: FileIO, snapshot: Snapshot | None) -> list[ManifestEntry]:
    return [e for e in live_entries(io, snapshot, ManifestContent.DATA) if e.data_file.content == DataFileContent.DATA]


def live_position_deletes(io: FileIO, snapshot: Snapshot | None) -> dict[str, ManifestEntry]:
    """The live position-delete entry of each data file that has one: its DV (v3) or its
    file-scoped position-delete file (v2). lakesink keeps at most one per data file (a new
    one merges the old one's positions and replaces it), as the spec requires of DVs."""
    out: dict[str, ManifestEntry] = {}
    for entry in live_entries(io, snapshot, ManifestContent.DELETES):
        if entry.data_file.content != DataFileContent.POSITION_DELETES:
            continue
        target = deleted_data_file(entry.data_file)
        if target is None:
            raise UnsupportedDeletes(
                f"position-delete file {entry.data_file.file_path} covers several data files; lakesink's keyed writes "
                "and compaction need one per data file (Iceberg Java: write.delete.granularity=file, the default "
                "since 1.7; rewrite_position_delete_files converts older ones)"
            )
        if target in out:
            raise UnsupportedDeletes(
                f"data file {target} has several position-delete files ({out[target].data_file.file_path}, "
                f"{entry.data_file.file_path}); lakesink needs at most one per data file "
                "(Iceberg Java: CALL system.rewrite_position_delete_files merges them)"
            )
        out[target] = entry
    return out


def read_hidden_positions(io: FileIO, deletes: DataFile) -> BitMap64:
    """The positions one position-delete file hides: a DV blob, read by the manifest's
    offset and length (never the Puffin footer), or the `pos` column of a file-scoped v2
    position-delete file."""
    if not is_deletion_vector(deletes):
        with io.new_input(deletes.file_path).open() as stream:
            table = pq.read_table(stream, columns=["pos"])
        return BitMap64(table.column("pos").to_numpy().tolist())
    offset, length = content_offset(deletes), content_size_in_bytes(deletes)
    assert offset is not None and length is not None, f"DV entry {deletes.file_path} lacks content_offset/size"
    with io.new_input(deletes.file_path).open() as stream:
        stream.seek(offset)
        blob = stream.read(length)
    return read_blob(blob, 0, length, deletes.record_count)


def keep_mask(positions: np.ndarray, offset: int, rows: int) -> np.ndarray:
    """Which of a file's rows offset..offset+rows the sorted `positions` leave visible."""
    keep = np.ones(rows, dtype=bool)
    lo, hi = np.searchsorted(positions, [offset, offset + rows])
    keep[positions[lo:hi] - offset] = False
    return keep


def without_hidden_rows(io: FileIO, table: pa.Table, deletion_vector: ManifestEntry | None) -> tuple[pa.Table, np.ndarray]:
    """A data file's rows minus those its DV hides, with each kept row's position in the file."""
    positions = np.arange(table.num_rows, dtype=np.int64)
    if deletion_vector is None:
        return table, positions
    hidden = np.fromiter(read_hidden_positions(io, deletion_vector.data_file), dtype=np.int64)  # sorted
    keep = keep_mask(hidden, 0, table.num_rows)
    return table.filter(pa.array(keep)), positions[keep]
