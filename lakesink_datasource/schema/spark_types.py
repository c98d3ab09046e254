"""Spark SQL types -> Iceberg types, and the compatibility check against an existing table.

Runs on the driver before any task starts, so a DataFrame that cannot be stored fails
with the column named and nothing written.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)
from pyspark.sql import types as T

from lakesink_datasource.errors import LakesinkError


class SchemaError(LakesinkError, ValueError):
    """The DataFrame's schema cannot be written to the table. Raised before writing."""


class UnsupportedTypeError(SchemaError):
    pass


# Spark's time of day (PySpark 4.1+; 4.0 has none): Iceberg's `time`, in microseconds.
SPARK_TIME: type[T.DataType] | None = getattr(T, "TimeType", None)


def convert(path: str, dt: T.DataType, ids: Iterator[int]) -> IcebergType:
    """The Iceberg type of Spark type `dt` (column `path`, for errors), nested ids from `ids`."""
    # Spark's TimestampType is an instant (Iceberg timestamptz), TimestampNTZType a
    # local date-time (Iceberg timestamp): the same mapping Iceberg's Spark runtime uses.
    simple: list[tuple[type, IcebergType]] = [
        (T.BooleanType, BooleanType()),
        (T.ByteType, IntegerType()),
        (T.ShortType, IntegerType()),
        (T.IntegerType, IntegerType()),
        (T.LongType, LongType()),
        (T.FloatType, FloatType()),
        (T.DoubleType, DoubleType()),
        (T.StringType, StringType()),
        (T.CharType, StringType()),
        (T.VarcharType, StringType()),
        (T.BinaryType, BinaryType()),
        (T.DateType, DateType()),
        (T.TimestampNTZType, TimestampType()),
        (T.TimestampType, TimestamptzType()),
    ]
    for spark_cls, iceberg_type in simple:
        if type(dt) is spark_cls:
            return iceberg_type
    if SPARK_TIME is not None and isinstance(dt, SPARK_TIME):
        return TimeType()  # Spark's time(p) has p <= 6: microseconds hold it
    if isinstance(dt, T.DecimalType):
        if dt.precision > 38:
            raise UnsupportedTypeError(f"column '{path}': decimal precision {dt.precision} > 38 is not supported")
        return DecimalType(dt.precision, dt.scale)
    if isinstance(dt, T.ArrayType):
        element_id = next(ids)
        return ListType(element_id, convert(f"{path}.element", dt.elementType, ids), element_required=not dt.containsNull)
    if isinstance(dt, T.MapType):
        key_id, value_id = next(ids), next(ids)
        return MapType(
            key_id,
            convert(f"{path}.key", dt.keyType, ids),
            value_id,
            convert(f"{path}.value", dt.valueType, ids),
            value_required=not dt.valueContainsNull,
        )
    if isinstance(dt, T.StructType):
        return StructType(*_fields(path + ".", dt, ids))
    raise UnsupportedTypeError(
        f"column '{path}' has type {dt.simpleString()}, which lakesink cannot store in Iceberg "
        "(supported: boolean, integral, float, double, decimal, string, binary, date, timestamp, "
        f"timestamp_ntz{', time' if SPARK_TIME is not None else ''}, array, map, struct)"
    )


def _fields(prefix: str, struct: T.StructType, ids: Iterator[int]) -> list[NestedField]:
    out = []
    for f in struct.fields:
        field_id = next(ids)
        out.append(NestedField(field_id, f.name, convert(prefix + f.name, f.dataType, ids), required=not f.nullable))
    return out


def spark_to_iceberg_schema(struct: T.StructType, identifier_columns: tuple[str, ...] = ()) -> Schema:
    """Convert a DataFrame schema; the catalog reassigns fresh ids on create anyway."""
    ids = itertools.count(1)
    fields = _fields("", struct, ids)
    lowered = {c.lower() for c in identifier_columns}
    # Identifier fields must be required; nulls in them are rejected at write time.
    fields = [
        NestedField(f.field_id, f.name, f.field_type, required=True, doc=f.doc) if f.name.lower() in lowered else f
        for f in fields
    ]
    for f in fields:
        if f.name.lower() in lowered and (not isinstance(f.field_type, PrimitiveType) or isinstance(f.field_type, (FloatType, DoubleType))):
            raise SchemaError(
                f"primary key column '{f.name}' has type {f.field_type}, which cannot be a key "
                "(use an integer, string, date, timestamp, decimal, binary or boolean column)"
            )
    identifier_ids = [f.field_id for f in fields if f.name.lower() in lowered]
    return Schema(*fields, identifier_field_ids=identifier_ids)


