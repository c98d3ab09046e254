"""Iceberg data-file metrics from a written Parquet footer (plus NaN counts from Arrow).

pyiceberg computes column sizes, value/null counts and bounds from Parquet statistics,
honouring the table's metrics modes (default truncate(16): string/binary bounds are
truncated, the upper bound incremented so it still bounds every value; nested columns get
counts only). Two things it cannot see are handled here:

* NaN counts: Parquet statistics have none, so the writer counts NaNs in the Arrow data it
  writes (`count_nans`) and hands the per-file totals in.
* Row groups without min/max: Arrow drops min/max for a column chunk whose value is longer
  than 4096 bytes, and pyiceberg would then build the file's bounds from the *other* row
  groups only - bounds that do not cover every value, so readers could wrongly prune the
  file. Such columns get no bounds at all.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    StatisticsCollector,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, FloatType, NestedField, StructType

from lakesink_datasource.iceberg.partition_key import PartitionKey
from lakesink_datasource.messages import DataFileMessage

_NO_BOUNDS_MODES = (MetricModeTypes.NONE, MetricModeTypes.COUNTS)


def data_file_message(
    path: str,
    spec_id: int,
    partition_key: PartitionKey,
    parquet_metadata: pq.FileMetaData,
    file_size: int,
    iceberg_schema: Schema,
    table_properties: dict[str, str],
    nan_counts: dict[int, int],
    sort_order_id: int = 0,
) -> DataFileMessage:
    """Describe a closed Parquet data file for the commit (`sort_order_id`: the table sort
    order its rows are sorted by, 0 if none)."""
    plan = compute_statistics_plan(iceberg_schema, table_properties)
    column_ids = parquet_path_to_id_mapping(iceberg_schema)
    stats = data_file_statistics_from_parquet_metadata(parquet_metadata, plan, column_ids)
    for field_id in _fields_missing_min_max(parquet_metadata, plan, column_ids):
        stats.column_aggregates.pop(field_id, None)
    serialized = stats.to_serialized_dict()
    return DataFileMessage(
        path=path,
        spec_id=spec_id,
        partition=tuple(partition_key),
        record_count=int(serialized["record_count"]),
        file_size_in_bytes=int(file_size),
        column_sizes=dict(serialized["column_sizes"]),
        value_counts=dict(serialized["value_counts"]),
        null_value_counts=dict(serialized["null_value_counts"]),
        # Metrics mode "none" means no metrics of any kind for that column.
        nan_value_counts={
            fid: int(n) for fid, n in nan_counts.items() if fid in plan and plan[fid].mode.type != MetricModeTypes.NONE
        },
        lower_bounds=dict(serialized["lower_bounds"]),
        upper_bounds=dict(serialized["upper_bounds"]),
        split_offsets=list(serialized["split_offsets"]),
        sort_order_id=sort_order_id,
    )


def count_nans(table: pa.Table | pa.RecordBatch, iceberg_schema: Schema) -> dict[int, int]:
    """NaN count per float/double field id, top level and inside structs (lists/maps skipped).

    Every float/double column present gets an entry, zeros included: a known zero lets
    readers prune `is_nan` predicates. Values under a null struct are null, not NaN.
    """
    counts: dict[int, int] = {}
    for field in iceberg_schema.fields:
        if field.name in table.column_names:
            _count_field(field, table.column(field.name), counts)
    return counts


def add_counts(total: dict[int, int], more: dict[int, int]) -> None:
    """Accumulate per-batch counts into a per-file total."""
    for field_id, n in more.items():
        total[field_id] = total.get(field_id, 0) + n


def _count_field(field: NestedField, values: pa.Array | pa.ChunkedArray, counts: dict[int, int]) -> None:
    kind = field.field_type
    if isinstance(kind, (FloatType, DoubleType)):
        counts[field.field_id] = int(pc.sum(pc.is_nan(values)).as_py() or 0)
    elif isinstance(kind, StructType):
        for child in kind.fields:
            index = values.type.get_field_index(child.name)
            if index >= 0:
                # struct_field folds in the parent's validity (null parent -> null child).
                _count_field(child, pc.struct_field(values, [index]), counts)


def _fields_missing_min_max(
    metadata: pq.FileMetaData, plan: dict[int, StatisticsCollector], column_ids: dict[str, int]
) -> set[int]:
    """Bounded columns where some row group has non-null values but no min/max statistics.

    Float/double chunks are exempt: Arrow only omits their min/max when every non-null value
    is NaN, and Iceberg bounds exclude NaN anyway.
    """
    missing: set[int] = set()
    for r in range(metadata.num_row_groups):
        row_group = metadata.row_group(r)
        for c in range(metadata.num_columns):
            column = row_group.column(c)
            field_id = column_ids.get(column.path_in_schema)
            collector = plan.get(field_id) if field_id is not None else None
            if field_id is None or collector is None or collector.mode.type in _NO_BOUNDS_MODES or field_id in missing:
                continue
            if isinstance(collector.iceberg_type, (FloatType, DoubleType)):
                continue
            statistics = column.statistics if column.is_stats_set else None
            if statistics is None or (not statistics.has_min_max and _has_non_null_values(statistics, column)):
                missing.add(field_id)
    return missing


def _has_non_null_values(statistics: pq.Statistics, column: pq.ColumnChunkMetaData) -> bool:
    if statistics.has_null_count:
        return column.num_values > statistics.null_count
    return column.num_values > 0
