"""Where a stream's compaction runs on a cluster, and what the driver spends (issue 39).

    python benchmarks/experiments/compaction-cluster/driver_cpu.py [BATCHES]

A standalone cluster of two one-core workers (tests/standalone_cluster.py) appends BATCHES
micro-batches of 1M rows (the stream-append benchmark's rows) into a table partitioned by
`cat` (20 values), so every batch writes 20 small files per task and the table needs
compaction. Once with `maintenance=auto` (the tasks rewrite, the driver plans and lands)
and once with `maintenance=background` (the driver's commit process rewrites, as `auto` did
before). From the sink's own events (benchmarks/_worker_hooks): the driver's CPU seconds per
batch in planning and commit; from the table: bytes rewritten per byte written and the
live files at the end; the query's time per batch.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.harness import log_events, tests_module, worker_environment
from benchmarks.stream_append import Case, make_source, table_stats

Cluster = tests_module("standalone_cluster").Cluster

ROOT = Path("/tmp/lakesink-compaction-cluster")


def main(batches: int) -> int:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    events = ROOT / "events.jsonl"
    worker_environment(events)  # before the cluster: its workers inherit it too
    source = make_source(ROOT, Case(f"1M x {batches}", batches, 1_000_000))
    cluster = Cluster(ROOT)
    cluster.start_master()
    for _ in range(2):
        cluster.start_worker(memory="3g", cores=1)
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.types import from_arrow_schema

    from lakesink_datasource import LakeSinkDataSource

    spark = (SparkSession.builder.master(cluster.master).appName("compaction-cluster")
             .config("spark.ui.enabled", "false").config("spark.executor.cores", "1").config("spark.cores.max", "2")
             .config("spark.executor.memory", "2g").config("spark.driver.memory", "2g")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LakeSinkDataSource)
    results = {}
    try:
        schema = from_arrow_schema(pq.read_schema(next(source.iterdir())))
        for mode in ("auto", "background"):
            warehouse = ROOT / f"warehouse-{mode}"
            options = {"table": "bench.events", "warehouse": str(warehouse), "maintenance": mode, "partition_by": "cat",
                       "progress": "false"}
            mark = events.stat().st_size if events.exists() else 0
            started = time.perf_counter()
            query = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
                     .writeStream.format("lakesink").options(**options)
                     .option("checkpointLocation", str(ROOT / f"checkpoint-{mode}")).trigger(availableNow=True).start())
            query.awaitTermination()
            from lakesink_datasource.maintenance.background import wait_for_table

            wait_for_table(options)
            seconds = time.perf_counter() - started
            with open(events) as fh:
                fh.seek(mark)
                got = log_events(fh.read())
            driver = [e for e in got if e.get("event") in ("driver_plan", "driver_commit")]
            per_batch: dict[object, float] = {}
            for e in driver:
                per_batch[e.get("batch")] = per_batch.get(e.get("batch"), 0.0) + e["cpu_seconds"]
            plans = [e["cpu_seconds"] for e in driver if e["event"] == "driver_plan"]
            commits = [e["cpu_seconds"] for e in driver if e["event"] == "driver_commit"]
            stats = table_stats(warehouse)
            results[mode] = {
                "seconds": round(seconds, 2), "batches": stats["batches"],
                "driver_cpu_per_batch_s": round((sum(plans) + sum(commits)) / max(stats["batches"], 1), 3),
                "driver_commit_cpu_s": [round(c, 3) for c in commits], "driver_plan_cpu_median_s": round(statistics.median(plans), 3),
                "write_amplification": round(stats["write_amplification"], 2), "live_files": stats["live_files"],
            }
            print(json.dumps({mode: results[mode]}), flush=True)
    finally:
        spark.stop()
        cluster.stop()
    out = Path(__file__).with_name(f"results-{time.strftime('%Y-%m-%d')}.json")
    out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
