"""A manifest list lakesink writes is kept as a later read would decode it: the next commit
reads its base's list from the cache (2026-11-27, for routed writes' many small commits)."""

from __future__ import annotations

import os

import pyarrow as pa
from lakesink_testing import load
from pyiceberg.avro.file import AvroFile
from pyiceberg.manifest import MANIFEST_LIST_FILE_SCHEMAS, ManifestContent, ManifestFile, PartitionFieldSummary
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg import manifest_list
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


def _decoded(io, location: str) -> list[ManifestFile]:  # type: ignore[no-untyped-def]
    with AvroFile[ManifestFile](
        io.new_input(location), MANIFEST_LIST_FILE_SCHEMAS[3],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary}, read_enums={517: ManifestContent},
    ) as reader:
        return list(reader)


def test_the_cached_manifest_list_equals_the_file(warehouse: str) -> None:
    os.makedirs(warehouse)
    for version in ("3", "2"):
        table_name = f"db.t{version}"
        for b in range(3):
            options = {"table": table_name, "warehouse": warehouse, "progress": "false", "partition_by": "bucket(2, id)", "format_version": version}
            plan = plan_write(parse_options(options), SCHEMA, False)
            batch = pa.RecordBatch.from_pydict({"id": [b * 10 + i for i in range(10)], "v": ["x"] * 10})
            commit_write(plan, decode_messages([write_task(plan, iter([batch]), TaskIdentity(batch_id=b, query_id="q"))]), b)
            table = load(warehouse, table_name)
            location = table.metadata.current_snapshot().manifest_list  # type: ignore[union-attr]
            cached = manifest_list._cache.get(location)
            assert cached is not None, "the list just written is cached"
            from_file = _decoded(table.io, location)
            assert [m._data for m in cached] == [m._data for m in from_file]
