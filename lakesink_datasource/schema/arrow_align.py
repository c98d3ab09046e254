"""Align the Arrow batches Spark sends to the table's Arrow schema (executor side).

The table schema decides names, order, types and Parquet field ids; Spark's batches
only decide the values. Small (32-bit offset) string/binary/list types are used on
purpose: they are what Spark sends, so no per-batch offset widening is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema

from lakesink_datasource.iceberg.row_lineage import FIELD_ID_KEY, field_ids
from lakesink_datasource.schema.spark_types import SchemaError


def _small(dt: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(dt):
        return pa.string()
    if pa.types.is_large_binary(dt):
        return pa.binary()
    if pa.types.is_large_list(dt) or pa.types.is_list(dt):
        return pa.list_(_small_field(dt.value_field))
    if pa.types.is_map(dt):
        return pa.map_(_small_field(dt.key_field), _small_field(dt.item_field))
    if pa.types.is_struct(dt):
        return pa.struct([_small_field(dt.field(i)) for i in range(dt.num_fields)])
    return dt


def _small_field(field: pa.Field) -> pa.Field:
    return pa.field(field.name, _small(field.type), field.nullable, field.metadata)


def table_arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema data files are written with (field ids in field metadata)."""
    return pa.schema([_small_field(f) for f in schema_to_pyarrow(schema, include_field_ids=True)])


def _has_struct(dt: pa.DataType) -> bool:
    if pa.types.is_struct(dt):
        return True
    if pa.types.is_list(dt) or pa.types.is_large_list(dt):
        return _has_struct(dt.value_type)
    if pa.types.is_map(dt):
        return _has_struct(dt.key_type) or _has_struct(dt.item_type)
    return False


def null_array(n: int, dtype: pa.DataType) -> pa.Array:
    """`n` nulls of `dtype`. A null struct still stores its children: a required child gets
    placeholder values under the null parent (Parquet writers refuse a required column
    holding nulls, and readers never see values under a null struct), so an optional
    struct with required fields can be left out of a write."""
    if not pa.types.is_struct(dtype):
        return pa.nulls(n, dtype)
    fields = [dtype.field(i) for i in range(dtype.num_fields)]
    children = [null_array(n, f.type) if f.nullable else _placeholder(n, f.type) for f in fields]
    return pa.StructArray.from_arrays(children, fields=fields, mask=pa.array(np.ones(n, dtype=bool)))


def _placeholder(n: int, dtype: pa.DataType) -> pa.Array:
    """`n` non-null values of `dtype` (zeros, empty strings and lists), to sit under nulls."""
    if pa.types.is_struct(dtype):
        fields = [dtype.field(i) for i in range(dtype.num_fields)]
        return pa.StructArray.from_arrays([null_array(n, f.type) if f.nullable else _placeholder(n, f.type) for f in fields], fields=fields)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_map(dtype):
        return pa.array([[]] * n, dtype)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return pa.array([""] * n, dtype)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return pa.array([b""] * n, dtype)
    if pa.types.is_fixed_size_binary(dtype):
        return pa.array([bytes(dtype.byte_width)] * n, dtype)
    if pa.types.is_boolean(dtype):
        return pa.array(np.zeros(n, dtype=bool))
    if pa.types.is_decimal(dtype):
        return pa.array([0] * n, pa.int64()).cast(dtype)
    return pa.array(np.zeros(n, dtype=np.int64)).cast(dtype)  # numbers, dates, times, timestamps


def _fill_under_nulls(child: pa.Array, field: pa.Field, parent_nulls: pa.Array | None) -> pa.Array:
    """A required child's nulls under null parents replaced by placeholders."""
    if field.nullable or not child.null_count or parent_nulls is None:
        return child
    return pc.if_else(pc.and_(child.is_null(), parent_nulls), _placeholder(len(child), field.type), child)


