"""Rows through Spark's pandas stateful operator, exactly.

`cluster_by_key` runs a keyed stream's writing inside `applyInPandasWithState`, the one
Python operator whose tasks Spark keeps on their executor. PySpark hands that operator
pandas frames, and pandas loses some values on the way: a bigint column with nulls becomes
float64 (integers past 2^53 change), a NaN and a null of a double become the same NaN, and
a timestamp becomes a naive wall-clock time of the session's time zone (a DST hour is
ambiguous). So those columns are carried in forms pandas keeps exact, built in the JVM
before the operator (`encode`) and undone in the task (`RowCodec.decode`):

- a nullable 64-bit column (bigint, timestamp as microseconds since the epoch) as two
  columns of its high and low 32 bits: each fits a float64 exactly, nulls stay NaN;
- a nullable float or double as its value plus a null flag;
- a timestamp (without nulls too) as its microseconds.

Every other supported type (booleans, smaller integers, decimals, dates, strings, binaries,
and structs, arrays and maps of those) reaches pandas as exact Python values. Nested
timestamps, floats and doubles are refused: pandas would change them inside the nesting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lakesink_datasource.errors import LakesinkError

_PREFIX = "__lakesink_enc_"


class RouteTypeError(LakesinkError, TypeError):
    """A column whose type the route cannot carry exactly."""


@dataclass(frozen=True)
class _Carried:
    name: str  # the DataFrame's column
    how: str  # "plain", "split" (hi/lo of a 64-bit value), "flagged" (value + null flag)
    spark_type: str  # simpleString of the column's type, for the decoder
    arrow_type: pa.DataType


def _leaf_check(name: str, dt: Any) -> None:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        ByteType,
        DateType,
        DecimalType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructType,
    )

    if isinstance(dt, StructType):
        for field in dt.fields:
            _leaf_check(f"{name}.{field.name}", field.dataType)
    elif isinstance(dt, ArrayType):
        _leaf_check(f"{name}[]", dt.elementType)
    elif isinstance(dt, MapType):
        _leaf_check(f"{name}{{key}}", dt.keyType)
        _leaf_check(f"{name}{{value}}", dt.valueType)
    elif not isinstance(dt, (BinaryType, BooleanType, ByteType, DateType, DecimalType, IntegerType, LongType, ShortType, StringType)):
        raise RouteTypeError(
            f"column '{name}' has type {dt.simpleString()}, which cluster_by_key cannot carry exactly through Spark's "
            "stateful operator (pandas changes timestamps, floats and doubles inside structs, arrays and maps, and "
            "other types are not supported); make it a top-level column, or write the stream without cluster_by_key"
        )


class RowCodec:
    """How each column of a DataFrame crosses the pandas operator: the Spark columns that
    carry it (`encode`) and the Arrow batch the task gets back (`decode`)."""

    def __init__(self, spark_schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import DoubleType, FloatType, LongType, TimestampNTZType, TimestampType

        self.schema = spark_schema
        carried = []
        for field in spark_schema.fields:
            dt = field.dataType
            if isinstance(dt, TimestampType):
                how, arrow = "split", pa.timestamp("us", tz="UTC")
            elif isinstance(dt, TimestampNTZType):
                how, arrow = "split", pa.timestamp("us")
            elif isinstance(dt, LongType):
                how, arrow = ("split" if field.nullable else "plain"), pa.int64()
            elif isinstance(dt, (FloatType, DoubleType)):
                how, arrow = ("flagged" if field.nullable else "plain"), (pa.float32() if isinstance(dt, FloatType) else pa.float64())
            else:
                _leaf_check(field.name, dt)
                how, arrow = "plain", to_arrow_type(dt)
            carried.append(_Carried(field.name, how, dt.simpleString(), arrow))
        self._carried = carried

    def encode(self, df: Any) -> Any:
        """`df` with every column in the form that crosses pandas exactly."""
        from pyspark.sql import functions as F

        columns = []
        for i, c in enumerate(self._carried):
            source = F.col(f"`{c.name}`")
            if c.how == "plain":
                columns.append(source)
                continue
            if c.how == "flagged":
                columns += [source, source.isNull().alias(f"{_PREFIX}{i}_null")]
                continue
            if c.spark_type == "timestamp":
                micros = F.unix_micros(source)
            elif c.spark_type == "timestamp_ntz":
                micros = F.expr(f"timestampdiff(MICROSECOND, TIMESTAMP_NTZ'1970-01-01 00:00:00', `{c.name}`)")
            else:
                micros = source
            columns += [F.shiftright(micros, 32).alias(f"{_PREFIX}{i}_hi"), micros.bitwiseAND(F.lit(0xFFFFFFFF)).alias(f"{_PREFIX}{i}_lo")]
        return df.select(*columns)

    def decode(self, frame: Any) -> pa.RecordBatch:
        """A frame the operator got, back to the DataFrame's columns and values in Arrow."""
        arrays: list[pa.Array] = []
        for i, c in enumerate(self._carried):
            if c.how == "plain":
                arrays.append(_plain(frame[c.name], c.arrow_type))
            elif c.how == "flagged":
                values = frame[c.name].to_numpy(dtype=np.float64, na_value=np.nan)
                null = frame[f"{_PREFIX}{i}_null"].to_numpy(dtype=bool)
                arrays.append(pa.array(values, mask=null).cast(c.arrow_type))
            else:
                arrays.append(_joined(frame[f"{_PREFIX}{i}_hi"], frame[f"{_PREFIX}{i}_lo"], c.arrow_type))
        return pa.RecordBatch.from_arrays(arrays, names=[c.name for c in self._carried])


def _plain(series: Any, arrow_type: pa.DataType) -> pa.Array:
    if pa.types.is_integer(arrow_type) and series.dtype.kind == "f":
        # Nulls made the column float64; every value is an integer below 2^53 (bigints are split).
        values = series.to_numpy(dtype=np.float64)
        nulls = np.isnan(values)
        return pa.array(np.where(nulls, 0, values).astype(arrow_type.to_pandas_dtype()), mask=nulls, type=arrow_type)
    return pa.Array.from_pandas(series, type=arrow_type)


def _joined(hi: Any, lo: Any, arrow_type: pa.DataType) -> pa.Array:
    high = hi.to_numpy(dtype=np.float64, na_value=np.nan)
    nulls = np.isnan(high)
    high_bits = np.where(nulls, 0, high).astype(np.int64)
    low_bits = np.where(nulls, 0, lo.to_numpy(dtype=np.float64, na_value=np.nan)).astype(np.int64)
    values = (high_bits << np.int64(32)) + low_bits
    return pa.array(values, mask=nulls if nulls.any() else None, type=pa.int64()).cast(arrow_type)


DecodeFrame = Callable[[Any], pa.RecordBatch]
