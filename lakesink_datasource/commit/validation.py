"""Conflict validation of a commit against the base it is about to land on.

The counterpart of Iceberg Java's `BaseRowDelta.validate` / `MergingSnapshotProducer`
checks: each rule is a named function, run by `SnapshotProducer.validate` on every attempt
(a lost race means a new base, so everything is checked again). A failed rule raises
`ConflictError`, which fails the write instead of retrying: the batch must be planned again
(a restarted streaming query replays it).
"""

from __future__ import annotations

from collections.abc import Iterable

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.iceberg.history import snapshots_after
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import read_entries


class ConflictError(RuntimeError):
    """The table changed underneath a write in a way its changes cannot be applied to."""


def validate_delete_targets_exist(
    io: FileIO, base: TableMetadata, targets: Iterable[str], added: Iterable[str], planned_snapshot_id: int | None
) -> None:
    """Every data file the commit hides rows of is live in the base or added by the commit
    (Java: `validateDataFilesExist`).

    A target missing from the base was either removed by a commit since the write was planned
    (a compaction moved its rows: the positions no longer mean those rows), or it never
    committed (a failed task attempt whose rows other tasks of the batch saw: the key's
    committed row would stay visible). Either way the write must not land.
    """
    missing = set(targets) - set(added)
    if not missing:
        return
    missing -= {e.data_file.file_path for e in live_data_files(io, base.current_snapshot())}
    if not missing:
        return
    example = sorted(missing)[0]
    remover = _removed_by(io, base, missing, planned_snapshot_id)
    if remover is not None:
        snapshot_id, operation = remover
        raise ConflictError(
            f"data file {example} was removed by snapshot {snapshot_id} ({operation}) after this batch was "
            "planned; the batch must be replanned (restart the query: it replays the batch)"
        )
    raise ConflictError(
        f"this batch deletes rows of {len(missing)} data file(s) that are not in the table, e.g. {example}: "
        "a failed task attempt's rows were seen by other tasks of the batch; the batch is refused "
        "(restart the query: the replay resolves the keys again)"
    )


def _removed_by(
    io: FileIO, base: TableMetadata, paths: set[str], since: int | None
) -> tuple[int, str] | None:
    """The snapshot after `since` that removed one of `paths`, if any (for the message)."""
    for snapshot in snapshots_after(base, since)[0]:
        for manifest in read_manifest_list(io, snapshot.manifest_list):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            if not manifest.deleted_files_count:
                continue
            for entry in read_entries(io, manifest, live_only=False):
                if entry.status == ManifestEntryStatus.DELETED and entry.data_file.file_path in paths:
                    operation = snapshot.summary.operation.value if snapshot.summary else "?"
                    return snapshot.snapshot_id, operation
    return None
