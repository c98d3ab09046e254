"""Commit messages -> pyiceberg DataFile records (v3 shape) for the manifests."""

from __future__ import annotations

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record

from lakesink_datasource.io.partitioning import decode_partition
from lakesink_datasource.write.messages import DataFileMessage, DeletionVectorMessage


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
        sort_order_id=metadata.default_sort_order_id,
        first_row_id=None,  # new data files inherit row ids from their manifest
        referenced_data_file=None,
        content_offset=None,
        content_size_in_bytes=None,
    )
    f.spec_id = msg.spec_id
    return f


def deletion_vector_file(msg: DeletionVectorMessage, metadata: TableMetadata) -> DataFile:
    """A DV manifest entry for a blob described by a message."""
    spec = metadata.specs()[msg.spec_id]
    return dv_data_file(
        puffin_path=msg.puffin_path,
        puffin_size=msg.puffin_size_in_bytes,
        referenced_data_file=msg.referenced_data_file,
        spec_id=msg.spec_id,
        partition=decode_partition(spec, metadata.schema(), msg.partition),
        cardinality=msg.cardinality,
        content_offset=msg.content_offset,
        content_size_in_bytes=msg.content_size_in_bytes,
    )


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
    """A DV manifest entry: notes section 3.3 (content 1, PUFFIN, 143-145 set, no metrics;
    record_count is the cardinality, file size the whole Puffin file's)."""
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
