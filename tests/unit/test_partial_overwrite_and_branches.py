"""Partial overwrites (`overwrite_mode=dynamic`, `replace_where`) and branch writes (`branch`, then
`publish_branch`), driven through the production path without Spark (plan_write -> write_task ->
the driver's commit); tests/integration/test_batch_and_sql.py runs them through df.write.

Every expected table content is written out by hand from the rows the test wrote, and read
back by DuckDB and pyiceberg."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, duckdb_connection, expected_rows, load, rows
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.datasource import _commit
from lakesink_datasource.iceberg.compat import v3_metadata_writes
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.publish import PublishError, publish_branch
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task
from lakesink_datasource.write.task_writers import ReplaceWhereError

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("region", T.StringType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("region", pa.string()), ("v", pa.string())])
COLUMNS = ["id", "region", "v"]


def _rows(ids: Iterable[int], region: str, tag: str) -> list[dict]:
    return [{"id": i, "region": region, "v": f"{tag}{i}"} for i in ids]


def _write(warehouse: str, records: list[dict], *, overwrite: bool = False, tasks: int = 1, **options: str) -> None:
    plan = plan_write(parse_options({"table": IDENT, "warehouse": warehouse, "progress": "false", **options}), SCHEMA, overwrite)
    messages = []
    for t in range(tasks):
        part = records[t::tasks]
        batches = [pa.RecordBatch.from_pylist(part, schema=ARROW)] if part else []
        messages.append(write_task(plan, iter(batches)))
    _commit(plan, messages, None)


def _data_files(warehouse: str) -> set[str]:
    return {str(p) for p in Path(warehouse, "db", "t", "data").rglob("*.parquet")}


def _summary(warehouse: str) -> dict[str, str]:
    snapshot = load(warehouse, IDENT).metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return dict(snapshot.summary.additional_properties) | {"operation": snapshot.summary.operation.value}


EU, US, AP = _rows(range(0, 10), "eu", "a"), _rows(range(10, 20), "us", "a"), _rows(range(20, 30), "ap", "a")


def test_dynamic_overwrite_replaces_only_the_partitions_it_writes(warehouse: str) -> None:
    _write(warehouse, EU + US + AP, tasks=2, partition_by="region")
    _write(warehouse, _rows(range(100, 103), "eu", "b"), tasks=2)  # a second eu file
    new_eu = _rows(range(0, 4), "eu", "new")
    new_jp = _rows(range(50, 52), "jp", "new")
    _write(warehouse, new_eu + new_jp, overwrite=True, overwrite_mode="dynamic")

    assert_readers_see(warehouse, IDENT, expected_rows(new_eu + new_jp + US + AP, COLUMNS), COLUMNS)
    summary = _summary(warehouse)
    assert summary["operation"] == "overwrite"
    assert summary["deleted-records"] == "13"  # the 10 + 3 eu rows; us and ap untouched
    assert summary["changed-partition-count"] == "2"  # eu (replaced) and jp (new)
    assert check_table(load(warehouse, IDENT)) == []


def test_dynamic_overwrite_of_nothing_changes_nothing_and_of_an_unpartitioned_table_replaces_it(warehouse: str) -> None:
    _write(warehouse, EU + US, partition_by="region")
    before = load(warehouse, IDENT).metadata.current_snapshot()
    _write(warehouse, [], overwrite=True, overwrite_mode="dynamic")
    assert load(warehouse, IDENT).metadata.current_snapshot() == before

    other = str(Path(warehouse).parent / "unpartitioned")
    _write(other, EU + US)
    _write(other, _rows(range(7), "ap", "c"), overwrite=True, overwrite_mode="dynamic")
    assert_readers_see(other, IDENT, expected_rows(_rows(range(7), "ap", "c"), COLUMNS), COLUMNS)


def test_replace_where_on_the_partition_column_removes_whole_files(warehouse: str) -> None:
    _write(warehouse, EU + US + AP, partition_by="region")
    new = _rows(range(200, 205), "us", "r") + _rows(range(300, 302), "ap", "r")
    _write(warehouse, new, overwrite=True, replace_where="region IN ('us', 'ap')")

    assert_readers_see(warehouse, IDENT, expected_rows(EU + new, COLUMNS), COLUMNS)
    summary = _summary(warehouse)
    assert summary["deleted-data-files"] == "2" and "added-dvs" not in summary and "added-position-deletes" not in summary


@pytest.mark.parametrize("format_version", ["3", "2"])
def test_replace_where_on_other_columns_hides_exactly_the_matching_rows(warehouse: str, format_version: str) -> None:
    _write(warehouse, EU + US + AP, partition_by="region", format_version=format_version)
    _write(warehouse, _rows(range(5, 10), "eu", "b"))  # two versions of eu ids 5-9 now
    new = _rows(range(5, 9), "eu", "r") + _rows(range(25, 27), "ap", "r")
    _write(warehouse, new, overwrite=True, replace_where="id >= 5 AND id < 9 OR id IN (25, 26, 27)")

    kept = [r for r in EU + US + AP + _rows(range(5, 10), "eu", "b") if not (5 <= r["id"] < 9 or r["id"] in (25, 26, 27))]
    assert_readers_see(warehouse, IDENT, expected_rows(kept + new, COLUMNS), COLUMNS)
    summary = _summary(warehouse)
    # Rows of files that also hold other rows are hidden, not copied: 4 + 4 (eu, both files)
    # and 3 (ap) positions; us's file is untouched (its bounds exclude the filter).
    assert summary["added-position-deletes"] == "11"
    assert summary.get("deleted-data-files", "0") == "0"
    assert check_table(load(warehouse, IDENT)) == []


def test_replace_where_refuses_rows_outside_its_filter_and_changes_nothing(warehouse: str) -> None:
    _write(warehouse, EU + US, partition_by="region")
    before, files = load(warehouse, IDENT).metadata.current_snapshot(), _data_files(warehouse)
    with pytest.raises(ReplaceWhereError, match=r"1 row\(s\) of the DataFrame do not match option 'replace_where' = \"region = 'eu'\""):
        _write(warehouse, _rows(range(3), "eu", "x") + _rows([99], "us", "x"), overwrite=True, replace_where="region = 'eu'")
    assert load(warehouse, IDENT).metadata.current_snapshot() == before
    assert _data_files(warehouse) == files


@pytest.mark.parametrize(
    ("options", "overwrite", "message"),
    [
        ({"replace_where": "region = 'eu'"}, False, "option 'replace_where' applies to overwrites"),
        ({"replace_where": "colour = 'red'"}, True, r"option 'replace_where': filter \"colour = 'red'\": Could not find field with name colour \(the table's columns: id, region, v\)"),
        ({"replace_where": "region = = 'eu'"}, True, "cannot parse .* as a filter"),
        ({"replace_where": "id = 1", "overwrite_mode": "dynamic"}, True, "exclude each other"),
        ({"overwrite_mode": "partial"}, True, "option 'overwrite_mode' must be one of static, dynamic"),
        ({"branch": "audit", "operation": "upsert", "primary_key": "id"}, False, "option 'branch' cannot be used with operation 'upsert'"),
    ],
)
def test_bad_partial_overwrite_and_branch_options_fail_before_a_table_exists(
    warehouse: str, options: dict[str, str], overwrite: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        _write(warehouse, EU, overwrite=overwrite, **options)
    assert not Path(warehouse, "catalog.db").exists() or not Path(warehouse, "db", "t").exists()


def _branch_rows(warehouse: str, branch: str) -> object:
    table = load(warehouse, IDENT)
    ref = table.metadata.refs[branch]
    pyiceberg = rows(table.scan(snapshot_id=ref.snapshot_id).to_arrow(), COLUMNS)
    con = duckdb_connection()
    duck = rows(
        con.execute(f"SELECT * FROM iceberg_scan('{table.metadata_location}', snapshot_from_id => {ref.snapshot_id})").to_arrow_table(),
        COLUMNS,
    )
    assert duck == pyiceberg, "DuckDB and pyiceberg disagree on the branch"
    return pyiceberg


def test_branch_writes_leave_main_alone_until_the_branch_is_published(warehouse: str) -> None:
    _write(warehouse, EU, partition_by="region")
    main_before = load(warehouse, IDENT).metadata.current_snapshot()
    _write(warehouse, US, branch="audit")  # creates the branch from main
    _write(warehouse, _rows(range(0, 2), "eu", "fix"), overwrite=True, overwrite_mode="dynamic", branch="audit")

    assert load(warehouse, IDENT).metadata.current_snapshot() == main_before
    assert_readers_see(warehouse, IDENT, expected_rows(EU, COLUMNS), COLUMNS)
    assert _branch_rows(warehouse, "audit") == expected_rows(US + _rows(range(0, 2), "eu", "fix"), COLUMNS)

    published = publish_branch(load(warehouse, IDENT), "audit")
    assert load(warehouse, IDENT).metadata.current_snapshot().snapshot_id == published  # type: ignore[union-attr]
    assert_readers_see(warehouse, IDENT, expected_rows(US + _rows(range(0, 2), "eu", "fix"), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_a_branch_behind_main_is_not_published_and_a_tag_is_not_written(warehouse: str) -> None:
    _write(warehouse, EU)
    _write(warehouse, US, branch="audit")
    _write(warehouse, AP)  # main moves on: the branch no longer contains main
    main = load(warehouse, IDENT).metadata.current_snapshot()
    with pytest.raises(PublishError, match=r"main \(snapshot \d+\) has commits branch 'audit' does not"):
        publish_branch(load(warehouse, IDENT), "audit")
    assert load(warehouse, IDENT).metadata.current_snapshot() == main
    assert _branch_rows(warehouse, "audit") == expected_rows(EU + US, COLUMNS)

    table = load(warehouse, IDENT)
    with v3_metadata_writes():
        table.manage_snapshots().create_tag(main.snapshot_id, "v1").commit()  # type: ignore[union-attr]
    with pytest.raises(OptionError, match="option 'branch' = 'v1' names a tag"):
        _write(warehouse, US, branch="v1")
