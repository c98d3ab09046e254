"""Check an Iceberg table's metadata against the invariants readers rely on.

Usable from tests and by users::

    python -m lakesink_datasource.check db.events --warehouse ./lakesink-warehouse
    python -m lakesink_datasource.check db.events --catalog prod --catalog-prop uri=http://...

Exit status 0 when every invariant holds, 1 with one line per violation, 2 when the table
cannot be loaded (or is format v1, which is not checked). `check_table(table)` returns the
violations as a list (empty = OK).

Manifests are read with lakesink's own readers (`commit.manifests`): pyiceberg 0.12's
readers drop the v3 fields (`first_row_id`, 143-145) these checks are about.

What is checked (the rules of docs/format.md):

* row lineage (v3, over all snapshots): every snapshot has `first-row-id` and
  `added-rows`; their ranges increase in commit order without overlapping; the table's
  `next-row-id` equals the sum of `added-rows` (or, once old snapshots were expired, is
  at least the end of every range); in the current manifest list every data manifest has
  a `first_row_id`, no delete manifest has one, the data manifests' ranges do not overlap,
  and neither do the row-id ranges of the live data files;
* manifest entries: ADDED entries inherit the manifest's sequence number, EXISTING and
  DELETED entries carry explicit ones; the manifest list's file/row counters match the
  entries; a manifest holds data or deletes, never both; no data file is live twice;
* deletion vectors: at most one live DV per data file; it references a live data file of
  the same spec and partition with seq(data) <= seq(DV); fields 143-145 are set, the blob
  decodes (length, magic, CRC), its cardinality equals `record_count` and its positions
  are below the data file's `record_count`; v3 snapshots add no v2 position-delete files;
  v2 tables hold no DVs;
* summary totals of the current snapshot, when present, equal what its live manifests say.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.catalog.table_args import add_table_arguments, check_table_arguments, open_table_or_report
from lakesink_datasource.iceberg.live_files import read_hidden_positions
from lakesink_datasource.iceberg.manifest_list import read_manifest_list
from lakesink_datasource.iceberg.manifests import (
    content_offset,
    content_size_in_bytes,
    data_file_first_row_id,
    is_deletion_vector,
    manifest_first_row_id,
    read_entries,
    referenced_data_file,
)
from lakesink_datasource.iceberg.puffin import read_blob
from lakesink_datasource.table.history_columns import END as HISTORY_END
from lakesink_datasource.table.history_columns import START as HISTORY_START

__all__ = ["check_metadata", "check_table", "main"]


@dataclass(frozen=True)
class _Live:
    """A live (not DELETED) entry of the current snapshot, with everything inherited."""

    entry: ManifestEntry
    manifest: ManifestFile

    @property
    def file(self) -> DataFile:
        return self.entry.data_file


def check_table(table: Table) -> list[str]:
    """The invariant violations of `table`'s current state; an empty list means it is OK."""
    return check_metadata(table.metadata, table.io)


def check_metadata(metadata: TableMetadata, io: FileIO) -> list[str]:
    if metadata.format_version < 2:
        # v1 manifests lack sequence numbers and content types these checks are built on.
        raise ValueError(f"only format versions 2 and 3 can be checked, not {metadata.format_version}")
    return _Checker(metadata, io).run()


