"""Rows into Arrow batches, for PySpark 4.0's stream sinks.

PySpark 4.0 has no `DataSourceStreamArrowWriter`: a Python stream sink is handed Spark `Row`
objects (tuples), one per row. lakesink's tasks take Arrow batches, so the rows are turned
into batches of the sink's Arrow schema, column by column (a `Row` is a tuple: `zip(*rows)`
transposes a chunk at C speed, and `pa.array` converts a column in one call). Timestamps come
as naive datetimes in the Python worker's local time (PySpark's conversion): they are made
aware before Arrow reads them as UTC.
"""

from __future__ import annotations

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
            pa.array(_aware(column) if local else list(column), type=field.type)
            for column, field, local in zip(columns, target, local_time)
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=target)
