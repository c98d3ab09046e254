"""Manifests and manifest lists for format versions 2 and 3, on pyiceberg's Avro models.

pyiceberg 0.12 reads manifests with its v2 record shape (dropping `first_row_id`,
`referenced_data_file`, `content_offset`, `content_size_in_bytes` and the manifest
list's `first_row_id`) and cannot write v3 or delete manifests at all. lakesink reads
and writes every record in the v3 shape; v2 files are the same shape minus trailing
fields, so one code path serves both versions. Field positions used below are the
v3 struct positions of pyiceberg 0.12.0 (`DATA_FILE_TYPE[3]`,
`MANIFEST_LIST_FILE_SCHEMAS[3]`), pinned by `compat.pyiceberg_v3`.
"""

from __future__ import annotations

from copy import copy
from typing import Iterable, Optional

from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    PartitionFieldSummary,
    construct_partition_summaries,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

AVRO_CODEC = "deflate"  # Java's default for manifests; every Iceberg reader supports it

# v3 positions beyond the 16 slots pyiceberg exposes as properties.
_DF_FIRST_ROW_ID = 16
_DF_REFERENCED_DATA_FILE = 17
_DF_CONTENT_OFFSET = 18
_DF_CONTENT_SIZE = 19
_MF_FIRST_ROW_ID = 15


def data_file_first_row_id(data_file: DataFile) -> Optional[int]:
    return data_file._data[_DF_FIRST_ROW_ID] if len(data_file._data) > _DF_FIRST_ROW_ID else None


def set_data_file_first_row_id(data_file: DataFile, value: Optional[int]) -> None:
    data_file._data[_DF_FIRST_ROW_ID] = value


def referenced_data_file(data_file: DataFile) -> Optional[str]:
    return data_file._data[_DF_REFERENCED_DATA_FILE] if len(data_file._data) > _DF_REFERENCED_DATA_FILE else None


def content_offset(data_file: DataFile) -> Optional[int]:
    return data_file._data[_DF_CONTENT_OFFSET] if len(data_file._data) > _DF_CONTENT_OFFSET else None


def content_size_in_bytes(data_file: DataFile) -> Optional[int]:
    return data_file._data[_DF_CONTENT_SIZE] if len(data_file._data) > _DF_CONTENT_SIZE else None


def is_deletion_vector(data_file: DataFile) -> bool:
    # Java's rule (ContentFileUtil.isDV): a delete file is a DV iff it is a Puffin file.
    return data_file.content == DataFileContent.POSITION_DELETES and data_file.file_format == FileFormat.PUFFIN


def manifest_first_row_id(manifest: ManifestFile) -> Optional[int]:
    return manifest._data[_MF_FIRST_ROW_ID] if len(manifest._data) > _MF_FIRST_ROW_ID else None


