"""Rows the driver appends itself (the companion table's tombstones) go through lakesink's own
commit path: one snapshot with its properties, readable by DuckDB and pyiceberg, and nothing
left behind when another commit landed first."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from lakesink_testing import duckdb_rows, embedded_catalog, expected_rows, pyiceberg_rows
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.append_rows import append_rows
from lakesink_datasource.maintenance.orphans import remove_orphans

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "part", StringType(), required=False))
COLUMNS = ["id", "part"]


def _table(warehouse: str, partitioned: bool):  # type: ignore[no-untyped-def]
    os.makedirs(warehouse, exist_ok=True)
    catalog = embedded_catalog(warehouse)
    catalog.create_namespace("db")
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "part")) if partitioned else PartitionSpec()
    return catalog.create_table("db.t", schema=SCHEMA, partition_spec=spec, properties={"format-version": "2"})


def _rows(ids: range, part: str, id_type: pa.DataType | None = None) -> pa.Table:
    # Columns in another order than the table's, and a narrower integer type: both are taken.
    return pa.table({"part": pa.array([part] * len(ids)), "id": pa.array(list(ids), id_type or pa.int64())})


@pytest.mark.parametrize("partitioned", [False, True])
def test_appended_rows_and_properties_land_in_one_snapshot_each(warehouse: str, partitioned: bool) -> None:
    table = _table(warehouse, partitioned)
    table = append_rows(table, _rows(range(0, 5), "a"), properties={"mark": "1"})
    table = append_rows(table, _rows(range(5, 8), "b", pa.int32()), properties={"mark": "2"})
    assert len(table.metadata.snapshots) == 2
    assert table.metadata.properties["mark"] == "2"
    summary = table.metadata.current_snapshot().summary
    assert summary is not None and summary.additional_properties["total-records"] == "8"
    expected = expected_rows([{"id": i, "part": "a" if i < 5 else "b"} for i in range(8)], COLUMNS)
    reloaded = embedded_catalog(warehouse).load_table("db.t")
    assert pyiceberg_rows(reloaded, COLUMNS) == expected
    assert duckdb_rows(reloaded.metadata_location, COLUMNS) == expected
    assert check_table(reloaded) == []


def test_an_append_that_lost_the_race_changes_nothing_and_leaves_no_file(warehouse: str) -> None:
    stale = _table(warehouse, partitioned=False)
    winner = append_rows(embedded_catalog(warehouse).load_table("db.t"), _rows(range(3), "a"), properties={"mark": "winner"})
    with pytest.raises(CommitFailedException):
        append_rows(stale, _rows(range(10, 13), "z"), properties={"mark": "loser"})
    table = embedded_catalog(warehouse).load_table("db.t")
    assert table.metadata.current_snapshot_id == winner.metadata.current_snapshot_id
    assert table.metadata.properties["mark"] == "winner"
    assert pyiceberg_rows(table, COLUMNS) == expected_rows([{"id": i, "part": "a"} for i in range(3)], COLUMNS)
    # Neither the loser's data file nor its manifests stay behind as orphans.
    assert remove_orphans(table, min_age_ms=0, dry_run=True).orphans == []
