"""Partition evolution with `evolve_partition`: a new spec becomes the default in the commit of
its data, old files keep their spec, keyed writes stay exact across files of both specs, and
compaction rewrites old-spec files into the current spec.

Driven through the production path without Spark (plan_write -> write_task -> commit_write);
rows read back with DuckDB and pyiceberg, expected rows kept by hand in a dict."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.compaction.plan import FileStats, plan_compaction
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("v", T.StringType())])
ARROW = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())])
WIDE = T.StructType([*SCHEMA.fields, T.StructField("region", T.StringType())])
WIDE_ARROW = pa.schema([*ARROW, ("region", pa.string())])
COLUMNS = ["id", "v"]


def _rows(ids: Iterable[int], tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


def _plan(warehouse: str, schema: T.StructType = SCHEMA, **options: str) -> WritePlan:
    raw = {"table": IDENT, "warehouse": warehouse, "progress": "false", **options}
    return plan_write(parse_options(raw), schema, overwrite=False)


def _land(plan: WritePlan, records: list[dict], arrow: pa.Schema = ARROW) -> None:
    message = write_task(plan, iter([pa.RecordBatch.from_pylist(records, schema=arrow)]), TaskIdentity())
    commit_write(plan, decode_messages([message]), None)


def _write(warehouse: str, records: list[dict], **options: str) -> None:
    _land(_plan(warehouse, **options), records)


def _keyed(warehouse: str, partition_by: str, **extra: str) -> dict[str, str]:
    return {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx", "partition_by": partition_by, **extra}


def _spec_ids_of_live_files(warehouse: str) -> list[int]:
    table = load(warehouse, IDENT)
    return sorted(e.data_file.spec_id for e in live_data_files(table.io, table.current_snapshot()))


def test_a_different_partition_by_is_refused_without_evolve_partition_naming_both_specs(warehouse: str) -> None:
    _write(warehouse, _rows(range(4), "a"), partition_by="bucket(2, id)")
    before = load(warehouse, IDENT)
    with pytest.raises(OptionError) as caught:
        _plan(warehouse, partition_by="truncate(10, v)")
    message = str(caught.value)
    assert "'truncate(10, v)'" in message and "bucket(2, id)" in message and "evolve_partition=true" in message
    after = load(warehouse, IDENT)
    assert after.metadata.partition_specs == before.metadata.partition_specs
    assert after.metadata.current_snapshot() == before.metadata.current_snapshot()


def test_evolve_partition_needs_partition_by_and_refuses_a_branch(warehouse: str) -> None:
    _write(warehouse, _rows(range(4), "a"), partition_by="bucket(2, id)")
    with pytest.raises(OptionError, match="'evolve_partition' needs option 'partition_by'"):
        _plan(warehouse, evolve_partition="true")
    with pytest.raises(OptionError, match="'evolve_partition' cannot be used with option 'branch'"):
        _plan(warehouse, evolve_partition="true", partition_by="bucket(4, id)", branch="audit")
    assert len(load(warehouse, IDENT).metadata.partition_specs) == 1


def test_the_new_spec_becomes_the_default_in_the_commit_of_its_data_and_old_files_keep_theirs(warehouse: str) -> None:
    _write(warehouse, _rows(range(10), "a"), partition_by="bucket(2, id)")
    plan = _plan(warehouse, partition_by="bucket(2, id), truncate(1, v)", evolve_partition="true")
    staged = load(warehouse, IDENT)
    # Staged: the spec exists (ids reserved) but is not the default until the data lands.
    assert len(staged.metadata.partition_specs) == 2 and staged.metadata.default_spec_id == 0
    _land(plan, _rows(range(10, 20), "b"))

    table = load(warehouse, IDENT)
    assert table.metadata.default_spec_id == 1
    new = table.spec()
    # The bucket field keeps its id across specs (same source and transform); the new one is fresh.
    assert [(f.field_id, f.name) for f in new.fields] == [(1000, "id_bucket"), (1001, "v_trunc")]
    assert table.metadata.last_partition_id == 1001
    assert _spec_ids_of_live_files(warehouse).count(0) == 2 and set(_spec_ids_of_live_files(warehouse)) == {0, 1}
    assert_readers_see(warehouse, IDENT, expected_rows(_rows(range(10), "a") + _rows(range(10, 20), "b"), COLUMNS), COLUMNS)
    assert check_table(table) == []
    # The next write with the same option finds the table already laid out so: no new spec.
    _write(warehouse, _rows(range(20, 22), "c"), partition_by="bucket(2, id), truncate(1, v)", evolve_partition="true")
    assert len(load(warehouse, IDENT).metadata.partition_specs) == 2


def test_a_changed_transform_parameter_gets_a_new_field_and_going_back_reuses_the_old_spec(warehouse: str) -> None:
    _write(warehouse, _rows(range(8), "a"), partition_by="bucket(2, id)")
    _write(warehouse, _rows(range(8, 16), "b"), partition_by="bucket(4, id)", evolve_partition="true")
    table = load(warehouse, IDENT)
    assert [(f.field_id, f.name, str(f.transform)) for f in table.spec().fields] == [(1001, "id_bucket_4", "bucket[4]")]
    _write(warehouse, _rows(range(16, 24), "c"), partition_by="bucket(2, id)", evolve_partition="true")
    table = load(warehouse, IDENT)
    assert len(table.metadata.partition_specs) == 2 and table.metadata.default_spec_id == 0
    expected = _rows(range(8), "a") + _rows(range(8, 16), "b") + _rows(range(16, 24), "c")
    assert_readers_see(warehouse, IDENT, expected_rows(expected, COLUMNS), COLUMNS)
    assert check_table(table) == []


def test_keyed_writes_across_specs_stay_exact_and_compaction_rewrites_into_the_current_spec(warehouse: str) -> None:
    live = {r["id"]: r for r in _rows(range(40), "a")}
    _write(warehouse, list(live.values()), **_keyed(warehouse, "bucket(2, id)"))
    # Evolve while upserting keys that live in old-spec files and new keys.
    changes = _rows(range(0, 60, 3), "b")
    _write(warehouse, changes, **_keyed(warehouse, "bucket(4, id)", evolve_partition="true"))
    live.update({r["id"]: r for r in changes})
    changes = _rows(range(1, 60, 4), "c")  # hits files of both specs
    _write(warehouse, changes, **_keyed(warehouse, "bucket(4, id)", evolve_partition="true"))
    live.update({r["id"]: r for r in changes})

    table = load(warehouse, IDENT)
    assert table.metadata.default_spec_id == 1
    dvs = live_position_deletes(table.io, table.current_snapshot())
    files = {e.data_file.file_path: e.data_file for e in live_data_files(table.io, table.current_snapshot())}
    # Each DV carries its data file's spec and partition, old spec or new.
    assert {files[p].spec_id for p in dvs} == {0, 1}
    assert all(dv.data_file.spec_id == files[p].spec_id and dv.data_file.partition == files[p].partition for p, dv in dvs.items())
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(table) == []

    result = compact(table, budget_bytes=1 << 40, tiered=False)
    assert result.snapshot_id is not None
    assert set(_spec_ids_of_live_files(warehouse)) == {1}
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []
    # Keys moved by the compaction are still found: an upsert after it replaces, never duplicates.
    changes = _rows(range(0, 60, 5), "d")
    _write(warehouse, changes, **_keyed(warehouse, "bucket(4, id)"))
    live.update({r["id"]: r for r in changes})
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_merge_schema_and_evolve_partition_together_partition_by_a_new_column(warehouse: str) -> None:
    _write(warehouse, _rows(range(6), "a"), partition_by="bucket(2, id)")
    plan = _plan(warehouse, WIDE, partition_by="region", evolve_partition="true", merge_schema="true")
    records = [{"id": 10 + i, "v": f"b{i}", "region": "eu" if i % 2 else "us"} for i in range(6)]
    _land(plan, records, WIDE_ARROW)
    table = load(warehouse, IDENT)
    region = table.schema().find_field("region")
    assert [(f.source_id, f.name) for f in table.spec().fields] == [(region.field_id, "region")]
    expected = [{**r, "region": None} for r in _rows(range(6), "a")] + records
    assert_readers_see(warehouse, IDENT, expected_rows(expected, ["id", "v", "region"]), ["id", "v", "region"])
    assert check_table(table) == []


def test_the_planner_rewrites_a_small_file_of_an_earlier_spec_even_alone_but_leaves_large_ones() -> None:
    mib = 1 << 20
    files = [
        FileStats("old-small", (0, (1,)), 1 * mib, 1000, earlier_spec=True),
        FileStats("old-large", (0, (2,)), 120 * mib, 100_000, earlier_spec=True),
        FileStats("new-small", (1, (3,)), 1 * mib, 1000),
    ]
    plan = plan_compaction(files, target_file_size=128 * mib, budget_bytes=1 << 40)
    assert [[f.path for f in g.files] for g in plan.groups] == [["old-small"]] and plan.dropped == []
