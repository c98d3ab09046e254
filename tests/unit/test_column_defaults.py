"""v3 column defaults (issue 45, part 5): `write-default` fills a column the DataFrame
omits, `initial-default` is what files written before the column existed read as.

The defaults are set the way another engine sets them: a schema change committed to the
table's metadata (a required `c long` with initial-default 5 and write-default 7, an
optional `d string` with "init" and "wr"), after lakesink wrote rows without them.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from lakesink_testing import duckdb_rows, load, pyiceberg_rows
from pyiceberg.schema import Schema
from pyiceberg.table.update import AddSchemaUpdate, SetCurrentSchemaUpdate
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import types as T

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "c", "d"]


def _write(warehouse: str, ids: list[int], **options: str) -> None:
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse, "progress": "false", **options}), SCHEMA, False)
    rows = pa.RecordBatch.from_pylist([{"id": i, "v": str(i)} for i in ids], schema=ARROW)
    commit_write(plan, decode_messages([write_task(plan, iter([rows]), TaskIdentity())]), None)


def _add_columns_with_defaults(warehouse: str) -> None:
    table = load(warehouse, "db.t")
    old = table.metadata.schema()
    new = Schema(
        *old.fields,
        NestedField(3, "c", LongType(), required=True, initial_default=5, write_default=7),
        NestedField(4, "d", StringType(), required=False, initial_default="init", write_default="wr"),
        schema_id=old.schema_id + 1,
    )
    sql_commit.commit(table, (), (AddSchemaUpdate(schema_=new, last_column_id=4), SetCurrentSchemaUpdate(schema_id=-1)))


@pytest.fixture
def evolved(warehouse: str) -> str:
    _write(warehouse, [1, 2])
    _add_columns_with_defaults(warehouse)
    return warehouse


def test_a_write_that_omits_columns_writes_their_write_defaults(evolved: str) -> None:
    _write(evolved, [3, 4])  # `c` is required, yet a DataFrame without it is taken: it has a default
    _write(evolved, [5], operation="upsert", primary_key="id", index_dir=f"{evolved}/idx")
    table = load(evolved, "db.t")
    expected = {(1, 5, "init"), (2, 5, "init"), (3, 7, "wr"), (4, 7, "wr"), (5, 7, "wr")}
    assert set(duckdb_rows(table.metadata_location, COLUMNS)) == expected
    assert set(pyiceberg_rows(table, COLUMNS)) == expected


def test_spark_reads_older_files_with_the_initial_default(spark, evolved: str) -> None:  # type: ignore[no-untyped-def]
    """Files without the columns are projected by pyiceberg in lakesink's reader, which applies
    the initial-default: checked here, since a later change of that path must keep it."""
    _write(evolved, [3])
    got = spark.read.format("lakesink").option("warehouse", evolved).load("db.t").select(*COLUMNS).collect()
    assert sorted(tuple(r) for r in got) == [(1, 5, "init"), (2, 5, "init"), (3, 7, "wr")]