class _Checker:
    def __init__(self, metadata: TableMetadata, io: FileIO) -> None:
        self.metadata = metadata
        self.io = io
        self.v3 = metadata.format_version >= 3
        self.violations: list[str] = []
        self._puffin: dict[str, bytes] = {}

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def run(self) -> list[str]:
        if self.v3:
            self._check_snapshot_lineage()
        current = self.metadata.current_snapshot()
        if current is not None:
            self._check_current(current)
        return self.violations

    # --- row lineage over all snapshots -------------------------------------------------

    def _check_snapshot_lineage(self) -> None:
        next_row_id = getattr(self.metadata, "next_row_id", None)
        if next_row_id is None:
            self.fail("table: v3 metadata has no next-row-id")
            return
        ranges: list[tuple[int, int, int]] = []  # (first-row-id, end, snapshot id)
        # Sequence numbers are unique per commit and increase with it: commit order.
        for snap in sorted(self.metadata.snapshots, key=lambda s: s.sequence_number or 0):
            if snap.first_row_id is None or snap.added_rows is None:
                missing = [k for k, v in (("first-row-id", snap.first_row_id), ("added-rows", snap.added_rows)) if v is None]
                self.fail(f"snapshot {snap.snapshot_id}: v3 snapshot lacks {' and '.join(missing)}")
                continue
            if snap.added_rows < 0:
                self.fail(f"snapshot {snap.snapshot_id}: negative added-rows {snap.added_rows}")
            ranges.append((snap.first_row_id, snap.first_row_id + snap.added_rows, snap.snapshot_id))
        contiguous = not ranges or ranges[0][0] == 0
        for (first_a, end_a, id_a), (first_b, end_b, id_b) in itertools.pairwise(ranges):
            if first_b < end_a:
                self.fail(
                    f"snapshot {id_b}: row-id range [{first_b}, {end_b}) overlaps or precedes "
                    f"the range [{first_a}, {end_a}) of the earlier snapshot {id_a}"
                )
            contiguous = contiguous and first_b == end_a
        total = sum(end - first for first, end, _ in ranges)
        if contiguous:
            # Nothing expired: every id handed out is accounted for by a snapshot.
            if next_row_id != total:
                self.fail(f"table: next-row-id {next_row_id} != sum of snapshots' added-rows {total}")
        else:
            # Expired snapshots leave gaps; ids must still never be handed out twice.
            last_end = max(end for _, end, _ in ranges)
            if next_row_id < last_end:
                self.fail(f"table: next-row-id {next_row_id} is below the end {last_end} of a snapshot's row-id range")

    # --- current snapshot ---------------------------------------------------------------

    def _check_current(self, snapshot: Snapshot) -> None:
        try:
            manifests = read_manifest_list(self.io, snapshot.manifest_list)
        except Exception as exc:  # noqa: BLE001 - report, don't crash, on unreadable metadata
            self.fail(f"snapshot {snapshot.snapshot_id}: cannot read manifest list {snapshot.manifest_list}: {exc}")
            return
        live_data: list[_Live] = []
        live_deletes: list[_Live] = []
        for manifest in manifests:
            where = f"manifest {manifest.manifest_path}"
            self._check_manifest_header(manifest, snapshot, where)
            try:
                entries = read_entries(self.io, manifest, live_only=False)
            except Exception as exc:  # noqa: BLE001 - report, don't crash, on unreadable metadata
                self.fail(f"{where}: cannot read: {exc}")
                continue
            self._check_entries(manifest, entries, where)
            for entry in entries:
                if entry.status == ManifestEntryStatus.DELETED:
                    continue
                live = _Live(entry, manifest)
                (live_data if entry.data_file.content == DataFileContent.DATA else live_deletes).append(live)
        if self.v3:
            self._check_manifest_row_ranges(manifests)
            self._check_file_row_ranges(live_data)
        data_by_path = self._index_data_files(live_data)
        self._check_deletes(live_deletes, data_by_path)
        self._check_totals(snapshot, live_data, live_deletes)
        self._check_unique_keys(live_data, live_deletes)

    def _check_unique_keys(self, live_data: list[_Live], live_deletes: list[_Live]) -> None:
        """A table with identifier fields holds at most one live row per key."""
        schema = self.metadata.schema()
        names = [schema.find_column_name(i) for i in sorted(schema.identifier_field_ids)]
        if not names or any(n is None for n in names):
            return
        if any(d.file.content == DataFileContent.EQUALITY_DELETES for d in live_deletes):
            return  # which rows equality deletes hide depends on sequence numbers: not checked here
        hidden: dict[str, set[int]] = defaultdict(set)
        for d in live_deletes:
            if is_deletion_vector(d.file):
                target = referenced_data_file(d.file)
                if target is not None:
                    hidden[target] |= set(read_hidden_positions(self.io, d.file))
            else:
                with self.io.new_input(d.file.file_path).open() as stream:
                    deletes = pq.read_table(stream, columns=["file_path", "pos"]).to_pydict()
                for path, pos in zip(deletes["file_path"], deletes["pos"]):
                    hidden[path].add(pos)
        # A history table (history=true) holds every version of a key: one of them current
        # (its end null), the others ending where they end, none overlapping another.
        bounds = [c for c in (HISTORY_START, HISTORY_END) if c in schema.column_names]
        history = len(bounds) == 2
        counts: Counter[tuple] = Counter()
        intervals: dict[tuple, list[tuple[Any, Any]]] = defaultdict(list)
        for live in live_data:
            with self.io.new_input(live.file.file_path).open() as stream:
                rows = pq.read_table(stream, columns=names + (bounds if history else [])).to_pylist()
            gone = hidden.get(live.file.file_path, set())
            for pos, row in enumerate(rows):
                if pos in gone:
                    continue
                key = tuple(row[n] for n in names)
                if history:
                    intervals[key].append((_comparable(row[HISTORY_START]), _comparable(row[HISTORY_END])))
                    if row[HISTORY_END] is not None:
                        continue
                counts[key] += 1
        repeated = [k for k, n in counts.items() if n > 1]
        if repeated:
            what = "current version (end null)" if history else "live row"
            self.fail(
                f"table: {len(repeated)} key(s) of identifier fields ({', '.join(str(n) for n in names)}) have more than one "
                f"{what}, e.g. {repeated[0]} ({counts[repeated[0]]} rows)"
            )
        for key, spans in intervals.items():
            ordered = sorted(spans, key=lambda s: (s[0] is None, s[0]))
            for (start, end), (next_start, _) in itertools.pairwise(ordered):
                if end is None or start is None or next_start is None or not (start < end <= next_start):
                    self.fail(f"table: versions of key {key} overlap or are out of order: {ordered}")
                    return

    def _check_manifest_header(self, manifest: ManifestFile, snapshot: Snapshot, where: str) -> None:
        if manifest.partition_spec_id not in self.metadata.specs():
            self.fail(f"{where}: unknown partition spec id {manifest.partition_spec_id}")
        if manifest.sequence_number is not None and manifest.sequence_number > (snapshot.sequence_number or 0):
            self.fail(f"{where}: sequence number {manifest.sequence_number} is newer than its snapshot's {snapshot.sequence_number}")
        first_row_id = manifest_first_row_id(manifest)
        if not self.v3:
            return
        if manifest.content == ManifestContent.DATA and first_row_id is None:
            self.fail(f"{where}: v3 data manifest has no first_row_id")
        if manifest.content == ManifestContent.DELETES and first_row_id is not None:
            self.fail(f"{where}: delete manifest has first_row_id {first_row_id} (must be null)")

    def _check_entries(self, manifest: ManifestFile, entries: list[ManifestEntry], where: str) -> None:
        files: dict[ManifestEntryStatus, int] = defaultdict(int)
        rows: dict[ManifestEntryStatus, int] = defaultdict(int)
        for entry in entries:
            f = entry.data_file
            what = f"{where}: entry {f.file_path} ({entry.status.name})"
            files[entry.status] += 1
            rows[entry.status] += f.record_count
            is_data = f.content == DataFileContent.DATA
            if is_data != (manifest.content == ManifestContent.DATA):
                self.fail(f"{what}: content {f.content.name} in a {manifest.content.name} manifest")
            # read_entries fills inherited numbers in only for ADDED entries. An ADDED entry's
            # file sequence number is its commit's; its data sequence number may be older
            # (a compaction keeping the starting sequence number, as Iceberg Java's
            # rewrite_data_files does) but never newer. An EXISTING/DELETED entry still at
            # None lost its original numbers.
            if entry.status == ManifestEntryStatus.ADDED:
                if entry.file_sequence_number != manifest.sequence_number or (
                    entry.sequence_number is None
                    or (manifest.sequence_number is not None and entry.sequence_number > manifest.sequence_number)
                ):
                    self.fail(
                        f"{what}: sequence numbers ({entry.sequence_number}, {entry.file_sequence_number}) "
                        f"do not fit the manifest's {manifest.sequence_number} (file sequence number must equal it, "
                        "data sequence number must not exceed it)"
                    )
            elif entry.sequence_number is None or entry.file_sequence_number is None:
                self.fail(f"{what}: sequence numbers must be explicit, got ({entry.sequence_number}, {entry.file_sequence_number})")
            elif manifest.sequence_number is not None and entry.sequence_number > manifest.sequence_number:
                self.fail(f"{what}: data sequence number {entry.sequence_number} is newer than its manifest's {manifest.sequence_number}")
            if (
                entry.status != ManifestEntryStatus.DELETED
                and entry.sequence_number is not None
                and manifest.min_sequence_number is not None
                and manifest.min_sequence_number >= 0
                and entry.sequence_number < manifest.min_sequence_number
            ):
                self.fail(
                    f"{what}: data sequence number {entry.sequence_number} is below the manifest's "
                    f"min_sequence_number {manifest.min_sequence_number}"
                )
            if not is_data and data_file_first_row_id(f) is not None:
                self.fail(f"{what}: delete file has first_row_id {data_file_first_row_id(f)} (must be null)")
        counters = [
            ("added_files_count", manifest.added_files_count, files[ManifestEntryStatus.ADDED]),
            ("existing_files_count", manifest.existing_files_count, files[ManifestEntryStatus.EXISTING]),
            ("deleted_files_count", manifest.deleted_files_count, files[ManifestEntryStatus.DELETED]),
            ("added_rows_count", manifest.added_rows_count, rows[ManifestEntryStatus.ADDED]),
            ("existing_rows_count", manifest.existing_rows_count, rows[ManifestEntryStatus.EXISTING]),
            ("deleted_rows_count", manifest.deleted_rows_count, rows[ManifestEntryStatus.DELETED]),
        ]
        for name, listed, actual in counters:
            if listed is not None and listed != actual:
                self.fail(f"{where}: manifest list says {name}={listed}, entries say {actual}")

    def _check_manifest_row_ranges(self, manifests: list[ManifestFile]) -> None:
        ranges = []
        for m in manifests:
            first = manifest_first_row_id(m)
            if m.content == ManifestContent.DATA and first is not None:
                end = first + (m.added_rows_count or 0) + (m.existing_rows_count or 0)
                ranges.append((first, end, m.manifest_path))
        self._report_overlaps(sorted(ranges), "data manifests")

    def _check_file_row_ranges(self, live_data: list[_Live]) -> None:
        ranges = []
        for live in live_data:
            first = data_file_first_row_id(live.file)
            if first is None:
                continue  # its manifest has no first_row_id: reported with the manifest
            ranges.append((first, first + live.file.record_count, live.file.file_path))
        self._report_overlaps(sorted(ranges), "live data files")

    def _report_overlaps(self, ranges: list[tuple[int, int, str]], what: str) -> None:
        reach: tuple[int, str] | None = None  # furthest end so far, and whose it is
        for first, end, name in ranges:
            if first == end:
                continue  # an empty range assigns no id
            if reach is not None and first < reach[0]:
                self.fail(f"row ids of {what} overlap: {name} starts at {first}, inside the range of {reach[1]} (ends {reach[0]})")
            if reach is None or end > reach[0]:
                reach = (end, name)

    def _index_data_files(self, live_data: list[_Live]) -> dict[str, _Live]:
        by_path: dict[str, _Live] = {}
        for live in live_data:
            path = live.file.file_path
            if path in by_path:
                self.fail(f"data file {path} is live more than once in the current snapshot")
            by_path[path] = live
        return by_path

    # --- delete files -------------------------------------------------------------------

    def _check_deletes(self, live_deletes: list[_Live], data_by_path: dict[str, _Live]) -> None:
        dvs_by_target: dict[str, list[_Live]] = defaultdict(list)
        for live in live_deletes:
            f = live.file
            if f.content != DataFileContent.POSITION_DELETES:
                continue
            if not is_deletion_vector(f):
                self._check_position_delete_file(live)
                continue
            if not self.v3:
                self.fail(f"DV {f.file_path}: deletion vectors are not allowed in a v{self.metadata.format_version} table")
            target = referenced_data_file(f)
            if target is None or content_offset(f) is None or content_size_in_bytes(f) is None:
                self.fail(
                    f"DV {f.file_path}: referenced_data_file/content_offset/content_size_in_bytes must all be set, got "
                    f"({target}, {content_offset(f)}, {content_size_in_bytes(f)})"
                )
                continue
            dvs_by_target[target].append(live)
            self._check_dv(live, target, data_by_path.get(target))
        for target, dvs in dvs_by_target.items():
            if len(dvs) > 1:
                where = ", ".join(f"{d.file.file_path}@{content_offset(d.file)}" for d in dvs)
                self.fail(f"data file {target} has {len(dvs)} live DVs (at most one allowed): {where}")

    def _check_position_delete_file(self, live: _Live) -> None:
        f = live.file
        if f.file_format == FileFormat.PUFFIN:
            return
        if not self.v3:
            return
        # Position-delete files committed before an upgrade to v3 stay valid; one added by
        # a v3 snapshot (recognisable by its first-row-id) is forbidden.
        added_by = self.metadata.snapshot_by_id(live.entry.snapshot_id) if live.entry.snapshot_id is not None else None
        if added_by is None or added_by.first_row_id is not None:
            self.fail(f"delete file {f.file_path}: v3 tables must use DVs, not {f.file_format.name} position-delete files")

    def _check_dv(self, live: _Live, target: str, data: _Live | None) -> None:
        f = live.file
        name = f"DV {f.file_path}@{content_offset(f)} for {target}"
        if data is None:
            self.fail(f"{name}: referenced data file is not live in the current snapshot")
        else:
            if data.file.spec_id != f.spec_id:
                self.fail(f"{name}: spec id {f.spec_id} != data file's {data.file.spec_id}")
            elif data.file.partition != f.partition:
                self.fail(f"{name}: partition {f.partition} != data file's {data.file.partition}")
            seq_data, seq_dv = data.entry.sequence_number, live.entry.sequence_number
            if seq_data is not None and seq_dv is not None and seq_data > seq_dv:
                self.fail(f"{name}: data sequence number {seq_dv} is older than the data file's {seq_data}, so it applies to nothing")
        try:
            blob_file = self._read_puffin(f.file_path)
        except Exception as exc:  # noqa: BLE001 - report, don't crash, on an unreadable Puffin file
            self.fail(f"{name}: cannot read Puffin file: {exc}")
            return
        if f.file_size_in_bytes != len(blob_file):
            self.fail(f"{name}: file_size_in_bytes {f.file_size_in_bytes} != Puffin file size {len(blob_file)}")
        try:
            positions = read_blob(blob_file, content_offset(f) or 0, content_size_in_bytes(f) or 0, f.record_count)
        except ValueError as exc:  # InvalidDeletionVector / InvalidPuffinFile
            self.fail(f"{name}: invalid blob: {exc}")
            return
        if data is not None and len(positions) and positions.max() >= data.file.record_count:
            self.fail(f"{name}: position {positions.max()} is beyond the data file's {data.file.record_count} rows")

    def _read_puffin(self, path: str) -> bytes:
        if path not in self._puffin:
            with self.io.new_input(path).open() as stream:
                self._puffin[path] = stream.read()
        return self._puffin[path]

    # --- summary ------------------------------------------------------------------------

    def _check_totals(self, snapshot: Snapshot, live_data: list[_Live], live_deletes: list[_Live]) -> None:
        if snapshot.summary is None:
            return
        summary = snapshot.summary.additional_properties

        def size(f: DataFile) -> int:
            # Java's convention: a DV counts its blob, not the Puffin file holding it.
            return (content_size_in_bytes(f) or f.file_size_in_bytes) if is_deletion_vector(f) else f.file_size_in_bytes

        expected = {
            "total-records": sum(d.file.record_count for d in live_data),
            "total-data-files": len(live_data),
            "total-delete-files": len(live_deletes),
            "total-position-deletes": sum(
                d.file.record_count for d in live_deletes if d.file.content == DataFileContent.POSITION_DELETES
            ),
            "total-equality-deletes": sum(
                d.file.record_count for d in live_deletes if d.file.content == DataFileContent.EQUALITY_DELETES
            ),
            "total-files-size": sum(size(d.file) for d in live_data + live_deletes),
        }
        for key, actual in expected.items():
            if key not in summary:
                continue
            try:
                claimed = int(summary[key])
            except ValueError:
                self.fail(f"snapshot {snapshot.snapshot_id}: summary {key}={summary[key]!r} is not an integer")
                continue
            if claimed != actual:
                self.fail(f"snapshot {snapshot.snapshot_id}: summary {key}={claimed}, live manifests say {actual}")


# --- command line -------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lakesink_datasource.check",
        description="Check an Iceberg table's metadata invariants (row lineage, sequence numbers, DVs, summary totals).",
    )
    add_table_arguments(parser)
    args = parser.parse_args(argv)
    check_table_arguments(parser, args)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    table = open_table_or_report(args)
    if table is None:
        return 2
    try:
        violations = check_table(table)
    except ValueError as exc:
        print(f"cannot check table {args.table}: {exc}", file=sys.stderr)
        return 2
    for line in violations:
        print(line)
    if violations:
        return 1
    snapshot = table.metadata.current_snapshot()
    print(
        f"OK: {args.table} (format v{table.metadata.format_version}, "
        f"snapshot {snapshot.snapshot_id if snapshot else 'none'}, {len(table.metadata.snapshots)} snapshots)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _comparable(value: Any) -> Any:
    """A bound as Python compares it: a struct (a source position of several parts) by its
    fields in turn."""
    return tuple(value.values()) if isinstance(value, dict) else value
