"""Profile one keyed upsert task without Spark: python benchmarks/profile_upsert.py ROWS [-p].

Builds an unpartitioned v3 table of ROWS rows with operation=upsert, then upserts three
batches of 100K rows (half updates of random existing keys, half new keys) through
write_task + commit_write; -p prints cProfile's top functions for the last batch.
"""
import cProfile
import pstats
import shutil
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

N = int(sys.argv[1])
wh = "/tmp/lakesink-profile-upsert"
shutil.rmtree(wh, ignore_errors=True)
S = T.StructType([T.StructField("id", T.LongType()), T.StructField("cat", T.LongType()), T.StructField("amount", T.DoubleType()), T.StructField("name", T.StringType())])


def batches(ids: Any, chunk: int = 10000) -> Iterator[pa.RecordBatch]:
    ids = np.asarray(ids, dtype=np.int64)
    for i in range(0, len(ids), chunk):
        x = ids[i:i+chunk]
        yield pa.record_batch([pa.array(x), pa.array(x % 100), pa.array(x * 0.5), pa.array([f"name-{v}" for v in x])], names=["id","cat","amount","name"])


def run(ids: Any, b: int, prof: bool = False) -> None:
    o = parse_options({"table": "db.t", "warehouse": wh, "operation": "upsert", "primary_key": "id", "index_dir": wh + "/idx"})
    plan = plan_write(o, S, overwrite=False)
    t0 = time.perf_counter()
    if prof:
        pr = cProfile.Profile()
        pr.enable()
    msg = write_task(plan, batches(ids), who=TaskIdentity(batch_id=b, query_id="q"))
    t1 = time.perf_counter()
    out = commit_write(plan, decode_messages([msg]), b)
    t2 = time.perf_counter()
    if prof:
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime" if "-t" in sys.argv else "cumulative").print_stats(25)
    print(f"batch {b}: rows={len(ids)} task={t1-t0:.2f}s commit={t2-t1:.2f}s rows/s={len(ids)/(t2-t0):,.0f}", out.stats)


rng = np.random.default_rng(0)
run(np.arange(N), 0)
for b in range(1, 4):
    upd = rng.choice(N, 50000, replace=False)
    new = np.arange(N + (b - 1) * 50000, N + b * 50000)
    run(np.concatenate([upd, new]), b, prof=(b == 3 and "-p" in sys.argv))
