"""Manifest entries for delete files lakesink writes (v3 deletion vectors, v2 position-delete files)."""

from __future__ import annotations

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from lakesink_datasource.iceberg.manifests import DELETE_FILE_PATH_ID, DELETE_POS_ID


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


def position_delete_data_file(
    *, path: str, size: int, data_file: str, spec_id: int, partition: Record, count: int
) -> DataFile:
    """A v2 position-delete file's entry, file-scoped as Java writes it: equal lower and
    upper bounds on `file_path` name the one data file it covers, so readers match it
    without opening it."""
    bound = data_file.encode()
    f = DataFile.from_args(
        _table_format_version=3,  # lakesink's one record shape; a v2 manifest drops the v3 fields
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=partition,
        record_count=count,
        file_size_in_bytes=size,
        column_sizes=None,
        value_counts={DELETE_FILE_PATH_ID: count, DELETE_POS_ID: count},
        null_value_counts={DELETE_FILE_PATH_ID: 0, DELETE_POS_ID: 0},
        nan_value_counts=None,
        lower_bounds={DELETE_FILE_PATH_ID: bound},
        upper_bounds={DELETE_FILE_PATH_ID: bound},
        key_metadata=None,
        split_offsets=None,
        equality_ids=None,
        sort_order_id=None,
        first_row_id=None,
        referenced_data_file=None,
        content_offset=None,
        content_size_in_bytes=None,
    )
    f.spec_id = spec_id
    return f
