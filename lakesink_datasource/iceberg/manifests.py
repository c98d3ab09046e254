"""Manifests (data and delete) for format versions 2 and 3, on pyiceberg's Avro models.

pyiceberg 0.12 reads manifests with its v2 record shape (dropping `first_row_id`,
`referenced_data_file`, `content_offset`, `content_size_in_bytes`) and cannot write v3 or
delete manifests at all. lakesink reads and writes every record in the v3 shape; v2 files
are the same shape minus trailing fields, so one code path serves both versions. Field
positions used below are the v3 struct positions of pyiceberg 0.12.0 (`DATA_FILE_TYPE[3]`,
`MANIFEST_LIST_FILE_SCHEMAS[3]`), pinned by `iceberg.compat`. docs/format.md lists the
spec rules these follow.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final, Literal

from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.io import FileIO, OutputFile
from pyiceberg.manifest import (
    MANIFEST_ENTRY_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    construct_partition_summaries,
    data_file_with_partition,
    manifest_entry_schema_with_data_file,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import TableVersion
from pyiceberg.types import StructType

from lakesink_datasource.iceberg.avro_input import SchemaCachedAvroFile
from lakesink_datasource.iceberg.avro_output import CachedAvroOutputFile
from lakesink_datasource.iceberg.object_cache import TieredCache

AvroCodec = Literal["null", "bzip2", "snappy", "zstandard", "deflate"]
AVRO_CODEC: Final = "deflate"  # Java's default for manifests; every Iceberg reader supports it

# v3 positions beyond the 16 slots pyiceberg exposes as properties.
_DF_FIRST_ROW_ID = 16
_DF_REFERENCED_DATA_FILE = 17
_DF_CONTENT_OFFSET = 18
_DF_CONTENT_SIZE = 19
MF_FIRST_ROW_ID = 15  # the manifest list's first_row_id (field 520)


def data_file_first_row_id(data_file: DataFile) -> int | None:
    return data_file._data[_DF_FIRST_ROW_ID] if len(data_file._data) > _DF_FIRST_ROW_ID else None


def set_data_file_first_row_id(data_file: DataFile, value: int | None) -> None:
    data_file._data[_DF_FIRST_ROW_ID] = value


def referenced_data_file(data_file: DataFile) -> str | None:
    return data_file._data[_DF_REFERENCED_DATA_FILE] if len(data_file._data) > _DF_REFERENCED_DATA_FILE else None


def content_offset(data_file: DataFile) -> int | None:
    return data_file._data[_DF_CONTENT_OFFSET] if len(data_file._data) > _DF_CONTENT_OFFSET else None


def content_size_in_bytes(data_file: DataFile) -> int | None:
    return data_file._data[_DF_CONTENT_SIZE] if len(data_file._data) > _DF_CONTENT_SIZE else None


def is_deletion_vector(data_file: DataFile) -> bool:
    # Java's rule (ContentFileUtil.isDV): a delete file is a DV iff it is a Puffin file.
    return data_file.content == DataFileContent.POSITION_DELETES and data_file.file_format == FileFormat.PUFFIN


# The reserved columns of a position-delete file (Parquet field ids).
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545


def deleted_data_file(data_file: DataFile) -> str | None:
    """The one data file a position-delete file hides rows of: a DV's `referenced_data_file`;
    for a v2 position-delete file, that field or, as Java's writers mark a "file-scoped"
    delete file, equal lower and upper bounds on `file_path`. None: not a position-delete
    file, or one that covers several data files."""
    if data_file.content != DataFileContent.POSITION_DELETES:
        return None
    referenced = referenced_data_file(data_file)
    if referenced is not None or is_deletion_vector(data_file):
        return referenced
    lower = (data_file.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
    upper = (data_file.upper_bounds or {}).get(DELETE_FILE_PATH_ID)
    return lower.decode() if lower is not None and lower == upper else None


def manifest_first_row_id(manifest: ManifestFile) -> int | None:
    return manifest._data[MF_FIRST_ROW_ID] if len(manifest._data) > MF_FIRST_ROW_ID else None


# Parsed entries by manifest. A manifest file never changes once written; what a reader
# inherits from the manifest list (sequence number, first_row_id, snapshot, spec) is part of
# the key, so a cached list is exactly what a fresh read would give. The hot tier (live
# objects) is kept small for the garbage collector's sake (see `object_cache`).
_cache: TieredCache[tuple[object, ...], list[ManifestEntry]] = TieredCache(len, hot_weight=1_000, cold_bytes=256 << 20)


def read_entries(io: FileIO, manifest: ManifestFile, *, live_only: bool = True) -> list[ManifestEntry]:
    """Entries with everything inherited made explicit: snapshot id, sequence numbers,
    spec id and, for data files of a v3 manifest, the inherited `first_row_id`.

    The entries are shared with other callers (a process-wide cache): read them, never
    change them."""
    key = (
        manifest.manifest_path,
        manifest.sequence_number,
        manifest_first_row_id(manifest),
        manifest.added_snapshot_id,
        manifest.partition_spec_id,
    )
    entries = _cache.get(key)
    if entries is None:
        entries = _read_all_entries(io, manifest)
        _cache.put(key, entries)
    if not live_only:
        return list(entries)
    return [e for e in entries if e.status != ManifestEntryStatus.DELETED]


def _read_all_entries(io: FileIO, manifest: ManifestFile) -> list[ManifestEntry]:
    with SchemaCachedAvroFile[ManifestEntry](
        io.new_input(manifest.manifest_path),
        MANIFEST_ENTRY_SCHEMAS[3],
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    ) as reader:
        entries = list(reader)
    next_row_id: int | None = manifest_first_row_id(manifest)
    for entry in entries:
        if entry.snapshot_id is None and manifest.added_snapshot_id is not None:
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
            and data_file_first_row_id(entry.data_file) is None
        ):
            set_data_file_first_row_id(entry.data_file, next_row_id)
            next_row_id += entry.data_file.record_count
    return entries


@functools.lru_cache(maxsize=256)
def _entry_schema(format_version: TableVersion, partition_type: StructType) -> Schema:
    data_file = data_file_with_partition(format_version=format_version, partition_type=partition_type)
    return manifest_entry_schema_with_data_file(format_version=format_version, data_file=data_file)


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
        avro_codec: AvroCodec = AVRO_CODEC,
    ):
        if format_version not in (2, 3):
            raise ValueError(f"lakesink writes format versions 2 and 3, not {format_version}")
        super().__init__(spec, schema, output_file, snapshot_id, avro_codec)
        self._format_version: Literal[2, 3] = 2 if format_version == 2 else 3
        self._content = content

    def content(self) -> ManifestContent:
        return self._content

    @property
    def version(self) -> Literal[2, 3]:
        return self._format_version

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes" if self._content == ManifestContent.DELETES else "data"}

    def _with_partition(self, format_version: TableVersion) -> Schema:
        # The entry schema depends only on the version and the partition type; building it
        # (and its name index) costs about half a millisecond, once per table and version.
        return _entry_schema(format_version, self._spec.partition_type(self._schema))

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        # The record schema must be v3: pyiceberg's default (v2) would silently write
        # null for fields 142-145. A v2 file schema simply drops the trailing fields.
        return CachedAvroOutputFile[ManifestEntry](
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
    avro_codec: AvroCodec = AVRO_CODEC,
) -> ManifestFile:
    """Write one manifest. ADDED entries inherit their sequence numbers; EXISTING and
    DELETED entries carry their original ones explicitly, as the spec requires."""
    writer = LakeSinkManifestWriter(spec, schema, io.new_output(location), snapshot_id, format_version, content, avro_codec)
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
