"""Every error a user can act on is a LakesinkError, and keeps its builtin base."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from lakesink_datasource import LakesinkError
from lakesink_datasource.iceberg.row_filter import parse_filter
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task


def test_bad_options_are_caught_as_lakesink_errors_and_as_value_errors(warehouse: str) -> None:
    for handler in (LakesinkError, ValueError, OptionError):
        with pytest.raises(handler, match="partition_by"):
            parse_options({"table": "db.t", "warehouse": warehouse, "partitionby": "id"})


def test_a_keyed_write_with_a_null_key_raises_a_lakesink_error(warehouse: str) -> None:
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
    plan = plan_write(
        parse_options({"table": "db.t", "warehouse": warehouse, "operation": "upsert", "primary_key": "id", "progress": "false"}),
        schema, False,
    )
    batch = pa.record_batch({"id": pa.array([1, None], pa.int64()), "v": pa.array(["a", "b"])})
    with pytest.raises(LakesinkError, match="id"):
        write_task(plan, iter([batch]), who=TaskIdentity())


def test_a_filter_that_cannot_be_parsed_is_a_lakesink_error() -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    schema = Schema(NestedField(1, "id", LongType(), required=False))
    with pytest.raises(LakesinkError, match="nope"):
        parse_filter("id >>> nope", schema)
