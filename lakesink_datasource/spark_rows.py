"""Rows into Arrow batches, for PySpark 4.0's stream sinks.

PySpark 4.0 has no `DataSourceStreamArrowWriter`: a Python stream sink is handed Spark `Row`
objects (tuples), one per row. lakesink's tasks take Arrow batches, so the rows are turned
into batches of the sink's Arrow schema, column by column (a `Row` is a tuple: `zip(*rows)`
transposes a chunk at C speed, and `pa.array` converts a column in one call). Timestamps come
as naive datetimes in the Python worker's local time (PySpark's conversion): they are made
aware before Arrow reads them as UTC. Where the worker's local time is UTC (no offset, no
daylight saving: most clusters and containers) a naive datetime already is the UTC time, and
the column converts in one call; elsewhere each value is made aware in Python (about 1.5 us
a value, most of what a timestamp column costs here).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from itertools import islice
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType, TimestampType

from lakesink_datasource.spark_version import to_arrow_schema

CHUNK_ROWS = 10_000  # Spark's own default Arrow batch size (spark.sql.execution.arrow.maxRecordsPerBatch)


def _aware(values: tuple[Any, ...]) -> list[Any]:
    return [v.astimezone(timezone.utc) if isinstance(v, datetime) and v.tzinfo is None else v for v in values]


def _local_time_is_utc() -> bool:
    return time.timezone == 0 and time.altzone == 0 and not time.daylight


def _timestamps(values: tuple[Any, ...], field: pa.Field) -> pa.Array:
    """A column of PySpark's naive local datetimes as UTC timestamps of `field`'s type."""
    if _local_time_is_utc():
        naive = pa.array(values, type=pa.timestamp(field.type.unit))
        return naive.cast(field.type)  # the same instants, now labelled UTC
    return pa.array(_aware(values), type=field.type)


def arrow_batches(rows: Iterable[Any], schema: StructType, chunk_rows: int = CHUNK_ROWS) -> Iterator[pa.RecordBatch]:
    """`rows` (Spark Rows of `schema`) as Arrow record batches of up to `chunk_rows` rows."""
    target = to_arrow_schema(schema)
    local_time = [isinstance(f.dataType, TimestampType) for f in schema.fields]
    iterator = iter(rows)
    while True:
        chunk = list(islice(iterator, chunk_rows))
        if not chunk:
            return
        columns = list(zip(*chunk))
        arrays = [
            _timestamps(column, field) if local else pa.array(column, type=field.type)
            for column, field, local in zip(columns, target, local_time)
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=target)
