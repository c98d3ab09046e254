"""Snapshot expiry: which snapshots to drop, and which files only they referenced.

Retention follows Iceberg's `expire_snapshots` for the main branch: the newest
`min_snapshots_to_keep` ancestors of main are kept, and so is every ancestor younger than
`max_snapshot_age_ms`. Snapshots of other refs (branches, tags) and their ancestors are
kept; snapshots no ref reaches (rolled back, abandoned) expire once older than the age.

Files to delete after an expiry are exactly those referenced by expired snapshots and by no
retained one: manifest lists, manifests, data files and delete files (a Puffin file only
when none of its DVs is still live). Two ways to find them, with the same result:

* incremental, when history is linear (every snapshot an ancestor of main, no other ref):
  a file removed from the table never comes back, so a data or delete file is unreachable
  exactly when a snapshot whose parent expired removed it (a DELETED entry in a manifest that
  snapshot added), and a manifest exactly when an expired list names it and the oldest
  retained list does not. Cost: the expired snapshots' own manifest lists and the manifests
  their children added, not the whole table;
* by reachability otherwise: everything the retained snapshots reference is read and
  subtracted from what the expired ones referenced.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus, ManifestFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.iceberg.history import ancestors, is_linear
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import read_entries


def snapshots_to_expire(
    metadata: TableMetadata, now_ms: int, max_age_ms: int, min_to_keep: int, adds_head: bool = False
) -> list[int]:
    """Ids of the snapshots an expiry at `now_ms` removes. `adds_head`: the same commit makes
    a new snapshot main's head (it counts as the newest retained one)."""
    cutoff = now_ms - max_age_ms
    keep: set[int] = set()
    main = list(ancestors(metadata))
    budget = min_to_keep - (1 if adds_head else 0)
    for i, snapshot in enumerate(main):
        if i < budget or snapshot.timestamp_ms >= cutoff:
            keep.add(snapshot.snapshot_id)
    if not adds_head and main:
        keep.add(main[0].snapshot_id)  # never the current snapshot
    for name, ref in metadata.refs.items():
        if name == "main":
            continue
        keep.add(ref.snapshot_id)
        if ref.snapshot_ref_type.value == "branch":
            keep |= {s.snapshot_id for s in ancestors(metadata, ref.snapshot_id)}
    on_main = {s.snapshot_id for s in main}
    return [
        s.snapshot_id
        for s in metadata.snapshots
        if s.snapshot_id not in keep and (s.snapshot_id in on_main or s.timestamp_ms < cutoff)
    ]


@dataclass
class Unreachable:
    """Files only expired snapshots referenced, by kind."""

    manifest_lists: list[str] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    data_files: list[str] = field(default_factory=list)
    delete_files: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return self.data_files + self.delete_files + self.manifests + self.manifest_lists

    def __len__(self) -> int:
        return len(self.all())


def unreachable_files(
    io: FileIO, before: TableMetadata, expired_ids: Iterable[int], new_head: Snapshot | None = None
) -> Unreachable:
    """Files that expiring `expired_ids` from `before` leaves unreferenced. `new_head`: the
    snapshot the same commit added (retained; its parent id as written, which pyiceberg's
    expiry clears in the committed metadata when the parent expires)."""
    expired_set = set(expired_ids)
    snapshots = list(before.snapshots) + ([new_head] if new_head is not None else [])
    expired = [s for s in snapshots if s.snapshot_id in expired_set]
    retained = [s for s in snapshots if s.snapshot_id not in expired_set]
    if not expired:
        return Unreachable()
    if is_linear(before) and retained:
        return _incremental(io, snapshots, expired, retained, expired_set)
    return _by_reachability(io, expired, retained)


def _lists(io: FileIO, snapshots: Iterable[Snapshot]) -> dict[int, list[ManifestFile]]:
    return {s.snapshot_id: read_manifest_list(io, s.manifest_list) for s in snapshots}


