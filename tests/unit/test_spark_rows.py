"""PySpark 4.0's stream sinks get Rows: `arrow_batches` turns them into the sink's Arrow
batches (checked against values built by hand, not by the code under test)."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

from lakesink_datasource.spark_rows import arrow_batches

SCHEMA = T.StructType([
    T.StructField("id", T.LongType()), T.StructField("name", T.StringType()), T.StructField("ts", T.TimestampType()),
    T.StructField("day", T.DateType()), T.StructField("price", T.DecimalType(10, 2)),
    T.StructField("point", T.StructType([T.StructField("x", T.DoubleType()), T.StructField("y", T.DoubleType())])),
    T.StructField("tags", T.ArrayType(T.StringType())),
])


def _local_time(zone: str) -> Iterator[None]:
    """A Python worker whose local time is `zone`: PySpark hands it naive local datetimes."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.fixture
def in_new_york() -> Iterator[None]:
    yield from _local_time("America/New_York")


@pytest.fixture
def in_utc() -> Iterator[None]:
    yield from _local_time("UTC")


def test_rows_and_their_timestamps_convert(in_new_york: object) -> None:
    # 2024-01-02 07:30 in New York is 12:30 UTC: what Spark's Row gives a worker there.
    local = dt.datetime(2024, 1, 2, 7, 30)
    rows = [
        Row(1, "a", local, dt.date(2024, 1, 2), Decimal("1.50"), Row(1.0, 2.0), ["p", "q"]),
        Row(2, None, None, None, None, None, None),
    ] * 3
    batches = list(arrow_batches(iter(rows), SCHEMA, chunk_rows=4))
    assert [b.num_rows for b in batches] == [4, 2]
    table = pa.Table.from_batches(batches)
    assert table.column("ts").type == pa.timestamp("us", tz="UTC")
    first = table.slice(0, 2).to_pylist()
    assert first[0]["ts"] == dt.datetime(2024, 1, 2, 12, 30, tzinfo=dt.timezone.utc)
    assert first[0]["point"] == {"x": 1.0, "y": 2.0} and first[0]["tags"] == ["p", "q"]
    assert first[0]["price"] == Decimal("1.50") and first[0]["day"] == dt.date(2024, 1, 2)
    assert first[1] == {"id": 2, "name": None, "ts": None, "day": None, "price": None, "point": None, "tags": None}


def test_a_utc_workers_timestamps_convert_as_they_are(in_utc: object) -> None:
    """A worker whose local time is UTC gets naive UTC datetimes (converted in one call)."""
    rows = [Row(1, "a", dt.datetime(2024, 7, 1, 23, 59, 59, 123456), None, None, None, None), Row(2, None, None, None, None, None, None)]
    table = pa.Table.from_batches(list(arrow_batches(iter(rows), SCHEMA)))
    assert table.column("ts").type == pa.timestamp("us", tz="UTC")
    assert table.column("ts").to_pylist() == [dt.datetime(2024, 7, 1, 23, 59, 59, 123456, tzinfo=dt.timezone.utc), None]


def test_no_rows_no_batches() -> None:
    assert list(arrow_batches(iter([]), SCHEMA)) == []
