"""Snapshot summary: Iceberg's standard counters and totals, Java's conventions.

Counters are written only when non-zero; totals are previous + added - removed and
are omitted when the previous snapshot did not carry them (a total we cannot know
is better absent than wrong).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyiceberg.manifest import DataFile, DataFileContent

from lakesink_datasource.iceberg.manifests import content_size_in_bytes, is_deletion_vector


@dataclass
class ChangeCounts:
    added_data_files: int = 0
    removed_data_files: int = 0
    added_records: int = 0
    removed_records: int = 0
    added_files_size: int = 0
    removed_files_size: int = 0
    added_delete_files: int = 0
    removed_delete_files: int = 0
    added_dvs: int = 0
    removed_dvs: int = 0
    added_position_deletes: int = 0
    removed_position_deletes: int = 0
    added_equality_deletes: int = 0
    removed_equality_deletes: int = 0
    partitions: set[str] = field(default_factory=set)

    def _size(self, f: DataFile) -> int:
        # Java counts a DV by its blob size, not the size of the Puffin file holding it.
        return (content_size_in_bytes(f) or f.file_size_in_bytes) if is_deletion_vector(f) else f.file_size_in_bytes

    def add(self, f: DataFile, partition_path: str) -> None:
        self.partitions.add(partition_path)
        self.added_files_size += self._size(f)
        if f.content == DataFileContent.DATA:
            self.added_data_files += 1
            self.added_records += f.record_count
            return
        self.added_delete_files += 1
        if f.content == DataFileContent.POSITION_DELETES:
            self.added_position_deletes += f.record_count
            self.added_dvs += int(is_deletion_vector(f))
        else:
            self.added_equality_deletes += f.record_count

    def remove(self, f: DataFile, partition_path: str) -> None:
        self.partitions.add(partition_path)
        self.removed_files_size += self._size(f)
        if f.content == DataFileContent.DATA:
            self.removed_data_files += 1
            self.removed_records += f.record_count
            return
        self.removed_delete_files += 1
        if f.content == DataFileContent.POSITION_DELETES:
            self.removed_position_deletes += f.record_count
            self.removed_dvs += int(is_deletion_vector(f))
        else:
            self.removed_equality_deletes += f.record_count


_COUNTERS = [
    ("added-data-files", "added_data_files"),
    ("deleted-data-files", "removed_data_files"),
    ("added-records", "added_records"),
    ("deleted-records", "removed_records"),
    ("added-files-size", "added_files_size"),
    ("removed-files-size", "removed_files_size"),
    ("added-delete-files", "added_delete_files"),
    ("removed-delete-files", "removed_delete_files"),
    ("added-dvs", "added_dvs"),
    ("removed-dvs", "removed_dvs"),
    ("added-position-deletes", "added_position_deletes"),
    ("removed-position-deletes", "removed_position_deletes"),
    ("added-equality-deletes", "added_equality_deletes"),
    ("removed-equality-deletes", "removed_equality_deletes"),
]

# total key -> (added attributes, removed attributes)
_TOTALS = {
    "total-records": (("added_records",), ("removed_records",)),
    "total-files-size": (("added_files_size",), ("removed_files_size",)),
    "total-data-files": (("added_data_files",), ("removed_data_files",)),
    "total-delete-files": (("added_delete_files",), ("removed_delete_files",)),
    "total-position-deletes": (("added_position_deletes",), ("removed_position_deletes",)),
    "total-equality-deletes": (("added_equality_deletes",), ("removed_equality_deletes",)),
}


def build_summary(
    counts: ChangeCounts,
    previous: Mapping[str, str] | None,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """The summary properties (without `operation`), `previous` is the parent's summary
    (None when the table has no snapshot yet)."""
    out: dict[str, str] = {}
    for key, attr in _COUNTERS:
        value = getattr(counts, attr)
        if value:
            out[key] = str(value)
    if counts.partitions:
        out["changed-partition-count"] = str(len(counts.partitions))
    for key, (plus, minus) in _TOTALS.items():
        if previous is None:
            base = 0
        elif key in previous:
            base = int(previous[key])
        else:
            continue
        total = base + sum(getattr(counts, a) for a in plus) - sum(getattr(counts, a) for a in minus)
        out[key] = str(total)
    out.update(extra)
    return out
