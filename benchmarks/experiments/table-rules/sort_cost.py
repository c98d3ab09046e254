"""What sorting by the table's order costs a streaming append (issue 45, part 2).

One warm local[2] Spark session; 5 micro-batches of 1M rows (a long in random order, a
double, a string) streamed from Parquet files into two tables side by side, one created with
`sort_by="id"` and one unsorted, --runs times alternating which goes first. Reports each
side's median wall time per run and the ratio, as Markdown.

With --upsert the same as keyed upserts (primary key id, ids drawn from twice the batch's
rows, so later batches replace about half of their keys): a keyed write sorts each chunk
of 100,000 rows as it arrives, so random keys make one file per chunk (docs/limits.md).

usage: python benchmarks/experiments/table-rules/sort_cost.py [--runs 3] [--rows 1000000] [--batches 5] [--upsert]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--upsert", action="store_true", help="keyed upserts by id instead of appends")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LakeSinkDataSource)
    work = tempfile.mkdtemp(prefix="lakesink-sort-cost-")
    source = os.path.join(work, "source")
    os.makedirs(source)
    rng = np.random.default_rng(3)
    for b in range(args.batches):
        ids = rng.integers(0, 2 * args.rows, args.rows) if args.upsert else rng.integers(0, 1 << 62, args.rows)
        table = pa.table({"id": ids, "x": rng.random(args.rows), "s": pa.array(np.char.add("s", (ids % 100_000).astype(str)).tolist())})
        pq.write_table(table, os.path.join(source, f"{b:03d}.parquet"))
        os.utime(os.path.join(source, f"{b:03d}.parquet"), (1_700_000_000 + b, 1_700_000_000 + b))
    times: dict[str, list[float]] = {"unsorted": [], "sorted by id": []}

    def run(side: str, n: int) -> float:
        options = {"warehouse": os.path.join(work, "wh"), "table": f"db.{side.replace(' ', '_')}_{n}", "progress": "false"}
        if side != "unsorted":
            options["sort_by"] = "id"
        if args.upsert:
            options.update(operation="upsert", primary_key="id", index_dir=os.path.join(work, "idx"))
        started = time.perf_counter()
        query = (spark.readStream.schema("id long, x double, s string").option("maxFilesPerTrigger", 1).parquet(source)
                 .writeStream.format("lakesink").options(**options)
                 .option("checkpointLocation", os.path.join(work, f"ck-{side}-{n}")).trigger(availableNow=True).start())
        query.awaitTermination()
        return time.perf_counter() - started

    run("unsorted", -1)  # warm-up: the session's Python workers and imports
    for n in range(args.runs):
        sides = list(times) if n % 2 == 0 else list(reversed(times))
        for side in sides:
            times[side].append(run(side, n))
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    base, sorted_ = statistics.median(times["unsorted"]), statistics.median(times["sorted by id"])
    what = "Keyed upserts" if args.upsert else "Streaming append"
    print(f"## {what}, {args.batches} x {args.rows:,} rows, sorted by a long column or not "
          f"({time.strftime('%Y-%m-%d')}, local[2], {args.runs} runs alternating)\n")
    print("| side | runs (s) | median (s) |")
    print("|---|---|---|")
    for side, values in times.items():
        print(f"| {side} | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} |")
    pairs = [s / u for s, u in zip(times["sorted by id"], times["unsorted"])]
    print(f"\nsorted / unsorted: **{sorted_ / base:.2f}x** (pairs {', '.join(f'{p:.2f}' for p in pairs)}); target at most 1.3x")


if __name__ == "__main__":
    main()
