"""Deleting files a commit made unreferenced: old metadata files and expired snapshots' files.

Runs after a commit landed, never before: a file is only deleted once the table no longer
references it. A deletion that fails (or a process killed halfway) leaves an orphan, which
orphan-file removal collects later; nothing here can damage the table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.iceberg.expiry import Unreachable, unreachable_files
from lakesink_datasource.iceberg.properties import TableSettings

log = logging.getLogger("lakesink")


def delete_files(io: FileIO, paths: Iterable[str]) -> int:
    """Delete `paths`, best effort; returns how many were deleted (missing ones count as done)."""
    deleted = 0
    for path in paths:
        try:
            io.delete(path)
            deleted += 1
        except FileNotFoundError:
            deleted += 1
        except OSError as exc:
            log.warning("lakesink: could not delete %s (%s); orphan-file removal will retry", path, exc)
    return deleted


def dropped_metadata_files(base: TableMetadata, base_location: str, new: TableMetadata) -> list[str]:
    """Metadata files the commit from `base` to `new` dropped from the metadata log, when the
    table asks for them to be deleted (`write.metadata.delete-after-commit.enabled`)."""
    if not TableSettings.of_table(new).metadata_delete_after_commit:
        return []
    before = {entry.metadata_file for entry in base.metadata_log} | {base_location}
    kept = {entry.metadata_file for entry in new.metadata_log}
    return sorted(before - kept - {base_location})


def expire(io: FileIO, before: TableMetadata, expired_ids: list[int], new_head: Snapshot | None = None) -> Unreachable:
    """Delete the files only the expired snapshots referenced; returns what was deleted."""
    gone = unreachable_files(io, before, expired_ids, new_head)
    delete_files(io, gone.all())
    return gone
