"""Produce one Iceberg snapshot (manifests, manifest list, summary) from a set of changes.

Modelled on Iceberg Java's split between SnapshotProducer/RowDelta (build a snapshot
against a base) and the commit (swap it in, retry on conflict): `produce()` can be
called again on a newer base after a lost race. Files that do not depend on the base
(the manifests of added files) are written once and reused by every attempt; what
depends on the base (rewritten manifests, the manifest list) is written per attempt.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Optional

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from lakesink_datasource.commit.manifests import (
    ManifestListWriter,
    read_entries,
    read_manifest_list,
    referenced_data_file,
    write_manifest,
)
from lakesink_datasource.commit.summary import ChangeCounts, build_summary


def new_snapshot_id() -> int:
    # Positive 63-bit id from a random UUID, as Iceberg's reference implementation does.
    u = uuid.uuid4().int
    return ((u >> 64) ^ (u & 0xFFFF_FFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class RowDelta:
    """What one commit changes. Data files and DVs are added; `replace_all` removes every
    live file first (overwrite); a DV added for a data file replaces that file's live DV."""

    added_data_files: list[DataFile] = field(default_factory=list)
    added_delete_files: list[DataFile] = field(default_factory=list)
    replace_all: bool = False

    @property
    def dv_targets(self) -> set[str]:
        return {p for p in (referenced_data_file(f) for f in self.added_delete_files) if p is not None}

    @property
    def is_empty(self) -> bool:
        return not self.added_data_files and not self.added_delete_files and not self.replace_all

    def operation(self) -> Operation:
        if self.replace_all:
            return Operation.OVERWRITE
        if self.added_delete_files:
            return Operation.OVERWRITE if self.added_data_files else Operation.DELETE
        return Operation.APPEND


class SnapshotProducer:
    def __init__(self, io: FileIO, metadata: TableMetadata, delta: RowDelta):
        self._io = io
        self._delta = delta
        self.snapshot_id = new_snapshot_id()
        self._commit_uuid = uuid.uuid4()
        self._metadata_dir = metadata.properties.get("write.metadata.path", f"{metadata.location.rstrip('/')}/metadata")
        self._manifest_count = 0
        self._added_manifests: Optional[list[ManifestFile]] = None
        # Metadata files by the attempt that wrote them (-1: the added-file manifests,
        # shared by every attempt), so a lost attempt's files can be removed.
        self._written: dict[int, list[str]] = defaultdict(list)
        self._attempt = -1

    def _manifest_location(self) -> str:
        self._manifest_count += 1
        location = f"{self._metadata_dir}/{self._commit_uuid}-m{self._manifest_count}.avro"
        self._written[self._attempt].append(location)
        return location

    def _write_added(self, metadata: TableMetadata) -> list[ManifestFile]:
        """One manifest per (content, spec) for the added files; independent of the base."""
        groups: dict[tuple[ManifestContent, int], list[DataFile]] = defaultdict(list)
        for f in self._delta.added_data_files:
            groups[(ManifestContent.DATA, f.spec_id)].append(f)
        for f in self._delta.added_delete_files:
            groups[(ManifestContent.DELETES, f.spec_id)].append(f)
        schema = metadata.schema()
        manifests = []
        for (content, spec_id), files in groups.items():
            manifests.append(
                write_manifest(
                    self._io,
                    self._manifest_location(),
                    spec=metadata.specs()[spec_id],
                    schema=schema,
                    snapshot_id=self.snapshot_id,
                    format_version=metadata.format_version,
                    content=content,
                    added=files,
                )
            )
        return manifests

    def _rewrite(
        self,
        metadata: TableMetadata,
        manifest: ManifestFile,
        existing: list[ManifestEntry],
        deleted: list[ManifestEntry],
    ) -> ManifestFile:
        return write_manifest(
            self._io,
            self._manifest_location(),
            spec=metadata.specs()[manifest.partition_spec_id],
            schema=metadata.schema(),
            snapshot_id=self.snapshot_id,
            format_version=metadata.format_version,
            content=manifest.content,
            existing=existing,
            deleted=deleted,
        )

    def _carry_over(self, metadata: TableMetadata, counts: ChangeCounts) -> list[ManifestFile]:
        """The base's manifests as they stand after this delta's removals."""
        parent = metadata.current_snapshot()
        if parent is None:
            return []
        targets = self._delta.dv_targets
        kept: list[ManifestFile] = []
        for manifest in read_manifest_list(self._io, parent.manifest_list):
            if self._delta.replace_all:
                live = read_entries(self._io, manifest)
                if live:
                    kept.append(self._rewrite(metadata, manifest, [], live))
                    for e in live:
                        counts.remove(e.data_file, self._partition_path(metadata, e.data_file))
                continue
            if manifest.content == ManifestContent.DELETES and targets:
                live = read_entries(self._io, manifest)
                replaced = [e for e in live if referenced_data_file(e.data_file) in targets]
                if replaced:
                    others = [e for e in live if referenced_data_file(e.data_file) not in targets]
                    kept.append(self._rewrite(metadata, manifest, others, replaced))
                    for e in replaced:
                        counts.remove(e.data_file, self._partition_path(metadata, e.data_file))
                    continue
            kept.append(manifest)
        return kept

    @staticmethod
    def _partition_path(metadata: TableMetadata, f: DataFile) -> str:
        return metadata.specs()[f.spec_id].partition_to_path(f.partition, metadata.schema())

    def produce(self, metadata: TableMetadata, attempt: int, extra_summary: Mapping[str, str]) -> Snapshot:
        """Build the snapshot against `metadata` (the current table state)."""
        if self._added_manifests is None:
            self._attempt = -1
            self._added_manifests = self._write_added(metadata)
        self._attempt = attempt
        counts = ChangeCounts()
        for f in self._delta.added_data_files + self._delta.added_delete_files:
            counts.add(f, self._partition_path(metadata, f))
        carried = self._carry_over(metadata, counts)
        parent = metadata.current_snapshot()
        sequence_number = metadata.last_sequence_number + 1
        first_row_id = (metadata.next_row_id or 0) if metadata.format_version >= 3 else None
        list_location = f"{self._metadata_dir}/snap-{self.snapshot_id}-{attempt}-{self._commit_uuid}.avro"
        self._written[attempt].append(list_location)
        writer = ManifestListWriter(
            self._io,
            list_location,
            format_version=metadata.format_version,
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=sequence_number,
            first_row_id=first_row_id,
        )
        writer.write(self._added_manifests + carried)
        previous = parent.summary.additional_properties if parent and parent.summary else None
        properties = build_summary(counts, previous if parent else None, extra_summary)
        return Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=sequence_number,
            timestamp_ms=int(time.time() * 1000),
            manifest_list=list_location,
            summary=Summary(self._delta.operation(), **properties),
            schema_id=metadata.current_schema_id,
            first_row_id=first_row_id,
            added_rows=writer.added_rows,
        )

    def cleanup(self, committed_attempt: Optional[int]) -> None:
        """Delete the metadata files no committed snapshot references: every attempt's
        but the committed one's (and the shared added manifests when nothing committed)."""
        for attempt, locations in self._written.items():
            keep = committed_attempt is not None and attempt in (-1, committed_attempt)
            if keep:
                continue
            for location in locations:
                try:
                    self._io.delete(location)
                except (FileNotFoundError, OSError):
                    pass
