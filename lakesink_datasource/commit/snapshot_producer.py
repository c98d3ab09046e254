"""Produce one Iceberg snapshot (manifests, manifest list, summary) from a set of changes.

Modelled on Iceberg Java's split between snapshot production (`SnapshotProducer`,
`BaseRowDelta`) and the commit that swaps it in: `produce()` builds a snapshot against a
base and can run again on a newer base after a lost race. It reads as four steps:

1. validate: the named conflict checks of `validation.py` against this base, after the
   batch's deletes are moved onto the files of compactions committed meanwhile (`rebase.py`);
   then the keys a keyed batch shares with commits since it was planned are decided
   (`key_conflicts.py`);
2. deletes: pending positions (and those the decision hides) merged with the base's DVs into
   new DVs (`deletion_vectors.py`);
3. carry-over: the base's manifests as they stand after this commit's removals, then merged
   with Java's rules (`manifest_merge.py`) so their number stays bounded;
4. manifest list: new and carried manifests, row ids assigned, plus the summary.

Files that do not depend on the base (the manifests of added data files) are written once
and reused by every attempt; what depends on the base is written per attempt, and the
files of attempts that did not commit are deleted by `cleanup`.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from lakesink_datasource.commit.deletion_vectors import PendingDeletes, write_deletion_vectors, write_position_delete_files
from lakesink_datasource.commit.key_conflicts import KeyRules, Redecision, redecide
from lakesink_datasource.commit.manifest_merge import merge_manifests
from lakesink_datasource.commit.overwrite import OverwriteScope, Replaced, replaced_by
from lakesink_datasource.commit.rebase import Rebased, rebase_onto_compactions
from lakesink_datasource.commit.validation import validate_delete_targets_exist, validate_rewritten_files_unchanged
from lakesink_datasource.iceberg.history import branch_head
from lakesink_datasource.iceberg.live_files import live_position_deletes
from lakesink_datasource.iceberg.manifest_list import ManifestListWriter, read_manifest_list
from lakesink_datasource.iceberg.manifests import deleted_data_file, read_entries, write_manifest
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.summary import ChangeCounts, build_summary
from lakesink_datasource.iceberg.summary_keys import KEYS_REDECIDED, MOVED_DELETES, REDECIDED_KEYS
from lakesink_datasource.iceberg.table_metadata import last_sequence_number, next_row_id
from lakesink_datasource.index.key_columns import TOMBSTONE_DIR
from lakesink_datasource.version import __version__


def new_snapshot_id() -> int:
    # Positive 63-bit id from a random UUID, as Iceberg's reference implementation does.
    u = uuid.uuid4().int
    return ((u >> 64) ^ (u & 0xFFFF_FFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class RowDelta:
    """What one commit changes: data files added, row positions hidden (turned into DVs
    merged with each file's live DV in the attempt's base), data files removed with their
    DVs (a compaction: `rewritten`), or, with `overwrite`, what its scope replaces removed
    first (`overwrite.py`)."""

    added_data_files: list[DataFile] = field(default_factory=list)
    position_deletes: dict[str, PendingDeletes] = field(default_factory=dict)
    overwrite: OverwriteScope | None = None
    planned_snapshot_id: int | None = None  # the state tasks resolved positions against
    # A snapshot is committed even without file changes when it must record something in
    # its summary (e.g. the tombstones of deletes of absent keys).
    record_only: bool = False
    # Data files this commit removes, each with the DV (Puffin path and offset) it had when
    # the rewrite read it, None for none: the rows were rewritten from exactly that state.
    rewritten: Mapping[str, tuple[str, int | None] | None] = field(default_factory=dict)
    # Keyed writes: hashes of the keys the batch changed, the table's key columns and how the
    # batch decides a key, so keys that concurrent commits also wrote are decided at commit.
    touched_keys: np.ndarray | None = None
    key_columns: tuple[str, ...] = ()
    key_rules: KeyRules | None = None

    @property
    def is_empty(self) -> bool:
        # A dynamic overwrite that writes no rows replaces no partition: it changes nothing.
        replaces = self.overwrite is not None and (self.overwrite.kind != "partitions" or bool(self.added_data_files))
        changes = self.added_data_files or self.position_deletes or replaces or self.rewritten
        return not changes and not self.record_only

    def operation(self) -> Operation:
        if self.overwrite is not None:
            return Operation.OVERWRITE
        if self.rewritten and not self.position_deletes:
            return Operation.REPLACE
        if self.position_deletes:
            return Operation.OVERWRITE if self.added_data_files else Operation.DELETE
        return Operation.APPEND


@dataclass
class _Attempt:
    """What one produce() call built against its base, for the summary and the log."""

    counts: ChangeCounts = field(default_factory=ChangeCounts)
    deletion_vectors: list[DataFile] = field(default_factory=list)  # DVs, or v2 position-delete files
    rebased: Rebased | None = None  # the delta's deletes as they apply to this base
    redecision: Redecision | None = None  # keys shared with commits since the batch was planned
    replaced: Replaced | None = None  # what the delta's overwrite replaces in this base


class SnapshotProducer:
    def __init__(
        self, io: FileIO, metadata: TableMetadata, delta: RowDelta, branch: str | None = None,
        settings: TableSettings | None = None,
    ):
        """`settings`: the table's settings as the write sees them (its `property.<key>`
        options over the table's properties: they land with this commit and govern it);
        default: the table's own."""
        self._io = io
        self._delta = delta
        self.branch = branch  # None: main
        self.snapshot_id = new_snapshot_id()
        self._commit_uuid = uuid.uuid4()
        self._settings = settings = settings or TableSettings.of_table(metadata)
        self._metadata_dir = settings.metadata_path
        self._data_dir = settings.data_path
        self._avro_codec = settings.avro_codec
        self._manifest_count = 0
        self._added_manifests: list[ManifestFile] | None = None
        # Metadata files by the attempt that wrote them (-1: the added-file manifests,
        # shared by every attempt), so a lost attempt's files can be removed.
        self._written: dict[int, list[str]] = defaultdict(list)
        # The manifests each attempt's manifest list names: a shared added manifest that an
        # attempt merged into a bigger one is named by none once that attempt commits.
        self._listed: dict[int, set[str]] = {}
        self._attempt = -1
        self.last: _Attempt = _Attempt()
        self._schema: Schema = metadata.schema()

    # -- the template ---------------------------------------------------------------------

    def produce(
        self, base: TableMetadata, attempt: int, extra_summary: Mapping[str, str], schema: Schema | None = None
    ) -> Snapshot:
        """Build the snapshot against `base` (the table's current state). `schema`: the schema
        current after this commit when it changes it (merge_schema), else the base's."""
        self._schema = schema or base.schema()
        if self._added_manifests is None:
            self._attempt = -1
            self._added_manifests = self._write_added(base)
        self._attempt = attempt
        self.last = state = _Attempt(rebased=self._rebase(base))
        self.validate(base, state.rebased)
        state.redecision = self._redecide(base, state.rebased)
        if self._delta.overwrite is not None:
            state.replaced = replaced_by(self._io, base, self._parent(base), self._delta.overwrite, self._delta.added_data_files)
        dv_manifests = self._deletes(base, state)
        for f in self._delta.added_data_files + state.deletion_vectors:
            state.counts.add(f, self._partition_path(base, f))
        rebased = state.rebased
        if rebased is not None and rebased.moved_files:
            extra_summary = {**extra_summary, MOVED_DELETES: f"{rebased.by_row_id},{rebased.by_key},{rebased.gone}"}
        if state.redecision is not None and state.redecision.outcome is not None:
            location = self._write_outcome(state.redecision.outcome)
            extra_summary = {**extra_summary, KEYS_REDECIDED: str(state.redecision.keys), REDECIDED_KEYS: location}
        removed_files = set(self._delta.rewritten) | (state.replaced.data_files if state.replaced else set())
        dropped_dvs = self._replaced_dv_targets(state.deletion_vectors) | removed_files
        carried = self._carry_over(base, state, dropped_dvs, removed_files)
        manifests = merge_manifests(
            self._io,
            self._added_manifests + dv_manifests + carried,
            new_paths=set(self._written[-1]) | set(self._written[attempt]),
            snapshot_id=self.snapshot_id,
            settings=self._settings,
            write_merged=lambda spec_id, content, added, existing, deleted: self._write_merged(base, spec_id, content, added, existing, deleted),
        )
        self._listed[attempt] = {m.manifest_path for m in manifests}
        return self._snapshot(base, attempt, manifests, state.counts, extra_summary)

    def _parent(self, base: TableMetadata) -> Snapshot | None:
        return branch_head(base, self.branch)

    def _rebase(self, base: TableMetadata) -> Rebased | None:
        """The delta's deletes as they apply to `base`: moved onto the files that compactions
        committed since the write was planned rewrote their targets into."""
        if not self._delta.position_deletes:
            return None
        return rebase_onto_compactions(
            self._io,
            base,
            self._delta.position_deletes,
            added=(f.file_path for f in self._delta.added_data_files),
            planned_snapshot_id=self._delta.planned_snapshot_id,
            key_columns=self._delta.key_columns,
        )

    def validate(self, base: TableMetadata, rebased: Rebased | None) -> None:
        """The conflict checks this commit needs against `base` (Java's `validate`); changes
        nothing, raises ConflictError with its kind (commit/validation.py lists them)."""
        if rebased is not None:
            # The rebase already compared the targets with the base's live files: only those
            # still missing are left to check (and to name the snapshot that removed them).
            validate_delete_targets_exist(
                self._io, base, targets=rebased.missing, added=(), planned_snapshot_id=self._delta.planned_snapshot_id
            )
        if self._delta.rewritten:
            validate_rewritten_files_unchanged(self._io, base, self._delta.rewritten)

    def _redecide(self, base: TableMetadata, rebased: Rebased | None) -> Redecision | None:
        """The keys this keyed batch shares with commits since it was planned, decided as the
        later writer (commit/key_conflicts.py); None for other writes."""
        delta = self._delta
        if delta.touched_keys is None or delta.key_rules is None:
            return None
        return redecide(
            self._io, base, delta.planned_snapshot_id, delta.touched_keys, delta.key_rules, delta.added_data_files,
            rebased.pending if rebased is not None else delta.position_deletes,
        )

    def _write_outcome(self, outcome: pa.Table) -> str:
        """The decided keys' outcome, for every host's key index to apply (index/follow_changes.py)."""
        location = f"{self._data_dir}/{TOMBSTONE_DIR}/{self._commit_uuid}-{self._attempt}-redecided-keys.parquet"
        self._written[self._attempt].append(location)
        with self._io.new_output(location).create(overwrite=True) as out:
            pq.write_table(outcome, out, compression="zstd")
        return location

    # -- step 2: deletes ------------------------------------------------------------------

    def _deletes(self, base: TableMetadata, state: _Attempt) -> list[ManifestFile]:
        """This attempt's DVs (pending positions merged with the base's) and the delete
        manifests that add them."""
        pending = dict(state.rebased.pending if state.rebased is not None else self._delta.position_deletes)
        if state.redecision is not None:
            for path, hidden in state.redecision.hide.items():
                mine = pending.get(path)
                pending[path] = hidden if mine is None else PendingDeletes(mine.spec_id, mine.partition, mine.positions | hidden.positions)
            for path, kept in state.redecision.keep.items():
                mine = pending.get(path)
                if mine is not None:
                    left = mine.positions - kept
                    if left:
                        pending[path] = PendingDeletes(mine.spec_id, mine.partition, left)
                    else:
                        del pending[path]
        for path, hidden in (state.replaced.hidden if state.replaced is not None else {}).items():
            mine = pending.get(path)
            pending[path] = hidden if mine is None else PendingDeletes(mine.spec_id, mine.partition, mine.positions | hidden.positions)
        for path in state.replaced.data_files if state.replaced is not None else ():
            pending.pop(path, None)  # the file goes whole: no DV of it is left behind
        if not pending:
            return []
        live = live_position_deletes(self._io, self._parent(base))
        if base.format_version < 3:
            def location_for(n: int) -> str:
                location = self._settings.data_locations.of("", f"{self._commit_uuid}-{self._attempt}-{n:05d}-deletes.parquet")
                self._written[self._attempt].append(location)
                return location

            files = write_position_delete_files(self._io, location_for, pending, live, self._settings.parquet_compression)
        else:
            location = self._settings.data_locations.of("", f"{self._commit_uuid}-{self._attempt}-deletes.puffin")
            self._written[self._attempt].append(location)
            files = write_deletion_vectors(self._io, location, pending, live, f"lakesink {__version__}").files
        state.deletion_vectors = files
        return self._write_manifests(base, ManifestContent.DELETES, files)

    # -- step 3: carry-over ---------------------------------------------------------------

    def _replaced_dv_targets(self, added_dvs: list[DataFile]) -> set[str]:
        """Data files whose live DV this commit replaces: every file it adds a DV for."""
        return {p for p in (deleted_data_file(f) for f in added_dvs) if p is not None}

    def _carry_over(
        self, base: TableMetadata, state: _Attempt, replaced_dvs: Set[str], removed_files: Set[str]
    ) -> list[ManifestFile]:
        """The base's manifests as they stand after this delta's removals: data files it
        rewrote or replaced, DVs it replaces or whose data file it removes, and the delete
        files an overwrite's scope takes."""
        parent = self._parent(base)
        if parent is None:
            return []
        replaced = state.replaced
        scoped_deletes = replaced is not None and replaced.scope.kind not in ("filter", "before")
        kept: list[ManifestFile] = []
        for manifest in read_manifest_list(self._io, parent.manifest_list):
            if not manifest.added_files_count and not manifest.existing_files_count:
                # Only DELETED entries, recorded by an earlier snapshot: nothing is live in
                # it any more, so later snapshots drop it (as Iceberg Java does).
                continue
            drop: Callable[[ManifestEntry], bool]
            if manifest.content == ManifestContent.DELETES:
                if not replaced_dvs and not scoped_deletes:
                    kept.append(manifest)
                    continue

                def drop(e: ManifestEntry) -> bool:
                    return deleted_data_file(e.data_file) in replaced_dvs or (replaced is not None and replaced.drops_delete_file(e))
            else:
                if not removed_files:
                    kept.append(manifest)
                    continue

                def drop(e: ManifestEntry) -> bool:
                    return e.data_file.file_path in removed_files
            removed: list[ManifestEntry] = []
            others: list[ManifestEntry] = []
            for e in read_entries(self._io, manifest):
                (removed if drop(e) else others).append(e)
            kept.append(self._rewrite(base, manifest, others, removed, state.counts) if removed else manifest)
        return kept

    def _rewrite(
        self,
        base: TableMetadata,
        manifest: ManifestFile,
        existing: list[ManifestEntry],
        removed: list[ManifestEntry],
        counts: ChangeCounts,
    ) -> ManifestFile:
        for e in removed:
            counts.remove(e.data_file, self._partition_path(base, e.data_file))
        return write_manifest(
            self._io,
            self._manifest_location(),
            spec=base.specs()[manifest.partition_spec_id],
            schema=self._schema,
            snapshot_id=self.snapshot_id,
            format_version=base.format_version,
            content=manifest.content,
            existing=existing,
            deleted=removed,
            avro_codec=self._avro_codec,
        )

    # -- step 4: manifest list and snapshot -----------------------------------------------

    def _snapshot(
        self,
        base: TableMetadata,
        attempt: int,
        manifests: list[ManifestFile],
        counts: ChangeCounts,
        extra_summary: Mapping[str, str],
    ) -> Snapshot:
        parent = self._parent(base)
        sequence_number = last_sequence_number(base) + 1
        first_row_id = next_row_id(base)
        list_location = f"{self._metadata_dir}/snap-{self.snapshot_id}-{attempt}-{self._commit_uuid}.avro"
        self._written[attempt].append(list_location)
        writer = ManifestListWriter(
            self._io,
            list_location,
            format_version=base.format_version,
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=sequence_number,
            first_row_id=first_row_id,
            avro_codec=self._avro_codec,
        )
        writer.write(manifests)
        previous = parent.summary.additional_properties if parent and parent.summary else None
        properties = build_summary(counts, previous if parent else None, extra_summary)
        return Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=sequence_number,
            timestamp_ms=int(time.time() * 1000),
            manifest_list=list_location,
            summary=Summary(self._delta.operation(), **properties),
            schema_id=self._schema.schema_id,
            first_row_id=first_row_id,
            added_rows=writer.added_rows,
        )

    # -- files ----------------------------------------------------------------------------

    def _write_added(self, base: TableMetadata) -> list[ManifestFile]:
        """The manifests of the added data files (one per spec); independent of the base."""
        return self._write_manifests(base, ManifestContent.DATA, self._delta.added_data_files)

    def _write_manifests(self, base: TableMetadata, content: ManifestContent, files: list[DataFile]) -> list[ManifestFile]:
        by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for f in files:
            by_spec[f.spec_id].append(f)
        return [
            write_manifest(
                self._io,
                self._manifest_location(),
                spec=base.specs()[spec_id],
                schema=self._schema,
                snapshot_id=self.snapshot_id,
                format_version=base.format_version,
                content=content,
                added=group,
                avro_codec=self._avro_codec,
            )
            for spec_id, group in by_spec.items()
        ]

    def _write_merged(
        self,
        base: TableMetadata,
        spec_id: int,
        content: ManifestContent,
        added: list[ManifestEntry],
        existing: list[ManifestEntry],
        deleted: list[ManifestEntry],
    ) -> ManifestFile:
        return write_manifest(
            self._io,
            self._manifest_location(),
            spec=base.specs()[spec_id],
            schema=self._schema,
            snapshot_id=self.snapshot_id,
            format_version=base.format_version,
            content=content,
            added=[e.data_file for e in added],
            existing=existing,
            deleted=deleted,
            avro_codec=self._avro_codec,
        )

    def _manifest_location(self) -> str:
        self._manifest_count += 1
        location = f"{self._metadata_dir}/{self._commit_uuid}-m{self._manifest_count}.avro"
        self._written[self._attempt].append(location)
        return location

    @staticmethod
    def _partition_path(base: TableMetadata, f: DataFile) -> str:
        return base.specs()[f.spec_id].partition_to_path(f.partition, base.schema())

    def attempt_of(self, snapshot: Snapshot) -> int | None:
        """Which of this producer's attempts `snapshot` is (every attempt shares the snapshot
        id; each writes its own manifest list), or None if it is none of them."""
        if snapshot.snapshot_id != self.snapshot_id:
            return None
        for attempt, locations in self._written.items():
            if attempt >= 0 and snapshot.manifest_list in locations:
                return attempt
        return None

    def cleanup(self, committed_attempt: int | None, keep: Set[int] = frozenset()) -> None:
        """Delete the files no committed snapshot references: every attempt's but the
        committed one's, and the shared added manifests its manifest list does not name (all
        of them when nothing committed). `keep`:
        attempts whose commit's answer was lost and that may still have landed: their files,
        and the shared ones, stay (orphan removal collects them if they did not)."""
        for attempt, locations in self._written.items():
            if committed_attempt is not None and attempt == committed_attempt:
                continue
            if committed_attempt is not None and attempt == -1:
                # The shared added manifests the committed snapshot does not name (merged
                # into another manifest): nothing references them.
                listed = self._listed.get(committed_attempt)
                locations = [] if listed is None else [path for path in locations if path not in listed]
            elif keep and (attempt == -1 or attempt in keep):
                continue
            for location in locations:
                try:
                    self._io.delete(location)
                except OSError:
                    pass