def check_dataframe_columns(struct: T.StructType) -> None:
    """Columns a table can be made of: at least one, names unique ignoring case (Iceberg
    matches names case-insensitively here, so `a` and `A` would write one column twice)."""
    if not struct.fields:
        raise SchemaError("the DataFrame has no columns: an Iceberg table needs at least one")
    seen: dict[str, str] = {}
    for f in struct.fields:
        other = seen.setdefault(f.name.lower(), f.name)
        if other != f.name or [g.name for g in struct.fields].count(f.name) > 1:
            raise SchemaError(f"DataFrame columns '{other}' and '{f.name}' differ only in case (or repeat): rename one")


def compatible(source: IcebergType, target: IcebergType) -> bool:
    if source == target:
        return True
    if isinstance(source, IntegerType) and isinstance(target, LongType):
        return True
    if isinstance(source, FloatType) and isinstance(target, DoubleType):
        return True
    if isinstance(source, DecimalType) and isinstance(target, DecimalType):
        return source.scale == target.scale and source.precision <= target.precision
    if isinstance(source, ListType) and isinstance(target, ListType):
        return compatible(source.element_type, target.element_type)
    if isinstance(source, MapType) and isinstance(target, MapType):
        return compatible(source.key_type, target.key_type) and compatible(source.value_type, target.value_type)
    if isinstance(source, StructType) and isinstance(target, StructType):
        # Nested fields match by name (as top-level columns do): each one sent must exist and
        # fit; the target's fields not sent are written as null, so they must be optional.
        targets = {f.name.lower(): f for f in target.fields}
        sent = {f.name.lower() for f in source.fields}
        for f in source.fields:
            t = targets.get(f.name.lower())
            if t is None or not compatible(f.field_type, t.field_type):
                return False
        return all(not t.required for name, t in targets.items() if name not in sent)
    return False


def column_mapping(struct: T.StructType, table_schema: Schema, ignore: tuple[str, ...] = ()) -> list[str | None]:
    """For each top-level table column, the DataFrame column that feeds it (None: write its
    v3 `write-default`, else nulls).

    Raises SchemaError naming the column when the DataFrame has a column the table lacks,
    a type the table column cannot hold, or misses a required table column. Column names
    match case-insensitively, as Spark resolves them.
    """
    ignored = {c.lower() for c in ignore}
    by_name = {f.name.lower(): f for f in table_schema.fields}
    source_by_table: dict[str, str] = {}
    ids = itertools.count(1)
    for spark_field in struct.fields:
        if spark_field.name.lower() in ignored:
            continue
        target = by_name.get(spark_field.name.lower())
        if target is None:
            raise SchemaError(
                f"column '{spark_field.name}' is not in the table (table columns: "
                f"{', '.join(f.name for f in table_schema.fields)}); option merge_schema=true adds it"
            )
        source_type = convert(spark_field.name, spark_field.dataType, ids)
        if not compatible(source_type, target.field_type):
            raise SchemaError(
                f"column '{spark_field.name}' has type {spark_field.dataType.simpleString()} ({source_type}), "
                f"which cannot be written to table column '{target.name}' of type {target.field_type}"
            )
        source_by_table[target.name] = spark_field.name
    mapping: list[str | None] = []
    for f in table_schema.fields:
        source = source_by_table.get(f.name)
        if source is None and f.required and f.write_default is None:
            raise SchemaError(
                f"required table column '{f.name}' is missing from the DataFrame (add it, or write with option "
                "merge_schema=true, which makes it optional)"
            )
        mapping.append(source)
    return mapping
