"""Schema evolution (`merge_schema`): the table schema that accepts a DataFrame, by Iceberg's rules.

Names match case-insensitively, as Spark resolves them; a name the table lacks is an added
column (a rename is never guessed). What may change:

* new columns, at top level and inside structs (also structs in lists and maps), added as
  optional with fresh field ids (after the table's `last-column-id`, never reused);
* type promotions Iceberg allows: int -> long, float -> double, decimal(P, S) ->
  decimal(P', S) with P' > P, and date -> timestamp on format version 3;
* a required column the DataFrame lacks, or sends as nullable, becomes optional.

Anything else (long -> int, string -> long, a struct sent as a scalar, a primary-key column
changing type) is refused, every offending column named with both types, and the table is
left as it was. Columns the DataFrame omits stay and are written as null.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    IcebergType,
    ListType,
    MapType,
    NestedField,
    PrimitiveType,
    StructType,
    TimestampType,
)
from pyspark.sql import types as T

from lakesink_datasource.schema.spark_types import SchemaError, compatible, convert


@dataclass
class Evolution:
    """The merged schema (ids of new fields assigned) and what changed, in words."""

    schema: Schema
    changes: list[str] = field(default_factory=list)
    last_column_id: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def promotion(table: IcebergType, incoming: IcebergType, format_version: int) -> IcebergType | None:
    """The wider type the table column becomes to hold `incoming`, if Iceberg allows it: the
    widenings a write makes anyway (`compatible`: int -> long, float -> double, a decimal's
    precision), seen from the table's side, plus date -> timestamp from format version 3."""
    if table == incoming or not isinstance(table, PrimitiveType):
        return None
    if compatible(table, incoming):
        return incoming
    if isinstance(table, DateType) and isinstance(incoming, TimestampType) and format_version >= 3:
        return incoming
    return None


class _Merger:
    def __init__(self, last_column_id: int, keys: set[str], format_version: int, relax: bool = True):
        self.ids: Iterator[int] = itertools.count(last_column_id + 1)
        # Nullability: merge_schema makes a column optional when the DataFrame may send
        # nulls; a plain write keeps the table as is and checks the rows (a DataFrame column
        # is often nullable without holding a null).
        self.relax = relax
        self.keys = keys
        self.format_version = format_version
        self.changes: list[str] = []
        self.problems: list[str] = []

    def struct(self, path: str, table: list[NestedField], incoming: T.StructType, ignore: set[str]) -> list[NestedField]:
        by_name = {f.name.lower(): f for f in incoming.fields if f.name.lower() not in ignore}
        out = []
        for f in table:
            sent = by_name.pop(f.name.lower(), None)
            name = f"{path}{f.name}"
            if sent is None:
                if f.required and name.lower() in self.keys:
                    self.problems.append(f"primary key column '{name}' is missing from the DataFrame")
                elif f.required and self.relax:
                    self.changes.append(f"made {name} optional (not in the DataFrame)")
                    f = NestedField(f.field_id, f.name, f.field_type, required=False, doc=f.doc)
                out.append(f)
                continue
            out.append(self.field(name, f, sent))
        for sent in (f for f in incoming.fields if f.name.lower() in by_name):
            name = f"{path}{sent.name}"
            field_id = next(self.ids)
            try:
                added = convert(name, sent.dataType, self.ids)
            except SchemaError as exc:
                self.problems.append(str(exc))
                continue
            out.append(NestedField(field_id, sent.name, added, required=False))
            self.changes.append(f"added {name} ({added})")
        return out

    def field(self, name: str, table: NestedField, sent: T.StructField) -> NestedField:
        key = name.lower() in self.keys
        new_type = self.type(name, table.field_type, sent.dataType, key)
        required = table.required
        if required and sent.nullable and not key and self.relax:
            # A key column stays required: the keyed path refuses null keys with its own error.
            required = False
            self.changes.append(f"made {name} optional (nullable in the DataFrame)")
        return NestedField(table.field_id, table.name, new_type, required=required, doc=table.doc)

    def type(self, name: str, table: IcebergType, sent: T.DataType, key: bool = False) -> IcebergType:
        if isinstance(table, StructType):
            if not isinstance(sent, T.StructType):
                self.problems.append(f"column '{name}': table type {table} cannot become {sent.simpleString()}")
                return table
            return StructType(*self.struct(name + ".", list(table.fields), sent, set()))
        if isinstance(table, ListType):
            if not isinstance(sent, T.ArrayType):
                self.problems.append(f"column '{name}': table type {table} cannot become {sent.simpleString()}")
                return table
            element = self.type(f"{name}.element", table.element_type, sent.elementType)
            element_required = table.element_required and not (sent.containsNull and self.relax)
            if table.element_required and not element_required:
                self.changes.append(f"made {name}.element optional")
            return ListType(table.element_id, element, element_required=element_required)
        if isinstance(table, MapType):
            if not isinstance(sent, T.MapType):
                self.problems.append(f"column '{name}': table type {table} cannot become {sent.simpleString()}")
                return table
            key_type = self.type(f"{name}.key", table.key_type, sent.keyType)
            value = self.type(f"{name}.value", table.value_type, sent.valueType)
            value_required = table.value_required and not (sent.valueContainsNull and self.relax)
            if table.value_required and not value_required:
                self.changes.append(f"made {name}.value optional")
            return MapType(table.key_id, key_type, table.value_id, value, value_required=value_required)
        try:
            incoming = convert(name, sent, itertools.count(1))
        except SchemaError as exc:
            self.problems.append(str(exc))
            return table
        if compatible(incoming, table):
            return table
        wider = promotion(table, incoming, self.format_version)
        if wider is not None and not key:
            self.changes.append(f"promoted {name} {table} -> {wider}")
            return wider
        why = " (primary-key columns cannot change type)" if wider is not None and key else ""
        self.problems.append(f"column '{name}': table type {table} cannot become {incoming}{why}")
        return table


def merge_schema(
    table: Schema,
    incoming: T.StructType,
    *,
    last_column_id: int,
    format_version: int,
    key_columns: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
    relax_nullability: bool = True,
) -> Evolution:
    """The table schema widened to accept `incoming` (SchemaError naming every column that
    cannot be merged). `ignore`: DataFrame columns that are not stored (the cdc op column)."""
    merger = _Merger(last_column_id, {k.lower() for k in key_columns}, format_version, relax_nullability)
    fields = merger.struct("", list(table.fields), incoming, {c.lower() for c in ignore})
    if merger.problems:
        raise SchemaError("the DataFrame cannot be merged into the table's schema: " + "; ".join(merger.problems))
    if not merger.changes:
        return Evolution(table, [], last_column_id)
    schema = Schema(*fields, schema_id=table.schema_id + 1, identifier_field_ids=list(table.identifier_field_ids))
    return Evolution(schema, merger.changes, max(last_column_id, schema.highest_field_id))


def describe_differences(table: Schema, incoming: T.StructType, *, format_version: int, ignore: tuple[str, ...] = ()) -> str | None:
    """Without `merge_schema`: each column where the DataFrame and the table differ, and
    whether `merge_schema` would accept it; None when they agree."""
    try:
        evolution = merge_schema(
            table, incoming, last_column_id=table.highest_field_id, format_version=format_version, ignore=ignore,
            relax_nullability=False,
        )
    except SchemaError as exc:
        return str(exc)
    if not evolution.changed:
        return None
    return (
        "the DataFrame's columns differ from the table's: " + "; ".join(evolution.changes)
        + " would be needed; option merge_schema=true evolves the table with the write"
    )
