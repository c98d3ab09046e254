"""Metadata tables from Spark, named as Iceberg names them, equal to pyiceberg's inspect of
the same table; lakesink's own figures per snapshot."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from lakesink_testing import load

from lakesink_datasource.maintain import maintain_table
from lakesink_datasource.options import OptionError
from lakesink_datasource.read.metadata_tables import ICEBERG_TABLES, METADATA_TABLES, resolve, resolve_schema
from lakesink_datasource.read.options import parse_read_options


@pytest.fixture
def upserted(spark, warehouse: str) -> str:  # type: ignore[no-untyped-def]
    """Three upsert batches into a table partitioned by p: 4 rows, then 2 updates + 1 new, then 1 update."""
    options = {"warehouse": warehouse, "operation": "upsert", "primary_key": "id", "partition_by": "p", "progress": "false"}
    for rows in ([(1, "a"), (2, "a"), (3, "b"), (4, "b")], [(1, "a"), (3, "b"), (5, "b")], [(2, "a")]):
        spark.createDataFrame(rows, "id long, p string").write.format("lakesink").options(**options).mode("append").save("db.t")
    return warehouse


@pytest.mark.parametrize("name", [t for t in ICEBERG_TABLES if t != "entries"])  # pyiceberg's entries fails on DVs
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


def _entries(spark, warehouse: str, table: str) -> list:  # type: ignore[no-untyped-def]
    return spark.read.format("lakesink").option("warehouse", warehouse).load(f"{table}.entries").collect()


def test_entries_equal_pyiceberg_s_where_it_reads_them(spark, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    """Appends then a full compaction: ADDED, EXISTING and DELETED entries, no DVs (which
    pyiceberg's entries cannot read)."""
    for i in range(3):
        spark.createDataFrame([(i, "a"), (10 + i, "b")], "id long, p string").write.format("lakesink").option(
            "warehouse", warehouse).option("partition_by", "p").option("maintenance", "off").mode("append").save("db.plain")
    maintain_table(load(warehouse, "db.plain"), "compact")
    expected = load(warehouse, "db.plain").inspect.entries().to_pylist()
    got = [r.asDict(recursive=True) for r in _entries(spark, warehouse, "db.plain")]
    assert {r["status"] for r in got} == {1, 2}, "the compaction's own entries: its file added, the merged ones deleted"

    def comparable(row: dict) -> str:
        # A file without a metric: null here and in Iceberg Java, an empty map in pyiceberg;
        # bounds are bytes (PySpark 4.0 hands binary values over as bytearray).
        data_file = {k: (dict(v) or None if v is not None and k.endswith(("counts", "sizes", "bounds")) else v)
                     for k, v in row["data_file"].items() if k in expected[0]["data_file"]}
        data_file = {k: {i: bytes(b) for i, b in v.items()} if k.endswith("bounds") and v else v for k, v in data_file.items()}
        return repr({**{k: row[k] for k in ("status", "snapshot_id", "sequence_number", "file_sequence_number")},
                     "data_file": dict(sorted(data_file.items())), "readable_metrics": row["readable_metrics"]})

    assert sorted(map(comparable, got)) == sorted(map(comparable, expected))


def test_entries_show_deletion_vectors_and_row_lineage(spark, upserted: str) -> None:  # type: ignore[no-untyped-def]
    entries = _entries(spark, upserted, "db.t")
    live = [e.data_file for e in entries if e.status != 2]
    files = load(upserted, "db.t").inspect.files().to_pylist()
    assert sorted((f.file_path, f.record_count) for f in live) == sorted((f["file_path"], f["record_count"]) for f in files)
    data = [f for f in live if f.content == 0]
    dvs = [f for f in live if f.content == 1]
    assert dvs and all(f.file_format == "PUFFIN" and f.content_size_in_bytes > 0 for f in dvs)
    assert {f.referenced_data_file for f in dvs} <= {f.file_path for f in data}
    # Row lineage: every data file owns its own range of row ids
    ranges = sorted((f.first_row_id, f.first_row_id + f.record_count) for f in data)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(ranges))


@pytest.mark.parametrize("name", METADATA_TABLES)
def test_each_metadata_table_s_columns_are_known_without_building_it(upserted: str, name: str) -> None:
    """Spark asks for the columns in one process and reads in another: the columns given
    first are exactly those of the table built later."""
    options = parse_read_options({"table": f"db.t.{name}", "warehouse": upserted})
    built = resolve(options)
    assert built is not None and built.num_rows > 0
    assert resolve_schema(options) == built.schema
