"""Manifest merging on commit, with Iceberg Java's rules (`ManifestMergeManager`).

Without it every commit adds a manifest and nothing ever removes one, so a stream's manifest
list (and everything that reads it per commit) grows without bound. Per content (data,
deletes) and partition spec, the manifests are packed, newest last, into bins of up to
`commit.manifest.target-size-bytes` (filled from the oldest end, so the newest manifests
share the last, partial bin). A bin of one manifest stays as it is; the bin holding this
commit's new manifests is merged only once it has `commit.manifest.min-count-to-merge`
manifests; every other bin of several manifests is merged into one. A stream therefore
carries at most about min-count small manifests plus its full-size ones.

Merging keeps every live entry (this commit's additions as ADDED, the rest as EXISTING with
their sequence numbers and row ids explicit), keeps this commit's DELETED entries and drops
older DELETED ones, as Java does.
"""

from __future__ import annotations

from collections.abc import Callable

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile

from lakesink_datasource.iceberg.manifests import read_entries
from lakesink_datasource.iceberg.properties import TableSettings

# (spec id, content, added, existing, deleted) -> the written manifest
WriteMerged = Callable[[int, ManifestContent, list[ManifestEntry], list[ManifestEntry], list[ManifestEntry]], ManifestFile]


def pack_end(manifests: list[ManifestFile], target_bytes: int) -> list[list[ManifestFile]]:
    """Bins of consecutive manifests up to `target_bytes`, filled from the end of the list
    (Java's `ListPacker.packEnd` with lookback 1); order is kept."""
    bins: list[list[ManifestFile]] = []
    current: list[ManifestFile] = []
    weight = 0
    for manifest in reversed(manifests):
        if current and weight + manifest.manifest_length > target_bytes:
            bins.append(current)
            current, weight = [], 0
        current.append(manifest)
        weight += manifest.manifest_length
    if current:
        bins.append(current)
    return [list(reversed(b)) for b in reversed(bins)]


def merge_manifests(
    io: FileIO,
    manifests: list[ManifestFile],
    new_paths: set[str],
    snapshot_id: int,
    settings: TableSettings,
    write_merged: WriteMerged,
) -> list[ManifestFile]:
    """The manifest list after merging (data manifests first, then delete manifests, each
    group keeping its order). `new_paths`: manifests this commit wrote."""
    if not settings.manifest_merge_enabled:
        return manifests
    out: list[ManifestFile] = []
    for content in (ManifestContent.DATA, ManifestContent.DELETES):
        by_spec: dict[int, list[ManifestFile]] = {}
        for manifest in manifests:
            if manifest.content == content:
                by_spec.setdefault(manifest.partition_spec_id, []).append(manifest)
        for spec_id, group in by_spec.items():
            # Newest last, as Java packs them: this commit's manifests come first in the
            # list, so they go to the end here.
            ordered = [m for m in group if m.manifest_path not in new_paths][::-1] + [
                m for m in group if m.manifest_path in new_paths
            ]
            merged: list[ManifestFile] = []
            for bin_ in pack_end(ordered, settings.manifest_target_size_bytes):
                fresh = any(m.manifest_path in new_paths for m in bin_)
                if len(bin_) == 1 or (fresh and len(bin_) < settings.manifest_min_merge_count):
                    merged.extend(bin_)
                else:
                    merged.append(_merge(io, bin_, spec_id, content, snapshot_id, write_merged))
            out.extend(reversed(merged))  # the list itself stays newest first
    return out


def _merge(
    io: FileIO, bin_: list[ManifestFile], spec_id: int, content: ManifestContent, snapshot_id: int, write_merged: WriteMerged
) -> ManifestFile:
    added: list[ManifestEntry] = []
    existing: list[ManifestEntry] = []
    deleted: list[ManifestEntry] = []
    for manifest in bin_:
        for entry in read_entries(io, manifest, live_only=False):
            if entry.status == ManifestEntryStatus.DELETED:
                if entry.snapshot_id == snapshot_id:
                    deleted.append(entry)  # removed by this commit: recorded once more
            elif entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot_id:
                added.append(entry)
            else:
                existing.append(entry)
    return write_merged(spec_id, content, added, existing, deleted)
