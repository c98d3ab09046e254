"""Parquet Bloom filters from the table's properties (issue 45, part 4), read back by DuckDB.

A table with `write.parquet.bloom-filter-enabled.column.id=true` gets a Bloom filter on
`id` in every row group of every data file lakesink writes; DuckDB's own reader
(`parquet_bloom_probe`) then rules out the row groups a point lookup's value is not in.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import duckdb_connection, expected_rows, load, pyiceberg_rows
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.io.bloom_filters import ndv_for
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
ROWS = 20_000


def _write(warehouse: str, ids: np.ndarray, **options: str) -> None:
    raw = {"table": "db.t", "warehouse": warehouse, "progress": "false", "maintenance": "off",
           # Small row groups: a file of several, so a lookup has some to rule out.
           "property.write.parquet.row-group-size-bytes": str(32 * 1024), **options}
    plan = plan_write(parse_options(raw), SCHEMA, False)
    batch = pa.RecordBatch.from_pydict({"id": pa.array(ids), "v": pa.array([f"v{i}" for i in ids])}, schema=ARROW)
    commit_write(plan, decode_messages([write_task(plan, iter([batch]), TaskIdentity())]), None)


def _probe(warehouse: str, value: int) -> list[bool]:
    """Per row group of every data file: does DuckDB's Bloom filter probe rule `value` out?"""
    table = load(warehouse, "db.t")
    out = []
    con = duckdb_connection()
    for entry in live_data_files(table.io, table.metadata.current_snapshot()):
        path = entry.data_file.file_path.removeprefix("file://")
        out += [bool(r[2]) for r in con.execute(f"SELECT * FROM parquet_bloom_probe('{path}', 'id', {value})").fetchall()]
    return out


def test_a_point_lookup_rules_out_the_row_groups_without_the_key(warehouse: str) -> None:
    ids = np.random.default_rng(7).permutation(ROWS).astype(np.int64)
    _write(warehouse, ids, **{"property.write.parquet.bloom-filter-enabled.column.id": "true"})
    probe = _probe(warehouse, int(ids[123]))
    assert len(probe) >= 4, "one row group: nothing to rule out"
    assert probe.count(False) >= 1  # the row group holding the key is never ruled out
    assert probe.count(True) >= len(probe) - 2  # the others are, but for a false positive
    assert all(_probe(warehouse, ROWS + 12345))  # a key that is nowhere: ruled out everywhere (fpp 0.01)
    table = load(warehouse, "db.t")
    assert pyiceberg_rows(table, ["id"]) == expected_rows([{"id": int(i)} for i in ids], ["id"])


def test_without_the_property_no_filter_is_written(warehouse: str) -> None:
    ids = np.arange(ROWS, dtype=np.int64)
    _write(warehouse, ids)
    table = load(warehouse, "db.t")
    for entry in live_data_files(table.io, table.metadata.current_snapshot()):
        meta = pq.ParquetFile(entry.data_file.file_path.removeprefix("file://")).metadata
        assert all(meta.row_group(g).column(0).bloom_filter_offset is None for g in range(meta.num_row_groups))
    assert not any(_probe(warehouse, ROWS + 1))


def test_the_filter_is_sized_as_java_sizes_it() -> None:
    # parquet-java's cap (write.parquet.bloom-filter-max-bytes, 1 MiB) at fpp 0.01 holds about 866K values.
    assert 860_000 < ndv_for(1024 * 1024, 0.01) < 870_000
    assert ndv_for(1024 * 1024, 0.001) < ndv_for(1024 * 1024, 0.01)


def test_a_bad_fpp_is_refused_before_anything_is_written(warehouse: str) -> None:
    with pytest.raises(OptionError, match=r"property\.write\.parquet\.bloom-filter-fpp\.column\.id"):
        _write(warehouse, np.arange(10, dtype=np.int64), **{
            "property.write.parquet.bloom-filter-enabled.column.id": "true",
            "property.write.parquet.bloom-filter-fpp.column.id": "1.5",
        })
    assert not os.path.exists(os.path.join(warehouse, "db", "t"))
