"""`write.object-storage.enabled` (issue 45, part 3): data and delete files under Iceberg's
hashed directories, byte for byte where pyiceberg's provider (which follows Java's) puts them.

Driven through the production path without Spark: appends, keyed upserts (deletion vectors)
and a compaction into a partitioned table; read back with DuckDB and pyiceberg; `check` and
orphan removal find every file where it is.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.table.locations import ObjectStoreLocationProvider
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes
from lakesink_datasource.iceberg.locations import entropy_dirs
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.maintenance.orphans import remove_orphans
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]
HASHED = re.compile(r"/data/[01]{4}/[01]{4}/[01]{4}/[01]{8}[/-]")


def _write(warehouse: str, ids: range, tag: str, batch: int, partitioned_paths: str) -> None:
    options = {
        "table": "db.t", "warehouse": warehouse, "progress": "false", "maintenance": "off", "partition_by": "bucket(2, id)",
        "operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx",
        "property.write.object-storage.enabled": "true", "property.write.object-storage.partitioned-paths": partitioned_paths,
    }
    plan = plan_write(parse_options(options), SCHEMA, False)
    plan = msgspec.structs.replace(plan, compaction=None)
    rows = pa.RecordBatch.from_pylist([{"id": i, "v": f"{tag}{i}"} for i in ids], schema=ARROW)
    commit_write(plan, decode_messages([write_task(plan, iter([rows]), TaskIdentity(batch_id=batch, query_id="q"))]), batch)


@pytest.mark.parametrize("partitioned_paths", ["true", "false"])
def test_files_land_where_icebergs_object_store_provider_puts_them(warehouse: str, partitioned_paths: str) -> None:
    model: dict[int, dict] = {}
    for b, ids in enumerate([range(0, 40), range(20, 60), range(50, 70), range(0, 10)]):
        _write(warehouse, ids, f"b{b}-", b, partitioned_paths)
        model.update({i: {"id": i, "v": f"b{b}-{i}"} for i in ids})
    table = load(warehouse, "db.t")
    assert compact(table, budget_bytes=1 << 40, tiered=False).snapshot_id is not None
    table = load(warehouse, "db.t")
    provider = ObjectStoreLocationProvider(table.metadata.location, table.metadata.properties)
    spec, schema = table.metadata.spec(), table.metadata.schema()
    data = [e.data_file for e in live_data_files(table.io, table.metadata.current_snapshot())]
    assert data
    for f in data:
        name = f.file_path.rsplit("/", 1)[1]
        folder = spec.partition_to_path(f.partition, schema)
        if partitioned_paths == "true":
            assert f.file_path == f"{provider.data_path}/{entropy_dirs(f'{folder}/{name}')}/{folder}/{name}"
        else:
            name = name.split("-", 1)[1]  # the hash prefixes the name
        key = PartitionKey(
            field_values=[PartitionFieldValue(field, f.partition[i]) for i, field in enumerate(spec.fields)],
            partition_spec=spec, schema=schema,
        )
        assert f.file_path == provider.new_data_location(name, key)
    # Deletion vectors (written before the compaction merged their files) were hashed too.
    history_dvs = [
        e.data_file.file_path for s in table.metadata.snapshots[:-1] for e in live_position_deletes(table.io, s).values()
    ]
    assert history_dvs and all(HASHED.search(p) for p in history_dvs)
    assert_readers_see(warehouse, "db.t", expected_rows(list(model.values()), COLUMNS), COLUMNS)
    assert check_table(table) == []
    # Orphan removal lists the hashed directories: a planted old file there is found, no
    # referenced file is.
    planted = Path(data[0].file_path.removeprefix("file://")).with_name("planted-orphan.parquet")
    planted.write_bytes(b"x")
    old = time.time() - 10 * 24 * 3600
    os.utime(planted, (old, old))
    scan = remove_orphans(table, min_age_ms=24 * 3600 * 1000, dry_run=True)
    assert [p.removeprefix("file://") for p in scan.orphans] == [str(planted)]
