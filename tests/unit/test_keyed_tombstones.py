"""A delete's sequence survives an index rebuild: an older late change cannot resurrect the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.summary_keys import TOMBSTONES
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField(n, t) for n, t in [("id", T.LongType()), ("v", T.StringType()), ("seq", T.LongType()), ("op", T.StringType())]])


def cdc_batch(warehouse: str, index_dir: Path, batch_id: int, rows: list[tuple]) -> None:
    options = parse_options({
        "table": "db.t", "warehouse": warehouse, "operation": "cdc", "op_column": "op", "primary_key": "id",
        "sequence_column": "seq", "index_dir": str(index_dir),
    })
    plan = plan_write(options, SCHEMA, overwrite=False)
    batch = pa.record_batch([pa.array([r[i] for r in rows], t) for i, t in enumerate([pa.int64(), pa.string(), pa.int64(), pa.string()])], names=["id", "v", "seq", "op"])
    message = write_task(plan, iter([batch]), who=TaskIdentity(batch_id=batch_id, query_id="q"))
    commit_write(plan, decode_messages([message]), batch_id)


def test_late_change_older_than_a_delete_stays_ignored_after_the_index_is_rebuilt(warehouse: str, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    cdc_batch(warehouse, index_dir, 0, [(1, "a", 10, "c"), (2, "b", 10, "c")])
    cdc_batch(warehouse, index_dir, 1, [(1, None, 20, "d")])
    assert TOMBSTONES in load(warehouse, "db.t").metadata.current_snapshot().summary.additional_properties
    shutil.rmtree(index_dir)  # the next task rebuilds the index from the table
    cdc_batch(warehouse, index_dir, 2, [(1, "zombie", 15, "u"), (2, "b2", 11, "u")])
    expected = expected_rows([{"id": 2, "v": "b2", "seq": 11}], ["id", "v", "seq"])
    assert_readers_see(warehouse, "db.t", expected, ["id", "v", "seq"])
    # a newer change does bring the key back
    cdc_batch(warehouse, index_dir, 3, [(1, "back", 21, "u")])
    expected = expected_rows([{"id": 2, "v": "b2", "seq": 11}, {"id": 1, "v": "back", "seq": 21}], ["id", "v", "seq"])
    assert_readers_see(warehouse, "db.t", expected, ["id", "v", "seq"])
    assert check_table(load(warehouse, "db.t")) == []
