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
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from pyiceberg.typedef import Record
from pyroaring import BitMap64

from lakesink_datasource import __version__
from lakesink_datasource.commit.data_files import dv_data_file
from lakesink_datasource.commit.idempotency import snapshots_after
from lakesink_datasource.commit.manifests import (
    ManifestListWriter,
    read_entries,
    read_manifest_list,
    referenced_data_file,
    write_manifest,
)
from lakesink_datasource.commit.summary import ChangeCounts, build_summary
from lakesink_datasource.deletes.puffin import PuffinWriter
from lakesink_datasource.table.live_files import live_data_files, live_deletion_vectors, read_deletion_vector


def new_snapshot_id() -> int:
    # Positive 63-bit id from a random UUID, as Iceberg's reference implementation does.
    u = uuid.uuid4().int
    return ((u >> 64) ^ (u & 0xFFFF_FFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class PendingDeletes:
    """Positions to hide in one data file, before merging with the file's live DV."""

    spec_id: int
    partition: Record
    positions: BitMap64


@dataclass
class RowDelta:
    """What one commit changes. Data files and DVs are added; `replace_all` removes every
    live file first (overwrite); a DV added for a data file replaces that file's live DV.

    `position_deletes` are turned into DVs per attempt, merged with the live DV of their
    data file in that attempt's base, so a DV another writer added meanwhile is merged, not
    dropped. `added_delete_files` are ready-made DVs (they replace the file's live DV as is).
    """

    added_data_files: list[DataFile] = field(default_factory=list)
    added_delete_files: list[DataFile] = field(default_factory=list)
    position_deletes: dict[str, PendingDeletes] = field(default_factory=dict)
    replace_all: bool = False
    planned_snapshot_id: Optional[int] = None  # the state tasks resolved positions against
    # A snapshot is committed even without file changes when it must record something in
    # its summary (e.g. the tombstones of deletes of absent keys).
    record_only: bool = False

    @property
    def is_empty(self) -> bool:
        changes = self.added_data_files or self.added_delete_files or self.position_deletes or self.replace_all
        return not changes and not self.record_only

    def operation(self) -> Operation:
        if self.replace_all:
            return Operation.OVERWRITE
        if self.added_delete_files or self.position_deletes:
            return Operation.OVERWRITE if self.added_data_files else Operation.DELETE
        return Operation.APPEND


class ConflictError(RuntimeError):
    """The table changed underneath a batch in a way its deletes cannot be applied to."""


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

    def _carry_over(self, metadata: TableMetadata, counts: ChangeCounts, targets: set[str]) -> list[ManifestFile]:
        """The base's manifests as they stand after this delta's removals."""
        parent = metadata.current_snapshot()
        if parent is None:
            return []
        kept: list[ManifestFile] = []
        for manifest in read_manifest_list(self._io, parent.manifest_list):
            if not manifest.added_files_count and not manifest.existing_files_count:
                # Only DELETED entries, recorded by an earlier snapshot: nothing is live in
                # it any more, so later snapshots drop it (as Iceberg Java does).
                continue
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

    def _replaced_dv_targets(self, added_dvs: list[DataFile]) -> set[str]:
        """Data files whose live DV this commit replaces: every file it adds a DV for."""
        return {p for p in (referenced_data_file(f) for f in added_dvs) if p is not None}

    def _deletion_vectors(self, metadata: TableMetadata) -> tuple[list[DataFile], list[ManifestFile]]:
        """This attempt's DVs: pending positions merged with each file's live DV in the base,
        written into one Puffin file, plus the delete manifests that add them."""
        pending = self._delta.position_deletes
        if not pending:
            return [], []
        self._check_targets_still_live(metadata, set(pending))
        self._check_targets_exist(metadata, set(pending))
        live = live_deletion_vectors(self._io, metadata.current_snapshot())
        writer = PuffinWriter()
        merged: list[tuple[str, PendingDeletes, int]] = []
        for path in sorted(pending):
            positions = BitMap64(pending[path].positions)
            old = live.get(path)
            if old is not None:
                positions |= read_deletion_vector(self._io, old.data_file)
            merged.append((path, pending[path], len(positions)))
            writer.add_deletion_vector(path, positions)
        data = writer.finish(created_by=f"lakesink {__version__}")
        location = f"{self._data_dir(metadata)}/{self._commit_uuid}-{self._attempt}-deletes.puffin"
        with self._io.new_output(location).create(overwrite=True) as out:
            out.write(data)
        self._written[self._attempt].append(location)
        dvs = [
            dv_data_file(
                puffin_path=location, puffin_size=len(data), referenced_data_file=path, spec_id=deletes.spec_id,
                partition=deletes.partition, cardinality=cardinality, content_offset=ref.offset,
                content_size_in_bytes=ref.length,
            )
            for (path, deletes, cardinality), ref in zip(merged, writer.refs)
        ]
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for f in dvs:
            by_spec[f.spec_id].append(f)
        manifests = [
            write_manifest(
                self._io, self._manifest_location(), spec=metadata.specs()[spec_id], schema=metadata.schema(),
                snapshot_id=self.snapshot_id, format_version=metadata.format_version,
                content=ManifestContent.DELETES, added=files,
            )
            for spec_id, files in by_spec.items()
        ]
        return dvs, manifests

    def _check_targets_still_live(self, metadata: TableMetadata, targets: set[str]) -> None:
        """Fail when a data file this batch deletes from was removed after the batch was
        planned (a compaction moved its rows: the positions no longer mean those rows)."""
        added_here = {f.file_path for f in self._delta.added_data_files}
        # If the planned snapshot is no longer an ancestor, every snapshot is suspect.
        for snapshot in snapshots_after(metadata, self._delta.planned_snapshot_id)[0]:
            for manifest in read_manifest_list(self._io, snapshot.manifest_list):
                if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                    continue
                if not manifest.deleted_files_count:
                    continue
                for entry in read_entries(self._io, manifest, live_only=False):
                    path = entry.data_file.file_path
                    if entry.status == ManifestEntryStatus.DELETED and path in targets and path not in added_here:
                        raise ConflictError(
                            f"data file {path} was removed by snapshot {snapshot.snapshot_id} "
                            f"({snapshot.summary.operation.value if snapshot.summary else '?'}) after this batch was "
                            "planned; the batch must be replanned (restart the query: it replays the batch)"
                        )

    def _check_targets_exist(self, metadata: TableMetadata, targets: set[str]) -> None:
        """Every file a DV points at must be live in the base or added by this commit. A
        position in any other file means a task resolved a key against a row that never
        committed (a failed task attempt whose changes other tasks of the batch saw): the
        key's committed row would stay visible, so the batch must not land."""
        missing = targets - {f.file_path for f in self._delta.added_data_files}
        if missing:
            missing -= {e.data_file.file_path for e in live_data_files(self._io, metadata.current_snapshot())}
        if missing:
            raise ConflictError(
                f"this batch deletes rows of {len(missing)} data file(s) that are not in the table, e.g. "
                f"{sorted(missing)[0]}: a failed task attempt's rows were seen by other tasks of the batch; "
                "the batch is refused (restart the query: the replay resolves the keys again)"
            )

    @staticmethod
    def _data_dir(metadata: TableMetadata) -> str:
        return metadata.properties.get("write.data.path", f"{metadata.location.rstrip('/')}/data")

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
        dvs, dv_manifests = self._deletion_vectors(metadata)
        for f in self._delta.added_data_files + self._delta.added_delete_files + dvs:
            counts.add(f, self._partition_path(metadata, f))
        carried = self._carry_over(metadata, counts, self._replaced_dv_targets(self._delta.added_delete_files + dvs))
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
        writer.write(self._added_manifests + dv_manifests + carried)
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
