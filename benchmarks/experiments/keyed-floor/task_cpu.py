"""CPU seconds of keyed tasks without Spark, as Spark cuts scenario 4's and 5's batches:
python benchmarks/experiments/keyed-floor/task_cpu.py ROWS [BATCHES]

Builds a ROWS-row table (unpartitioned, maintenance off), then per batch two tasks of 50K
rows each (clustered by key, as `repartition(2, "id")` makes them) and one commit. MODE=upsert
(default): 25K updates of random keys and 25K new keys per task; MODE=cdc: op and sequence
columns, 70% updates, 20% inserts, 10% deletes. Prints the median CPU seconds of a task (the
process's CPU, the Parquet encoder thread included; the input batches are built beforehand).
PROF=1 prints cProfile's top functions over the tasks after the first batch. Two checkouts
compare by running this alternately with PYTHONPATH pointing at each.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import statistics
import sys
import time

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

MODE = os.environ.get("MODE", "upsert")
WAREHOUSE = "/tmp/lakesink-task-cpu"
FIELDS = [T.StructField("id", T.LongType()), T.StructField("cat", T.LongType()), T.StructField("amount", T.DoubleType()),
          T.StructField("name", T.StringType())]
if MODE == "cdc":
    FIELDS += [T.StructField("op", T.StringType()), T.StructField("lsn", T.LongType())]
OPTIONS = {"table": "db.t", "warehouse": WAREHOUSE, "operation": MODE, "primary_key": "id", "index_dir": WAREHOUSE + "/idx",
           "maintenance": "off", **({"op_column": "op", "sequence_column": "lsn"} if MODE == "cdc" else {})}


def arrow(ids: np.ndarray, ops: list[str], lsn: int, chunk: int = 10_000) -> list[pa.RecordBatch]:
    out = []
    for i in range(0, len(ids), chunk):
        x = ids[i : i + chunk]
        columns = [pa.array(x), pa.array(x % 100), pa.array(x * 0.5), pa.array([f"name-{v}" for v in x])]
        if MODE == "cdc":
            columns += [pa.array(ops[i : i + chunk]), pa.array(np.full(len(x), lsn, dtype=np.int64))]
        out.append(pa.record_batch(columns, names=[f.name for f in FIELDS]))
    return out


def run(ids: np.ndarray, ops: list[str], batch: int, profile: cProfile.Profile | None) -> list[float]:
    plan = plan_write(parse_options(OPTIONS), T.StructType(FIELDS), overwrite=False)
    order = np.argsort(ids, kind="stable")
    ids, ops = ids[order], [ops[i] for i in order]
    half = len(ids) // 2
    messages, seconds = [], []
    for p, (a, b) in enumerate([(0, half), (half, len(ids))]):
        batches = arrow(ids[a:b], ops[a:b], batch)
        started = time.process_time()
        if profile:
            profile.enable()
        messages.append(write_task(plan, iter(batches), who=TaskIdentity(batch_id=batch, query_id="q", partition_id=p)))
        if profile:
            profile.disable()
        seconds.append(time.process_time() - started)
    commit_write(plan, decode_messages(messages), batch)
    return seconds


def main() -> None:
    rows = int(sys.argv[1])
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    profile = cProfile.Profile() if os.environ.get("PROF") else None
    rng = np.random.default_rng(0)
    live = np.arange(rows)
    run(live, ["c"] * rows, 0, None)
    next_id, seconds = rows, []
    for b in range(1, batches + 1):
        if MODE == "cdc":
            picked = rng.choice(len(live), 80_000, replace=False)
            new = np.arange(next_id, next_id + 20_000)
            ids = np.concatenate([live[picked[:70_000]], new, live[picked[70_000:]]])
            ops = ["u"] * 70_000 + ["c"] * 20_000 + ["d"] * 10_000
            live = np.concatenate([np.delete(live, picked[70_000:]), new])
        else:
            new = np.arange(next_id, next_id + 50_000)
            ids = np.concatenate([live[rng.choice(len(live), 50_000, replace=False)], new])
            ops = ["u"] * len(ids)
            live = np.concatenate([live, new])
        next_id += len(new)
        seconds += run(ids, ops, b, profile if b >= 2 else None)
    print(f"{MODE} into {rows:,} rows: task CPU median {statistics.median(seconds) * 1000:.1f} ms, min {min(seconds) * 1000:.1f} ms "
          f"({len(seconds)} tasks of 50K rows)")
    if profile:
        pstats.Stats(profile).sort_stats(os.environ.get("SORT", "tottime")).print_stats(int(os.environ.get("TOP", "30")))


if __name__ == "__main__":
    main()