def align_array(column: pa.Array, target: pa.DataType) -> pa.Array:
    """`column` as `target`: structs field by field by name (case-insensitive, fields the
    DataFrame lacks as nulls, since the table's struct may have gained fields), everything
    else by Arrow's cast."""
    if column.type.equals(target):
        return column
    if not _has_struct(target):
        return column.cast(target)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_struct(target) and pa.types.is_struct(column.type):
        by_name = {column.type.field(i).name.lower(): i for i in range(column.type.num_fields)}
        fields = [target.field(i) for i in range(target.num_fields)]
        parent_nulls = column.is_null() if column.null_count else None
        children = [
            null_array(len(column), f.type) if f.name.lower() not in by_name
            else _fill_under_nulls(align_array(column.field(by_name[f.name.lower()]), f.type), f, parent_nulls)
            for f in fields
        ]
        return pa.StructArray.from_arrays(children, fields=fields, mask=parent_nulls)
    if pa.types.is_list(target) and (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        values = align_array(column.values, target.value_type)
        offsets = column.offsets.cast(pa.int32())
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=column.is_null() if column.null_count else None)
    if pa.types.is_map(target) and pa.types.is_map(column.type):
        keys = align_array(column.keys, target.key_type)
        items = align_array(column.items, target.item_type)
        aligned = pa.MapArray.from_arrays(column.offsets, keys, items, type=target)
        return aligned if not column.null_count else pc.if_else(column.is_null(), pa.nulls(len(column), target), aligned)
    return column.cast(target)


def constant_array(value: Any, n: int, dtype: pa.DataType) -> pa.Array:
    """`n` copies of `value` (a column default as pyiceberg parses it), or nulls for None."""
    if value is None:
        return null_array(n, dtype)
    return pa.repeat(pa.scalar(value, type=dtype), n)


class BatchAligner:
    """Turns one Spark Arrow batch into a Table of the table's Arrow schema."""

    def __init__(
        self, target: pa.Schema, sources: list[str | None], keys: tuple[str, ...] = (), defaults: Sequence[Any] | None = None
    ):
        """`defaults`: per table column, its v3 `write-default` (None: none), written where
        the DataFrame has no column for it."""
        self._target = target
        self._sources = sources
        self._keys = {k.lower() for k in keys}  # null keys get the keyed path's own error
        self._defaults = list(defaults) if defaults is not None else [None] * len(sources)

    @property
    def schema(self) -> pa.Schema:
        """The table's Arrow schema the rows are aligned to."""
        return self._target

    def align(self, batch: pa.RecordBatch | pa.Table) -> pa.Table:
        n = batch.num_rows
        columns = []
        for field, source, default in zip(self._target, self._sources, self._defaults):
            if source is None:
                columns.append(constant_array(default, n, field.type))
                continue
            column = batch.column(source)
            if not field.nullable and column.null_count and field.name.lower() not in self._keys:
                # Arrow would say "declared non-nullable but contains nulls": name the column
                # and the way out instead.
                raise SchemaError(
                    f"column '{field.name}' is required (NOT NULL) in the table, but {column.null_count} row(s) of "
                    f"this batch hold null in it; drop or fill them first, e.g. df.na.drop(subset=['{source}'])"
                )
            if not column.type.equals(field.type):
                column = align_array(column, field.type)
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self._target)


def align_by_field_id(table: pa.Table, target: pa.Schema) -> pa.Table:
    """A data file's columns as `target` (whose fields carry Parquet field ids): matched by
    field id, so renamed or reordered columns and columns of other engines read right;
    columns the file predates as nulls; promoted types cast; structs aligned by name."""
    by_id = field_ids(table.schema)
    columns = []
    for f in target:
        index = by_id.get(int(f.metadata[FIELD_ID_KEY])) if f.metadata and FIELD_ID_KEY in f.metadata else None
        columns.append(null_array(table.num_rows, f.type) if index is None else align_array(table.column(index), f.type))
    return pa.Table.from_arrays(columns, schema=target)
