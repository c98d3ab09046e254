"""Conflict validation of a commit against the base it is about to land on.

The counterpart of Iceberg Java's `BaseRowDelta.validate` / `MergingSnapshotProducer`
checks: each rule is a named function, run by `SnapshotProducer.validate` on every attempt
(a lost race means a new base, so everything is checked again). A failed rule raises
`ConflictError`, which fails the write instead of retrying: the batch must be planned again
(a restarted streaming query replays it).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.history import snapshots_after
from lakesink_datasource.iceberg.live_files import data_entries_changed_by, live_data_files, live_position_deletes
from lakesink_datasource.iceberg.manifests import content_offset


class ConflictKind(enum.Enum):
    """Every way the table can change underneath a write so that the write cannot land. The
    rules are checked here, except the two that belong to a schema or spec update and are
    raised where that update is built (commit/schema_update.py, commit/spec_update.py)."""

    # A keyed batch hides rows of a data file that a later commit removed (a compaction whose
    # moves the rebase could not follow, an overwrite, another engine's delete).
    DELETE_TARGET_REMOVED = "delete-target-removed"
    # A keyed batch hides rows of a data file no commit ever added (a failed task attempt's
    # file whose rows other tasks saw).
    DELETE_TARGET_NEVER_COMMITTED = "delete-target-never-committed"
    # A compaction's input was removed since it was read.
    REWRITE_INPUT_REMOVED = "rewrite-input-removed"
    # A compaction's input got new deletes since it was read.
    REWRITE_INPUT_NEW_DELETES = "rewrite-input-new-deletes"
    # Another commit since the keyed batch was planned wrote a row for a key the batch changed,
    # in a way the commit cannot decide itself (commit/key_conflicts.py: equality deletes, a
    # cdc sequence the table does not store); the keys it can decide, it decides.
    KEY_WRITTEN_CONCURRENTLY = "key-written-concurrently"
    # A column the batch wrote changed type in the table in a way the two cannot share.
    COLUMN_TYPE_CHANGED = "column-type-changed"
    # The partition spec the batch's files were written with was removed from the table.
    SPEC_REMOVED = "spec-removed"


class ConflictError(LakesinkError, RuntimeError):
    """The table changed underneath a write in a way its changes cannot be applied to;
    `kind` says which rule refused it (callers match on it, not on the message)."""

    def __init__(self, kind: ConflictKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[type[ConflictError], tuple[ConflictKind, str]]:
        # Crosses processes intact (Spark pickles errors of its Python workers).
        return (type(self), (self.kind, str(self)))


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
            ConflictKind.DELETE_TARGET_REMOVED,
            f"data file {example} was removed by snapshot {snapshot_id} ({operation}) after this batch was "
            "planned; the batch must be replanned (restart the query: it replays the batch)"
        )
    raise ConflictError(
        ConflictKind.DELETE_TARGET_NEVER_COMMITTED,
        f"this batch deletes rows of {len(missing)} data file(s) that are not in the table, e.g. {example}: "
        "a failed task attempt's rows were seen by other tasks of the batch; the batch is refused "
        "(restart the query: the replay resolves the keys again)"
    )


def validate_rewritten_files_unchanged(
    io: FileIO, base: TableMetadata, rewritten: Mapping[str, tuple[str, int | None] | None]
) -> None:
    """Every data file a compaction replaces is still live in the base, with the very DV it
    had when its rows were read (Java: `validateDeletedFiles` + `validateNoNewDeletesForDataFiles`).

    Otherwise a row deleted since the read would come back in the rewritten file, or the
    rewrite would drop rows another commit already moved.
    """
    snapshot = base.current_snapshot()
    live = {e.data_file.file_path for e in live_data_files(io, snapshot)}
    gone = sorted(set(rewritten) - live)
    if gone:
        raise ConflictError(ConflictKind.REWRITE_INPUT_REMOVED, f"data file {gone[0]} (and {len(gone) - 1} more) to be rewritten was removed concurrently")
    dvs = live_position_deletes(io, snapshot)
    for path, read_with in rewritten.items():
        entry = dvs.get(path)
        now = None if entry is None else (entry.data_file.file_path, content_offset(entry.data_file))
        if now != read_with:
            raise ConflictError(ConflictKind.REWRITE_INPUT_NEW_DELETES, f"data file {path} got new deletes concurrently; its rewrite is out of date")


def validate_no_new_equality_deletes(base: TableMetadata, since: int | None) -> None:
    """No snapshot after `since` (the state a compaction read) added equality deletes.

    A compaction's new files get the sequence number of its own snapshot, so an equality
    delete committed between the read and the commit would no longer apply to the rows it
    meant to delete (Java keeps the starting sequence number for these; lakesink refuses)."""
    snapshots, _found = snapshots_after(base, since)
    for snapshot in snapshots:
        added = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if int(added.get("added-equality-delete-files", 0) or 0) > 0:
            raise ConflictError(
                ConflictKind.REWRITE_INPUT_NEW_DELETES,
                f"snapshot {snapshot.snapshot_id} added equality deletes after the rewrite read its files; its rewrite is out of date",
            )


def _removed_by(
    io: FileIO, base: TableMetadata, paths: set[str], since: int | None
) -> tuple[int, str] | None:
    """The snapshot after `since` that removed one of `paths`, if any (for the message)."""
    for snapshot in snapshots_after(base, since)[0]:
        if any(e.data_file.file_path in paths for e in data_entries_changed_by(io, snapshot, ManifestEntryStatus.DELETED)):
            return snapshot.snapshot_id, snapshot.summary.operation.value if snapshot.summary else "?"
    return None
