"""Dev check (not CI): the key index follows Iceberg Java's rewrite through row lineage.

    python benchmarks/experiments/index-moves/java_interop.py

Builds a v3 CDC table (bucket(4, id), sequence column; 20K keys, 6 batches of updates,
inserts and deletes with lakesink's compaction after each) through the production path
(plan_write -> write_task -> the driver's commit and maintenance), then, twice: Iceberg
Java 1.10.2's `rewrite_data_files` (rewrite-all) and a lakesink batch on the same index
(updates and deletes of moved keys), then once more after a rewrite and an
`expire_snapshots`. Prints whether the index followed Java's rewrite by
move maps, the model's row count, and then runs the six readers of read_table.py.
Needs the readers' set-up (../shared/tools/readers/setup_readers.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.datasource import LakeSinkStreamWriter
from lakesink_datasource.duckdb_reader import connect as duckdb_connect
from lakesink_datasource.index.sharded_index import open_sharded
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

WAREHOUSE = "/tmp/lakesink-java-moves"
TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "tools", "readers")
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType()),
                       T.StructField("op", T.StringType()), T.StructField("lsn", T.LongType())])
OPTIONS = {"table": "db.cdc", "warehouse": WAREHOUSE, "operation": "cdc", "primary_key": "id", "op_column": "op",
           "sequence_column": "lsn", "index_dir": WAREHOUSE + "/idx", "partition_by": "bucket(4, id)"}


def embedded_catalog(warehouse: str) -> SqlCatalog:
    return SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")


def batch(ids: np.ndarray, ops: list[str], lsn: int) -> None:
    plan = plan_write(parse_options(OPTIONS), SCHEMA, overwrite=False)
    order = np.argsort(ids, kind="stable")
    ids, ops = ids[order], [ops[i] for i in order]
    rows = pa.record_batch([pa.array(ids), pa.array([f"v{lsn}-{i}" for i in ids.tolist()]), pa.array(ops),
                            pa.array(np.full(len(ids), lsn, dtype=np.int64))], names=["id", "v", "op", "lsn"])
    message = write_task(plan, iter([rows]), who=TaskIdentity(batch_id=lsn, query_id="q", partition_id=0))
    LakeSinkStreamWriter(plan).commit([message], lsn)


def main() -> None:
    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    rng = np.random.default_rng(7)
    model: dict[int, str] = {}

    def apply(ids: np.ndarray, ops: list[str], lsn: int) -> None:
        batch(ids, ops, lsn)
        for i, op in zip(ids.tolist(), ops):
            if op == "d":
                model.pop(i, None)
            else:
                model[i] = f"v{lsn}-{i}"

    apply(np.arange(20_000), ["c"] * 20_000, 1)
    lsn = 2
    for _ in range(6):
        keys = np.array(sorted(model))
        picked = rng.choice(keys, 3_000, replace=False)
        new = np.arange(100_000 + lsn * 1000, 100_000 + lsn * 1000 + 500)
        apply(np.concatenate([picked, new]), ["u"] * 2_500 + ["d"] * 500 + ["c"] * 500, lsn)
        lsn += 1
    # Java's rewrite twice, then rewrite + expire_snapshots (the index's snapshot expires: rebuilt).
    for round_, actions in ((1, ["rewrite"]), (2, ["rewrite"]), (3, ["rewrite", "expire"])):
        for action in actions:
            subprocess.run([sys.executable, os.path.join(TOOLS, "java_maintenance.py"), WAREHOUSE, "db.cdc", action], check=True)
        table = embedded_catalog(WAREHOUSE).load_table("db.cdc")
        index = open_sharded(os.path.join(WAREHOUSE, "idx", str(table.metadata.table_uuid)))
        before = index.moved_rows()
        keys = np.array(sorted(model))
        picked = rng.choice(keys, 4_000, replace=False)
        apply(picked, ["u"] * 3_000 + ["d"] * 1_000, lsn)
        lsn += 1
        print(f"round {round_}: move maps {before:,} -> {index.moved_rows():,} positions; model {len(model):,} rows", flush=True)
    table = embedded_catalog(WAREHOUSE).load_table("db.cdc")
    got = duckdb_connect().execute(f"SELECT id, v FROM iceberg_scan('{table.metadata_location}')").fetchall()
    assert dict(got) == model and len(got) == len(model), "DuckDB does not see the model's rows"
    print("DuckDB sees exactly the model's rows; check_table:", check_table(table) or "OK", flush=True)
    subprocess.run([sys.executable, os.path.join(TOOLS, "read_table.py"), table.metadata_location.removeprefix("file://"),
                    "--columns", "id,v"], check=False)


if __name__ == "__main__":
    main()
