"""Executor-side partition fanout: split an Arrow batch into one table per partition.

Everything is vectorised: each partition field is computed with pyiceberg's Arrow
transform, rows are grouped by dictionary codes, and a single stable `take` reorders the
batch so every group is a contiguous zero-copy slice. Python only loops per *group* (to
serialize the partition values), never per row.

Groups are named by their `PartitionKey` (`iceberg.partition_key`), exactly what
`DataFileMessage.partition` carries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import Transform, VoidTransform
from pyiceberg.types import PrimitiveType, StructType

from lakesink_datasource.iceberg.partition_key import PartitionKey, value_to_bytes

# Combined group ids are products of per-field cardinalities; re-densify before they could
# overflow int64 (each cardinality is <= the row count, so this only matters for many fields).
_MAX_COMBINED_ID = 1 << 62


@dataclass(frozen=True)
class _FieldPlan:
    """How to compute one partition field from a table."""

    path: tuple[str, ...]  # names from the top-level column down to the (possibly nested) source
    source_type: PrimitiveType
    result_type: PrimitiveType
    transform: Transform[Any, Any]
    arrow_fn: Callable[[pa.Array], pa.Array] | None  # None when pyiceberg has no Arrow kernel


class PartitionSplitter:
    """Splits batches aligned to the table's Arrow schema by a partition spec."""

    def __init__(self, spec: PartitionSpec, schema: Schema) -> None:
        self._plans = [_plan_field(field, schema) for field in spec.fields]
        # A spec whose fields are all void needs no grouping: every row has the all-null key.
        self._all_void = all(isinstance(p.transform, VoidTransform) for p in self._plans)

    @property
    def is_unpartitioned(self) -> bool:
        return not self._plans

    def transformed(self, table: pa.Table) -> list[pa.Array]:
        """Each field's transformed values for every row of `table` (Iceberg's internal
        representation: dates as days, timestamps as micros; nulls where the source is
        null): what a sort order sorts by too."""
        return [self._partition_column(table, i) for i in range(len(self._plans))]

    def split(self, batch: pa.RecordBatch | pa.Table) -> list[tuple[PartitionKey, pa.Table]]:
        """Group rows by partition; rows keep their input order inside each group.

        Groups come back in order of their first row in the batch (deterministic output), as
        zero-copy slices of one grouped table.
        """
        grouped, groups = self.split_grouped(batch)
        if len(groups) == 1:
            return [(groups[0][0], grouped)]  # the input itself, untouched
        return [(key, grouped.slice(start, rows)) for key, start, rows in groups]

    def split_grouped(self, batch: pa.RecordBatch | pa.Table) -> tuple[pa.Table, list[tuple[PartitionKey, int, int]]]:
        """The rows reordered so each partition's rows are contiguous (input order kept inside
        a partition), and each partition's (key, first row, rows) in that table. One `take`,
        no per-partition tables: the writer keeps the grouped table once."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        if table.num_rows == 0:
            return table, []
        if not self._plans:
            return table, [((), 0, table.num_rows)]
        if self._all_void:
            return table, [((None,) * len(self._plans), 0, table.num_rows)]
        keys, order, starts, counts = self._group(table)
        if len(keys) == 1:
            return table, [(keys[0], 0, table.num_rows)]
        grouped = table.take(pa.array(order))
        return grouped, [(key, int(s), int(c)) for key, s, c in zip(keys, starts, counts)]

    def split_rows(self, batch: pa.RecordBatch | pa.Table) -> list[tuple[PartitionKey, np.ndarray]]:
        """Like split(), but each group is the row indices (int64, input order) of its rows:
        keyed writes need to know which input row lands where."""
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        everything = np.arange(table.num_rows, dtype=np.int64)
        if table.num_rows == 0:
            return []
        if not self._plans:
            return [((), everything)]
        if self._all_void:
            return [((None,) * len(self._plans), everything)]
        groups = self._group(table)
        if len(groups[0]) == 1:
            return [(groups[0][0], everything)]
        keys, order, starts, counts = groups
        return [(key, order[int(s) : int(s) + int(c)]) for key, s, c in zip(keys, starts, counts)]

    def _group(self, table: pa.Table) -> tuple[list[PartitionKey], np.ndarray, np.ndarray, np.ndarray]:
        """Partition keys, and the row order (stable: input order within a group) with each
        group's start and length in it."""
        columns = [self._partition_column(table, i) for i in range(len(self._plans))]
        group_of_row, first_rows = _group_rows(columns)
        keys = self._keys(columns, first_rows)
        order = np.argsort(group_of_row, kind="stable").astype(np.int64)
        counts = np.bincount(group_of_row, minlength=len(keys))
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        return keys, order, starts, counts

    def _partition_column(self, table: pa.Table, index: int) -> pa.Array:
        """The partition values of one field for every row, as internal (integer) Arrow values."""
        plan = self._plans[index]
        source = _combine(_source_column(table, plan.path))
        if plan.arrow_fn is not None:
            try:
                return _to_internal(_combine(plan.arrow_fn(source)))
            except (NotImplementedError, ValueError, TypeError, pa.ArrowNotImplementedError):
                # pyiceberg-core lacks some kernels (e.g. truncate on large_binary); remember
                # that and use the per-distinct-value fallback from now on.
                self._plans[index] = _without_arrow_fn(plan)
        return _transform_distinct_values(plan, source)

    def _keys(self, columns: list[pa.Array], first_rows: np.ndarray) -> list[PartitionKey]:
        """Serialize each group's partition values (taken from the group's first row)."""
        rows = pa.array(first_rows)
        per_field = [
            [None if v is None else value_to_bytes(plan.result_type, v) for v in col.take(rows).to_pylist()]
            for plan, col in zip(self._plans, columns)
        ]
        return [tuple(values) for values in zip(*per_field)]


