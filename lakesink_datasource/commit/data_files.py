"""Commit messages -> pyiceberg DataFile records (v3 shape) for the manifests."""

from __future__ import annotations

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.iceberg.partition_key import decode_partition
from lakesink_datasource.messages import DataFileMessage


def data_file(msg: DataFileMessage, metadata: TableMetadata) -> DataFile:
    spec = metadata.specs()[msg.spec_id]
    f = DataFile.from_args(
        _table_format_version=3,
        content=DataFileContent.DATA,
        file_path=msg.path,
        file_format=FileFormat.PARQUET,
        partition=decode_partition(spec, metadata.schema(), msg.partition),
        record_count=msg.record_count,
        file_size_in_bytes=msg.file_size_in_bytes,
        column_sizes=msg.column_sizes or None,
        value_counts=msg.value_counts or None,
        null_value_counts=msg.null_value_counts or None,
        nan_value_counts=msg.nan_value_counts or None,
        lower_bounds=msg.lower_bounds or None,
        upper_bounds=msg.upper_bounds or None,
        key_metadata=None,
        split_offsets=msg.split_offsets or None,
        equality_ids=None,
        # Only the order the writer sorted the file's rows by (io/row_order.py): a file
        # labelled sorted when it is not misleads readers and engines' rewrites.
        sort_order_id=msg.sort_order_id,
        first_row_id=None,  # new data files inherit row ids from their manifest
        referenced_data_file=None,
        content_offset=None,
        content_size_in_bytes=None,
    )
    f.spec_id = msg.spec_id
    return f
