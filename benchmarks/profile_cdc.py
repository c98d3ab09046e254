"""Profile scenario 5's CDC batches without Spark: python benchmarks/profile_cdc.py [-p] [-t].

Builds a 1M-row v3 table with operation=cdc (op column, sequence column), then applies 12
batches of 100K changes (70% updates of random live keys, 20% inserts, 10% deletes) as two
tasks of 50K clustered by key (as `repartition(2, "id")` makes them) plus one commit, and
prints where each batch's time goes (the tasks; the driver's whole step: tombstones, commit,
maintenance); -p adds cProfile's top functions of the last batch, or of batch
$PROFILE_BATCH (7 follows a compaction), -t sorts them by own time instead of cumulative.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import sys
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.datasource import LakeSinkStreamWriter
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

WAREHOUSE = "/tmp/lakesink-profile-cdc"
SCHEMA = T.StructType([
    T.StructField("id", T.LongType()), T.StructField("amount", T.DoubleType()), T.StructField("name", T.StringType()),
    T.StructField("op", T.StringType()), T.StructField("lsn", T.LongType()),
])
OPTIONS = {"table": "db.cdc", "warehouse": WAREHOUSE, "operation": "cdc", "primary_key": "id", "op_column": "op",
           "sequence_column": "lsn", "index_dir": WAREHOUSE + "/idx"}


def arrow(ids: np.ndarray, ops: list[str], lsn: int, chunk: int = 10_000) -> Iterator[pa.RecordBatch]:
    for i in range(0, len(ids), chunk):
        x = ids[i : i + chunk]
        yield pa.record_batch(
            [pa.array(x), pa.array(x * 0.5), pa.array([f"name-{v}" for v in x]), pa.array(ops[i : i + chunk]),
             pa.array(np.full(len(x), lsn, dtype=np.int64))],
            names=["id", "amount", "name", "op", "lsn"],
        )


def run(ids: np.ndarray, ops: list[str], batch: int, profile: cProfile.Profile | None) -> None:
    plan = plan_write(parse_options(OPTIONS), SCHEMA, overwrite=False)
    order = np.argsort(ids, kind="stable")
    ids, ops = ids[order], [ops[i] for i in order]
    halves = np.searchsorted(ids, np.median(ids))  # two tasks, clustered by key
    started = time.perf_counter()
    if profile:
        profile.enable()
    messages = [
        write_task(plan, arrow(ids[a:b], ops[a:b], batch), who=TaskIdentity(batch_id=batch, query_id="q", partition_id=p))
        for p, (a, b) in enumerate([(0, halves), (halves, len(ids))])
    ]
    tasks = time.perf_counter()
    LakeSinkStreamWriter(plan).commit(list(messages), batch)  # the driver's whole step: tombstones, commit, maintenance
    if profile:
        profile.disable()
    done = time.perf_counter()
    print(f"batch {batch}: {len(ids):,} changes, tasks {tasks - started:.3f} s, driver {done - tasks:.3f} s, "
          f"{len(ids) / (done - started):,.0f} rows/s")


def main() -> None:
    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    rng = np.random.default_rng(5)
    live = np.arange(1_000_000)
    run(live.copy(), ["c"] * len(live), 0, None)
    next_id = len(live)
    batches = int(os.environ.get("PROFILE_BATCHES", "12"))
    for b in range(1, batches + 1):
        picked = rng.choice(len(live), 80_000, replace=False)
        upd, dele = live[picked[:70_000]], live[picked[70_000:]]
        ins = np.arange(next_id, next_id + 20_000)
        next_id += 20_000
        profile = cProfile.Profile() if b == int(os.environ.get("PROFILE_BATCH", batches)) and "-p" in sys.argv else None
        run(np.concatenate([upd, ins, dele]), ["u"] * 70_000 + ["c"] * 20_000 + ["d"] * 10_000, b, profile)
        live = np.concatenate([np.delete(live, picked[70_000:]), ins])
        if profile:
            pstats.Stats(profile).sort_stats("tottime" if "-t" in sys.argv else "cumulative").print_stats(30)


if __name__ == "__main__":
    main()
