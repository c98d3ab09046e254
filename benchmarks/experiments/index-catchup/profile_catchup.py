"""Profile the key index catch-up after a compaction, without Spark.

python benchmarks/experiments/index-catchup/profile_catchup.py ROWS [-p]

Builds an unpartitioned v3 upsert table of ROWS rows, upserts three batches of 100K rows
(half updates, half new keys), compacts every file (every key moves), then times the next
100K-row upsert task, whose index sync moves every key of the compacted files; -p prints
cProfile's top functions for that task.
"""

import cProfile
import pstats
import shutil
import sys
import time

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

WAREHOUSE = "/tmp/lakesink-profile-catchup"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("cat", T.LongType()),
                       T.StructField("amount", T.DoubleType()), T.StructField("name", T.StringType())])
OPTIONS = {"table": "db.t", "warehouse": WAREHOUSE, "operation": "upsert", "primary_key": "id",
           "index_dir": WAREHOUSE + "/idx", "maintenance": "off"}


def batches(ids: np.ndarray, chunk: int = 10_000):  # type: ignore[no-untyped-def]
    for i in range(0, len(ids), chunk):
        x = ids[i:i + chunk]
        yield pa.record_batch([pa.array(x), pa.array(x % 100), pa.array(x * 0.5), pa.array([f"name-{v}" for v in x])],
                              names=["id", "cat", "amount", "name"])


def upsert(ids: np.ndarray, batch: int, profile: bool = False) -> float:
    plan = plan_write(parse_options(OPTIONS), SCHEMA, overwrite=False)
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    message = write_task(plan, batches(ids.astype(np.int64)), who=TaskIdentity(batch_id=batch, query_id="q"))
    task = time.perf_counter() - started
    if profiler:
        profiler.disable()
    commit_write(plan, decode_messages([message]), batch)
    if profiler:
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)
    return task


def main() -> None:
    rows = int(sys.argv[1])
    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    rng = np.random.default_rng(0)
    upsert(np.arange(rows), 0)
    existing = rows
    for batch in range(1, 4):
        ids = np.concatenate([rng.choice(existing, 50_000, replace=False), np.arange(existing, existing + 50_000)])
        existing += 50_000
        upsert(ids, batch)
    plan = plan_write(parse_options(OPTIONS), SCHEMA, overwrite=False)
    table = sql_commit.load_table(loader.load(plan.catalog), plan.identifier)
    started = time.perf_counter()
    result = compact(table, budget_bytes=1 << 40, tiered=False)
    print(f"compaction: {result.describe()} in {time.perf_counter() - started:.2f} s")
    for batch, profile in ((4, "-p" in sys.argv), (5, False)):
        ids = np.concatenate([rng.choice(existing, 50_000, replace=False), np.arange(existing, existing + 50_000)])
        existing += 50_000
        seconds = upsert(ids, batch, profile)
        print(f"batch {batch} ({'after the compaction: moves every key' if batch == 4 else 'steady'}): task {seconds:.2f} s")


if __name__ == "__main__":
    main()
