"""Manifest lists for format versions 2 and 3, and the v3 row-lineage assignment.

pyiceberg 0.12 reads manifest lists with its v2 record shape (dropping `first_row_id`) and
cannot write v3 ones; these are read and written in the v3 shape (a v2 file simply lacks the
trailing field).
"""

from __future__ import annotations

from copy import copy

from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestFile,
    PartitionFieldSummary,
)

from lakesink_datasource.iceberg.avro_input import SchemaCachedAvroFile
from lakesink_datasource.iceberg.avro_output import CachedAvroOutputFile
from lakesink_datasource.iceberg.manifests import AVRO_CODEC, MF_FIRST_ROW_ID, AvroCodec
from lakesink_datasource.iceberg.object_cache import TieredCache

# Manifest lists never change once written, and per commit the same ones are read again
# (expiry checks every retained snapshot's list, and the producer, history walks and index
# sync read the current one): a process-wide cache keyed by location, its hot tier weighed
# in manifests (see `object_cache` for why it is small).
_cache: TieredCache[str, tuple[ManifestFile, ...]] = TieredCache(len, hot_weight=250, cold_bytes=64 << 20)


def read_manifest_list(io: FileIO, location: str) -> list[ManifestFile]:
    """The manifests of a manifest list, in order. The ManifestFile objects are shared with
    other callers (the cache): read them, never change them (`ManifestListWriter` copies)."""
    cached = _cache.get(location)
    if cached is not None:
        return list(cached)
    with SchemaCachedAvroFile[ManifestFile](
        io.new_input(location),
        MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    ) as reader:
        manifests = tuple(reader)
    _cache.put(location, manifests)
    return list(manifests)



class ManifestListWriter:
    """Writes a manifest list and, in v3, assigns `first_row_id` to data manifests.

    Row-lineage rule (spec "Row Lineage"; docs/format.md section 3): every data manifest without
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
        parent_snapshot_id: int | None,
        sequence_number: int,
        first_row_id: int | None,
        avro_codec: AvroCodec = AVRO_CODEC,
    ):
        self._io = io
        self._avro_codec = avro_codec
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
        if self._format_version >= 3 and m.content == ManifestContent.DATA and m._data[MF_FIRST_ROW_ID] is None:
            assert self.next_row_id is not None
            m._data[MF_FIRST_ROW_ID] = self.next_row_id
            self.next_row_id += (m.added_rows_count or 0) + (m.existing_rows_count or 0)
        if m.content == ManifestContent.DELETES:
            m._data[MF_FIRST_ROW_ID] = None
        return m

    def write(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        meta = {
            "snapshot-id": str(self._snapshot_id),
            "parent-snapshot-id": str(self._parent_snapshot_id) if self._parent_snapshot_id is not None else "null",
            "sequence-number": str(self._sequence_number),
            "format-version": str(self._format_version),
            "avro.codec": self._avro_codec,
        }
        if self._format_version >= 3:
            meta["first-row-id"] = str(self.first_row_id)
        prepared = [self._prepare(m) for m in manifests]
        with CachedAvroOutputFile[ManifestFile](
            output_file=self._io.new_output(self.location),
            record_schema=MANIFEST_LIST_FILE_SCHEMAS[3],
            file_schema=MANIFEST_LIST_FILE_SCHEMAS[self._format_version],
            schema_name="manifest_file",
            metadata=meta,
        ) as out:
            out.write_block(prepared)
        # The next commit reads this list as its base: keep what was written, as a read would
        # give it (the next snapshot of every table a stream writes, ~1.5 ms each).
        _cache.put(self.location, tuple(_detached(m) for m in prepared))
        return prepared

    @property
    def added_rows(self) -> int | None:
        if self.first_row_id is None or self.next_row_id is None:
            return None
        return self.next_row_id - self.first_row_id


def _detached(manifest: ManifestFile) -> ManifestFile:
    """A copy that shares no field list with `manifest` (the caller may change its own)."""
    m = copy(manifest)
    m._data = list(manifest._data)
    return m
