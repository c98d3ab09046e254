"""Spark-free replay of the long stream with the two tasks in two long-lived worker processes, as
Spark runs them (usage: python replay_two_workers.py WORKDIR BATCHES RETENTION_MS). Reproduces the
task-side growth the Spark run shows; the same replay in one process stays flat."""
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time

import pyarrow as pa
from pyspark.sql import types as T

root, batches, retention = sys.argv[1], int(sys.argv[2]), sys.argv[3]
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("version", T.LongType()),
                       T.StructField("ts", T.TimestampType()), T.StructField("payload", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("version", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("payload", pa.string())])
raw = {"table": "bench.stream", "warehouse": f"{root}/warehouse", "index_dir": f"{root}/index", "operation": "upsert",
       "primary_key": "id", "partition_by": "bucket(4, id)", "property.history.expire.max-snapshot-age-ms": retention, "progress": "false"}

def task(args):
    plan, part, value, b = args
    from lakesink_datasource.write.task import TaskIdentity, write_task
    vals = list(range(value + part, value + 2000, 2))
    batch = pa.RecordBatch.from_pydict({"id": [v % 50000 for v in vals], "version": vals, "ts": [1_700_000_000_000_000] * len(vals),
                                        "payload": [f"payload-{v}" for v in vals]}, schema=ARROW)
    t = time.perf_counter()
    m = write_task(plan, iter([batch]), TaskIdentity(partition_id=part, batch_id=b, query_id="q"))
    return m, time.perf_counter() - t, os.getpid()

if __name__ == "__main__":
    shutil.rmtree(root, ignore_errors=True)
    from lakesink_datasource.datasource import LakeSinkStreamWriter
    from lakesink_datasource.options import parse_options
    from lakesink_datasource.table.setup import plan_write
    ctx = mp.get_context("spawn")
    pools = [ctx.Pool(1), ctx.Pool(1)]
    value = 0
    rows = []
    for b in range(batches):
        plan = plan_write(parse_options(raw), SCHEMA, overwrite=False)
        t0 = time.perf_counter()
        futs = [pools[p].apply_async(task, ((plan, p, value, b),)) for p in range(2)]
        res = [f.get() for f in futs]
        t1 = time.perf_counter()
        LakeSinkStreamWriter(plan).commit([r[0] for r in res], b)
        t2 = time.perf_counter()
        value += 2000
        idx = f"{root}/index"
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(idx) for f in fs if f == "data.mdb")
        rows.append((t1 - t0, sum(r[1] for r in res), t2 - t1, size))
        if b % 100 == 0:
            print(b, "tasks wall {:.3f} sum {:.3f} commit {:.3f} index bytes {}".format(*rows[-1]), flush=True)
    n = len(rows) // 10
    for name, part in (("first", rows[:n]), ("last", rows[-n:])):
        print(name, "tasks wall {:.3f} sum {:.3f} commit {:.3f}".format(*tuple(statistics.median(x[i] for x in part) for i in range(3))), "index bytes", part[-1][3])
