"""Iceberg schema -> Spark StructType (for `CREATE TABLE ... USING lakesink` without columns)."""

from __future__ import annotations

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
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)
from pyspark.sql import types as T

from lakesink_datasource.schema.spark_types import SPARK_TIME


def _spark(t: IcebergType) -> T.DataType:
    simple = {
        BooleanType: T.BooleanType(),
        IntegerType: T.IntegerType(),
        LongType: T.LongType(),
        FloatType: T.FloatType(),
        DoubleType: T.DoubleType(),
        StringType: T.StringType(),
        BinaryType: T.BinaryType(),
        DateType: T.DateType(),
        TimestampType: T.TimestampNTZType(),
        TimestamptzType: T.TimestampType(),
    }
    for cls, spark_type in simple.items():
        if isinstance(t, cls):
            return spark_type
    if isinstance(t, TimeType) and SPARK_TIME is not None:
        return SPARK_TIME(6)  # type: ignore[call-arg]  # PySpark 4.1+: time(precision)
    if isinstance(t, DecimalType):
        return T.DecimalType(t.precision, t.scale)
    if isinstance(t, ListType):
        return T.ArrayType(_spark(t.element_type), not t.element_required)
    if isinstance(t, MapType):
        return T.MapType(_spark(t.key_type), _spark(t.value_type), not t.value_required)
    if isinstance(t, StructType):
        return T.StructType([T.StructField(f.name, _spark(f.field_type), not f.required) for f in t.fields])
    raise TypeError(f"Iceberg type {t} has no Spark equivalent in lakesink")


def iceberg_to_spark(schema: Schema) -> T.StructType:
    return T.StructType([T.StructField(f.name, _spark(f.field_type), not f.required) for f in schema.fields])