def _plan_field(field: PartitionField, schema: Schema) -> _FieldPlan:
    source = schema.find_field(field.source_id)
    source_type = source.field_type
    if not isinstance(source_type, PrimitiveType):
        raise ValueError(f"Partition field {field.name} has a non-primitive source {source.name}")
    result_type = field.transform.result_type(source_type)
    assert isinstance(result_type, PrimitiveType)
    try:
        arrow_fn: Callable[[pa.Array], pa.Array] | None = field.transform.pyarrow_transform(source_type)
    except NotImplementedError:
        arrow_fn = None
    return _FieldPlan(
        path=_source_path(schema.as_struct(), field.source_id) or (source.name,),
        source_type=source_type,
        result_type=result_type,
        transform=field.transform,
        arrow_fn=arrow_fn,
    )


def _without_arrow_fn(plan: _FieldPlan) -> _FieldPlan:
    return _FieldPlan(plan.path, plan.source_type, plan.result_type, plan.transform, None)


def _source_path(struct: StructType, field_id: int) -> tuple[str, ...] | None:
    """Names leading to a field through nested structs (partition sources never sit in lists/maps)."""
    for field in struct.fields:
        if field.field_id == field_id:
            return (field.name,)
        if isinstance(field.field_type, StructType):
            inner = _source_path(field.field_type, field_id)
            if inner is not None:
                return (field.name, *inner)
    return None


def _source_column(table: pa.Table, path: tuple[str, ...]) -> pa.Array | pa.ChunkedArray:
    column: pa.Array | pa.ChunkedArray = table.column(path[0])
    for name in path[1:]:
        index = column.type.get_field_index(name)
        if index < 0:
            raise KeyError(f"Partition source {'.'.join(path)} not found in the batch")
        # struct_field folds the parent's validity in: a null struct gives a null source value.
        column = pc.struct_field(column, [index])
    return column


def _combine(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _to_internal(values: pa.Array) -> pa.Array:
    """Arrow logical types -> Iceberg internal representation (what `to_bytes` expects).

    Dates become day numbers, times/timestamps become integer micros (or nanos for the ns
    types), UUIDs become their 16 bytes; everything else already converts to the right
    Python value.
    """
    kind = values.type
    if isinstance(kind, pa.BaseExtensionType):
        return _to_internal(values.storage)
    if pa.types.is_date32(kind):
        return values.cast(pa.int32())
    if pa.types.is_timestamp(kind) or pa.types.is_time64(kind):
        return values.cast(pa.int64())
    if pa.types.is_time32(kind):
        return values.cast(pa.int32())
    return values


def _transform_distinct_values(plan: _FieldPlan, source: pa.Array) -> pa.Array:
    """Fallback: apply pyiceberg's scalar transform once per distinct source value."""
    encoded = pc.dictionary_encode(source)  # nulls stay null in the indices
    distinct = _to_internal(encoded.dictionary).to_pylist()
    fn = plan.transform.transform(plan.source_type)
    transformed = pa.array([fn(v) for v in distinct])
    return transformed.take(encoded.indices)


def _group_rows(columns: list[pa.Array]) -> tuple[np.ndarray, np.ndarray]:
    """Dense group id per row (numbered by first appearance) and each group's first row."""
    combined: np.ndarray | None = None
    cardinality = 1
    for column in columns:
        encoded = pc.dictionary_encode(column, null_encoding="encode")  # null is its own group
        codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        size = max(len(encoded.dictionary), 1)
        if combined is None:
            combined, cardinality = codes, size
            continue
        if cardinality * size >= _MAX_COMBINED_ID:
            combined, cardinality = _densify(combined)
        combined = combined * size + codes
        cardinality *= size
    assert combined is not None
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    # np.unique numbers groups by value; renumber them by first appearance instead.
    by_appearance = np.argsort(first, kind="stable")
    renumber = np.empty_like(by_appearance)
    renumber[by_appearance] = np.arange(len(by_appearance))
    return renumber[inverse.reshape(-1)], first[by_appearance]


def _densify(ids: np.ndarray) -> tuple[np.ndarray, int]:
    uniques, inverse = np.unique(ids, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64, copy=False), len(uniques)
