"""Manifest entries for delete files lakesink writes (v3 deletion vectors)."""

from __future__ import annotations

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record


def dv_data_file(
    *,
    puffin_path: str,
    puffin_size: int,
    referenced_data_file: str,
    spec_id: int,
    partition: Record,
    cardinality: int,
    content_offset: int,
    content_size_in_bytes: int,
) -> DataFile:
    """A DV manifest entry: content 1, PUFFIN, fields 143-145 set, no metrics; record_count
    is the cardinality, file size the whole Puffin file's (docs/format.md)."""
    f = DataFile.from_args(
        _table_format_version=3,
        content=DataFileContent.POSITION_DELETES,
        file_path=puffin_path,
        file_format=FileFormat.PUFFIN,
        partition=partition,
        record_count=cardinality,
        file_size_in_bytes=puffin_size,
        column_sizes=None,
        value_counts=None,
        null_value_counts=None,
        nan_value_counts=None,
        lower_bounds=None,
        upper_bounds=None,
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
        first_row_id=None,
        referenced_data_file=referenced_data_file,
        content_offset=content_offset,
        content_size_in_bytes=content_size_in_bytes,
    )
    f.spec_id = spec_id
    return f