def read_manifest_list(io: FileIO, location: str) -> list[ManifestFile]:
    with AvroFile[ManifestFile](
        io.new_input(location),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        return list(reader)


def read_entries(io: FileIO, manifest: ManifestFile, *, live_only: bool = True) -> list[ManifestEntry]:
    """Entries with everything inherited made explicit: snapshot id, sequence numbers,
    spec id and, for data files of a v3 manifest, the inherited `first_row_id`."""
    with AvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        entries = list(reader)
    next_row_id = manifest_first_row_id(manifest)
    out = []
    for entry in entries:
        if entry.snapshot_id is None:
            entry.snapshot_id = manifest.added_snapshot_id
        if entry.status == ManifestEntryStatus.ADDED or manifest.sequence_number == 0:
            if entry.sequence_number is None:
                entry.sequence_number = manifest.sequence_number
            if entry.file_sequence_number is None:
                entry.file_sequence_number = manifest.sequence_number
        entry.data_file.spec_id = manifest.partition_spec_id
        # Row ids are assigned to live data files in manifest order (Java's
        # ManifestReader skips DELETED entries); they must be kept when rewritten.
        if (
            next_row_id is not None
            and entry.status != ManifestEntryStatus.DELETED
            and entry.data_file.content == DataFileContent.DATA
        ):
            if data_file_first_row_id(entry.data_file) is None:
                set_data_file_first_row_id(entry.data_file, next_row_id)
                next_row_id += entry.data_file.record_count
        if not live_only or entry.status != ManifestEntryStatus.DELETED:
            out.append(entry)
    return out


class LakeSinkManifestWriter(ManifestWriter):
    """A data or delete manifest for format version 2 or 3, written from v3-shaped records."""

    def __init__(
        self,
        spec: PartitionSpec,
        schema: Schema,
        output_file: OutputFile,
        snapshot_id: int,
        format_version: int,
        content: ManifestContent,
    ):
        if format_version not in (2, 3):
            raise ValueError(f"lakesink writes format versions 2 and 3, not {format_version}")
        super().__init__(spec, schema, output_file, snapshot_id, AVRO_CODEC)
        self._format_version = format_version
        self._content = content

    def content(self) -> ManifestContent:
        return self._content

    @property
    def version(self) -> int:  # type: ignore[override]
        return self._format_version

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes" if self._content == ManifestContent.DELETES else "data"}

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        # The record schema must be v3: pyiceberg's default (v2) would silently write
        # null for fields 142-145. A v2 file schema simply drops the trailing fields.
        return AvroOutputFile[ManifestEntry](
            output_file=self._output_file,
            file_schema=self._with_partition(self._format_version),
            record_schema=self._with_partition(3),
            schema_name="manifest_entry",
            metadata=self._meta,
        )

    def prepare_entry(self, entry: ManifestEntry) -> ManifestEntry:
        if entry.sequence_number is None and entry.status != ManifestEntryStatus.ADDED:
            raise ValueError("only ADDED entries may inherit their sequence number")
        return entry

    def to_manifest_file(self) -> ManifestFile:
        self.closed = True
        min_seq = self._min_sequence_number if self._min_sequence_number is not None else UNASSIGNED_SEQ
        return ManifestFile.from_args(
            _table_format_version=3,
            manifest_path=self._output_file.location,
            manifest_length=len(self._writer.output_file),
            partition_spec_id=self._spec.spec_id,
            content=self._content,
            sequence_number=UNASSIGNED_SEQ,
            min_sequence_number=min_seq,
            added_snapshot_id=self._snapshot_id,
            added_files_count=self._added_files,
            existing_files_count=self._existing_files,
            deleted_files_count=self._deleted_files,
            added_rows_count=self._added_rows,
            existing_rows_count=self._existing_rows,
            deleted_rows_count=self._deleted_rows,
            partitions=construct_partition_summaries(self._spec, self._schema, self._partitions),
            key_metadata=None,
            first_row_id=None,
        )


def write_manifest(
    io: FileIO,
    location: str,
    *,
    spec: PartitionSpec,
    schema: Schema,
    snapshot_id: int,
    format_version: int,
    content: ManifestContent,
    added: Iterable[DataFile] = (),
    existing: Iterable[ManifestEntry] = (),
    deleted: Iterable[ManifestEntry] = (),
) -> ManifestFile:
    """Write one manifest. ADDED entries inherit their sequence numbers; EXISTING and
    DELETED entries carry their original ones explicitly, as the spec requires."""
    writer = LakeSinkManifestWriter(spec, schema, io.new_output(location), snapshot_id, format_version, content)
    with writer:
        for data_file in added:
            writer.add_entry(
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, sequence_number=None,
                    file_sequence_number=None, data_file=data_file,
                )
            )
        for entry in existing:
            writer.existing(entry)
        for entry in deleted:
            writer.delete(entry)
    return writer.to_manifest_file()


class ManifestListWriter:
    """Writes a manifest list and, in v3, assigns `first_row_id` to data manifests.

    Row-lineage rule (spec "Row Lineage"; notes section 4.4): every data manifest without
    a first_row_id gets the running id, which advances by its added + existing rows;
    delete manifests stay null. `next_row_id` is the table's next-row-id afterwards.
    """

    def __init__(
        self,
        io: FileIO,
        location: str,
        *,
        format_version: int,
        snapshot_id: int,
        parent_snapshot_id: Optional[int],
        sequence_number: int,
        first_row_id: Optional[int],
    ):
        self._io = io
        self.location = location
        self._format_version = format_version
        self._snapshot_id = snapshot_id
        self._parent_snapshot_id = parent_snapshot_id
        self._sequence_number = sequence_number
        self.first_row_id = first_row_id
        self.next_row_id = first_row_id

    def _prepare(self, manifest: ManifestFile) -> ManifestFile:
        m = copy(manifest)
        m._data = list(manifest._data) + [None] * (16 - len(manifest._data))
        if m.sequence_number == UNASSIGNED_SEQ:
            if m.added_snapshot_id != self._snapshot_id:
                raise ValueError(f"manifest {m.manifest_path} from another snapshot has no sequence number")
            m.sequence_number = self._sequence_number
        if m.min_sequence_number == UNASSIGNED_SEQ:
            m.min_sequence_number = self._sequence_number
        if self._format_version >= 3 and m.content == ManifestContent.DATA and m._data[_MF_FIRST_ROW_ID] is None:
            assert self.next_row_id is not None
            m._data[_MF_FIRST_ROW_ID] = self.next_row_id
            self.next_row_id += (m.added_rows_count or 0) + (m.existing_rows_count or 0)
        if m.content == ManifestContent.DELETES:
            m._data[_MF_FIRST_ROW_ID] = None
        return m

    def write(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        meta = {
            "snapshot-id": str(self._snapshot_id),
            "parent-snapshot-id": str(self._parent_snapshot_id) if self._parent_snapshot_id is not None else "null",
            "sequence-number": str(self._sequence_number),
            "format-version": str(self._format_version),
            "avro.codec": AVRO_CODEC,
        }
        if self._format_version >= 3:
            meta["first-row-id"] = str(self.first_row_id)
        prepared = [self._prepare(m) for m in manifests]
        with AvroOutputFile[ManifestFile](
            output_file=self._io.new_output(self.location),
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[self._format_version],
            schema_name="manifest_file",
            metadata=meta,
        ) as out:
            out.write_block(prepared)
        return prepared

    @property
    def added_rows(self) -> Optional[int]:
        if self.first_row_id is None or self.next_row_id is None:
            return None
        return self.next_row_id - self.first_row_id
