"""Metadata tables from Spark, named as Iceberg names them, equal to pyiceberg's inspect of
the same table; lakesink's own figures per snapshot."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lakesink_testing import load

from lakesink_datasource.options import OptionError
from lakesink_datasource.read.metadata_tables import ICEBERG_TABLES


@pytest.fixture
def upserted(spark, warehouse: str) -> str:  # type: ignore[no-untyped-def]
    """Three upsert batches into a table partitioned by p: 4 rows, then 2 updates + 1 new, then 1 update."""
    options = {"warehouse": warehouse, "operation": "upsert", "primary_key": "id", "partition_by": "p", "progress": "false"}
    for rows in ([(1, "a"), (2, "a"), (3, "b"), (4, "b")], [(1, "a"), (3, "b"), (5, "b")], [(2, "a")]):
        spark.createDataFrame(rows, "id long, p string").write.format("lakesink").options(**options).mode("append").save("db.t")
    return warehouse


@pytest.mark.parametrize("name", ICEBERG_TABLES)
def test_each_metadata_table_equals_pyiceberg_s_inspect(spark, upserted: str, name: str) -> None:  # type: ignore[no-untyped-def]
    got = spark.read.format("lakesink").option("warehouse", upserted).load(f"db.t.{name}").toArrow()
    expected = getattr(load(upserted, "db.t").inspect, name)()
    assert got.column_names == expected.column_names
    assert got.num_rows == expected.num_rows > 0
    assert _rows(got) == _rows(expected.cast(got.schema))


def _rows(table: pa.Table) -> list:
    return sorted(map(repr, table.to_pylist()))


def test_a_view_over_snapshots_answers_sql(spark, upserted: str) -> None:  # type: ignore[no-untyped-def]
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW t_snapshots USING lakesink OPTIONS (table 'db.t.snapshots', warehouse '{upserted}')")
    operations = [r.operation for r in spark.sql("SELECT operation FROM t_snapshots ORDER BY committed_at, snapshot_id").collect()]
    assert operations == ["append", "overwrite", "overwrite"]


def test_lakesink_history_has_each_batch_s_figures(spark, upserted: str) -> None:  # type: ignore[no-untyped-def]
    rows = spark.read.format("lakesink").option("warehouse", upserted).load("db.t.lakesink_history").collect()
    assert [(r.rows_in, r.added_records, r.rows_hidden) for r in rows] == [(4, 4, None), (3, 3, 2), (1, 1, 1)]
    assert [r.live_records for r in rows] == [4, 5, 5]  # what the model of the upserts holds after each batch
    assert all(r.lakesink_version and not r.compaction and r.is_current_ancestor for r in rows)
    assert all(r.index_seconds is not None and r.index_seconds >= 0 for r in rows)


def test_time_travel_options_on_a_metadata_table_are_refused(spark, upserted: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=r"metadata table db\.t\.snapshots shows the table's current metadata") as refused:
        spark.read.format("lakesink").option("warehouse", upserted).option("snapshot_id", "1").load("db.t.snapshots").collect()
    assert OptionError.__name__ in str(refused.value)
