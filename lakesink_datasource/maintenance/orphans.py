"""Orphan-file removal: files under the table's location that no snapshot references.

Orphans are what killed or failed writes leave behind (task files of a batch that never
committed, a compaction's output whose commit was refused while its process died, a
Puffin file of a lost commit attempt) and old metadata files nobody deleted. A file is
only removed when it is older than a safety age (default 3 days,
`lakesink.maintenance.orphan-min-age-ms`): a write in flight has files no snapshot
references *yet*.

Referenced means: the metadata files in the log, and for every snapshot its manifest
list, manifests, every file its manifests name (deleted entries included: an older
snapshot may still read them) and the tombstone and deleted-key files named in its summary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyiceberg.io import FileIO
from pyiceberg.table import Table

from lakesink_datasource.commit.cleanup import delete_files
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.gc import refuse_deleting
from lakesink_datasource.iceberg.listing import list_files
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import read_entries
from lakesink_datasource.iceberg.summary_keys import DELETED_KEYS, REDECIDED_KEYS, TOMBSTONES
from lakesink_datasource.index.published import kept_files
from lakesink_datasource.table.location_guard import table_uuid_of


@dataclass
class OrphanScan:
    orphans: list[str] = field(default_factory=list)  # old enough, and removed unless a dry run
    too_young: int = 0  # unreferenced but younger than the safety age: kept
    scanned: int = 0
    orphan_bytes: int = 0

    def describe(self, dry_run: bool) -> str:
        verb = "would remove" if dry_run else "removed"
        return (
            f"{verb} {len(self.orphans)} orphan file(s) ({self.orphan_bytes:,} bytes) of {self.scanned} scanned; "
            f"{self.too_young} unreferenced file(s) younger than the safety age kept"
        )


def normalize(path: str) -> str:
    """A comparable form of a location: `file:/x`, `file:///x` and `/x` are one file."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return parsed.path
    return f"{parsed.scheme}://{parsed.netloc}{parsed.path}"


def referenced_files(io: FileIO, table: Table) -> set[str]:
    metadata = table.metadata
    out = {normalize(table.metadata_location)} | {normalize(e.metadata_file) for e in metadata.metadata_log}
    seen_manifests: set[str] = set()
    for snapshot in metadata.snapshots:
        out.add(normalize(snapshot.manifest_list))
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        out |= {normalize(p) for key in (TOMBSTONES, DELETED_KEYS, REDECIDED_KEYS) for p in props.get(key, "").split(",") if p}
        for manifest in read_manifest_list(io, snapshot.manifest_list):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            out.add(normalize(manifest.manifest_path))
            out |= {normalize(e.data_file.file_path) for e in read_entries(io, manifest, live_only=False)}
    for stats in [*metadata.statistics, *metadata.partition_statistics]:
        out.add(normalize(stats.statistics_path))
    # The key index copies a cold host starts from (a cache no metadata references): the
    # ones publishing keeps are not orphans.
    out |= {normalize(p) for p in kept_files(io, metadata)}
    return out


class LocationShared(LakesinkError, RuntimeError):
    """The table's location holds another table's metadata: nothing is removed."""


def remove_orphans(
    table: Table, *, min_age_ms: int, dry_run: bool = False, now_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> OrphanScan:
    """Find (and unless `dry_run`, delete) the table's orphan files older than `min_age_ms`.
    Lists through the table's own FileIO (its store's endpoint and credentials). Refuses
    (LocationShared, nothing removed) when the location holds another table's metadata:
    that table's files are not this table's orphans; and (GcDisabled) on a table with
    gc.enabled=false, whose location may hold files another table references."""
    refuse_deleting(table.metadata.properties, ".".join(table.name()), "remove orphan files")
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    referenced = referenced_files(table.io, table)
    scan = OrphanScan()
    location = table.metadata.location
    if urlparse(location).scheme == "" and not location.startswith("/"):
        raise ValueError(f"table location {location!r} is not absolute")
    unreferenced_metadata = []
    for listed in list_files(table.io, location):
        scan.scanned += 1
        if progress is not None:
            progress(1)
        if normalize(listed.path) in referenced:
            continue
        if listed.path.endswith(".metadata.json"):
            unreferenced_metadata.append(listed.path)
        if now_ms - listed.mtime_ms < min_age_ms:
            scan.too_young += 1
            continue
        scan.orphans.append(listed.path)
        scan.orphan_bytes += listed.size
    own = str(table.metadata.table_uuid)
    foreign = [(path, owner) for path in unreferenced_metadata if (owner := table_uuid_of(table.io, path)) != own]
    if foreign:
        path, owner = foreign[-1]
        raise LocationShared(
            f"the location {location} of table {'.'.join(table.name())} holds the metadata of "
            f"{'another table (uuid ' + owner + ')' if owner else 'something that is not this table'}: {path}"
            f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}. Removing orphans would delete that table's "
            "files; nothing was removed. Register that table back (python -m lakesink_datasource.maintain register) "
            "and give the tables distinct locations, or delete its files if it is gone on purpose"
        )
    if not dry_run and scan.orphans:
        delete_files(table.io, scan.orphans)
    return scan