def _incremental(
    io: FileIO, snapshots: list[Snapshot], expired: list[Snapshot], retained: list[Snapshot], expired_ids: set[int]
) -> Unreachable:
    out = Unreachable(manifest_lists=[s.manifest_list for s in expired])
    oldest_retained = min(retained, key=lambda s: s.sequence_number or 0)
    retained_manifests = {m.manifest_path for m in read_manifest_list(io, oldest_retained.manifest_list)}
    expired_lists = _lists(io, expired)
    out.manifests = sorted({m.manifest_path for ms in expired_lists.values() for m in ms} - retained_manifests)
    # Snapshots whose parent expires: what they removed was live only in expired snapshots.
    removers = [s for s in snapshots if s.parent_snapshot_id in expired_ids]
    puffin_candidates: set[str] = set()
    data: set[str] = set()
    for snapshot in removers:
        manifests = expired_lists.get(snapshot.snapshot_id) or read_manifest_list(io, snapshot.manifest_list)
        for manifest in manifests:
            if manifest.added_snapshot_id != snapshot.snapshot_id or not manifest.deleted_files_count:
                continue
            for entry in read_entries(io, manifest, live_only=False):
                if entry.status != ManifestEntryStatus.DELETED:
                    continue
                if entry.data_file.content == DataFileContent.DATA:
                    data.add(entry.data_file.file_path)
                else:
                    puffin_candidates.add(entry.data_file.file_path)
    out.data_files = sorted(data)
    if puffin_candidates:
        # Several DVs share a Puffin file: it goes only when none of them is live any more.
        live = _live_delete_paths(io, retained)
        out.delete_files = sorted(puffin_candidates - live)
    return out


_LIVE_DELETES_CACHE_MAX = 4096
_live_deletes: OrderedDict[str, frozenset[str]] = OrderedDict()  # manifest list -> live delete files
_live_deletes_lock = threading.Lock()


def _snapshot_live_deletes(io: FileIO, snapshot: Snapshot) -> frozenset[str]:
    """The delete files live in `snapshot`: fixed for a snapshot, so remembered per manifest
    list. A stream expires one snapshot per batch against a window of retained ones; each
    is read once in its life instead of once per batch."""
    with _live_deletes_lock:
        found = _live_deletes.get(snapshot.manifest_list)
        if found is not None:
            _live_deletes.move_to_end(snapshot.manifest_list)
            return found
    found = frozenset(
        e.data_file.file_path
        for m in read_manifest_list(io, snapshot.manifest_list)
        if m.content == ManifestContent.DELETES
        for e in read_entries(io, m)
    )
    with _live_deletes_lock:
        _live_deletes[snapshot.manifest_list] = found
        while len(_live_deletes) > _LIVE_DELETES_CACHE_MAX:
            _live_deletes.popitem(last=False)
    return found


def _live_delete_paths(io: FileIO, snapshots: Iterable[Snapshot]) -> set[str]:
    return set().union(*(_snapshot_live_deletes(io, s) for s in snapshots))


def _referenced(io: FileIO, snapshots: Iterable[Snapshot]) -> tuple[set[str], set[str], set[str], set[str]]:
    """(manifest lists, manifests, data files, delete files) live in `snapshots`."""
    lists: set[str] = set()
    manifests: set[str] = set()
    data: set[str] = set()
    deletes: set[str] = set()
    for snapshot in snapshots:
        lists.add(snapshot.manifest_list)
        for manifest in read_manifest_list(io, snapshot.manifest_list):
            manifests.add(manifest.manifest_path)
            for entry in read_entries(io, manifest):
                (data if entry.data_file.content == DataFileContent.DATA else deletes).add(entry.data_file.file_path)
    return lists, manifests, data, deletes


def _by_reachability(io: FileIO, expired: list[Snapshot], retained: list[Snapshot]) -> Unreachable:
    gone = _referenced(io, expired)
    kept = _referenced(io, retained)
    lists, manifests, data, deletes = (sorted(g - k) for g, k in zip(gone, kept))
    return Unreachable(manifest_lists=lists, manifests=manifests, data_files=data, delete_files=deletes)
