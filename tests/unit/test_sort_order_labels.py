"""A table another engine gave a sort order (pyiceberg here) gets files sorted by it and
labelled with it (issue 45, part 2): until 2026-11-26 lakesink labelled its unsorted files
with the table's order, which a reader or an engine's rewrite would have trusted.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
from lakesink_testing import embedded_catalog, load
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])


def test_files_written_into_a_sorted_table_are_sorted_and_labelled(warehouse: str) -> None:
    os.makedirs(warehouse)
    catalog = embedded_catalog(warehouse)
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "v", StringType()))
    catalog.create_table("db.t", schema, sort_order=SortOrder(SortField(source_id=1, transform=IdentityTransform())))
    assert load(warehouse, "db.t").metadata.default_sort_order_id == 1
    for ids in ([5, 3, 9, 1], [8, 2, 7]):  # neither batch comes sorted
        plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse, "progress": "false"}), SCHEMA, False)
        batch = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()), "v": pa.array([str(i) for i in ids])}, schema=ARROW)
        commit_write(plan, decode_messages([write_task(plan, iter([batch]), TaskIdentity())]), None)
    table = load(warehouse, "db.t")
    files = [e.data_file for e in live_data_files(table.io, table.metadata.current_snapshot())]
    assert len(files) == 2
    assert {f.sort_order_id for f in files} == {1}
    by_rows = sorted(pq.read_table(f.file_path.removeprefix("file://")).column("id").to_pylist() for f in files)
    assert by_rows == [[1, 3, 5, 9], [2, 7, 8]]
