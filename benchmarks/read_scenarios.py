"""Scenario 9: reading back through lakesink's Spark reader.

Three comparisons, each side timed alternately after a warm-up (median of the reps):
- full scan: lakesink's reader vs Spark's own Parquet reader on the same data files (both
  write every column to Spark's `noop` sink, so neither can skip columns);
- deletes: the same rows read through lakesink from a table that hides 10% of them with DVs
  (after an upsert) vs a table without deletes;
- a selective filter (one day of 100) with filter pushdown on, vs the full scan of the same
  partitioned table; Spark's Parquet reader on those files with the same filter for reference.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import BenchContext, log

TARGET_FULL_SCAN = 0.7
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
DAY_FILTER = "ts >= TIMESTAMP '2026-01-05 00:00:00' AND ts < TIMESTAMP '2026-01-06 00:00:00'"


def _data_files(warehouse: Path, identifier: str) -> list[str]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    table = catalog.load_table(identifier)
    return [task.file.file_path for task in table.scan().plan_files()]


def _time_alternating(sides: dict[str, Callable[[], None]], warmup: int, reps: int) -> dict[str, list[float]]:
    names = list(sides)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(warmup + reps):
        for name in names if rep % 2 == 0 else reversed(names):
            started = time.perf_counter()
            sides[name]()
            if rep >= warmup:
                times[name].append(time.perf_counter() - started)
    return times


def _summary(times: list[float], rows: int) -> dict[str, Any]:
    median = statistics.median(times)
    return {"ok": True, "reps": len(times), "median_s": round(median, 4), "min_s": round(min(times), 4),
            "max_s": round(max(times), 4), "rows_per_s": round(rows / median, 1)}


def scenario_spark_read(ctx: BenchContext) -> dict[str, Any]:
    spark, rows = ctx.spark, ctx.config.rows
    root = ctx.config.workdir / "read"
    shutil.rmtree(root, ignore_errors=True)
    warehouse = root / "warehouse"

    def write(identifier: str, df: Any, **options: str) -> None:
        writer = df.write.format("lakesink").option("warehouse", str(warehouse)).option("maintenance", "off")
        for k, v in options.items():
            writer = writer.option(k, v)
        writer.mode("append").save(identifier)

    log("scenario 9: writing the tables to read")
    write("bench.flat", ctx.data)
    write("bench.keyed", ctx.data, operation="upsert", primary_key="id", index_dir=str(root / "idx"))
    write("bench.keyed", ctx.data.sample(fraction=0.1, seed=7), operation="upsert", index_dir=str(root / "idx"))
    write("bench.daily", ctx.data, partition_by="days(ts)")

    def lakesink(identifier: str, where: str | None = None) -> Callable[[], None]:
        def run() -> None:
            df = spark.read.format("lakesink").option("warehouse", str(warehouse)).load(identifier)
            (df.filter(where) if where else df).write.format("noop").mode("overwrite").save()
        return run

    def bare(files: list[str]) -> Callable[[], None]:
        def run() -> None:
            spark.read.format("bare_parquet_read").schema(ctx.data.schema).option("paths", ",".join(files)).load() \
                .write.format("noop").mode("overwrite").save()
        return run

    def parquet(files: list[str], where: str | None = None) -> Callable[[], None]:
        def run() -> None:
            df = spark.read.parquet(*files)
            (df.filter(where) if where else df).write.format("noop").mode("overwrite").save()
        return run

    warmup, reps = ctx.config.warmup, ctx.config.reps
    flat_files = _data_files(warehouse, "bench.flat")
    full = _time_alternating({"lakesink": lakesink("bench.flat"), "spark-parquet": parquet(flat_files),
                              "bare-pyarrow-reader": bare(flat_files)}, warmup, reps)
    deletes = _time_alternating({"lakesink, 10% hidden by DVs": lakesink("bench.keyed"), "lakesink, no deletes": lakesink("bench.flat")},
                                warmup, reps)
    spark.conf.set(PUSHDOWN, "true")
    try:
        daily_files = _data_files(warehouse, "bench.daily")
        selective = _time_alternating({
            "lakesink, one day (pushdown)": lakesink("bench.daily", DAY_FILTER),
            "lakesink, full scan": lakesink("bench.daily"),
            "spark-parquet, one day": parquet(daily_files, DAY_FILTER),
        }, warmup, reps)
        pruned_partitions = spark.read.format("lakesink").option("warehouse", str(warehouse)).load("bench.daily") \
            .filter(DAY_FILTER).rdd.getNumPartitions()
    finally:
        spark.conf.unset(PUSHDOWN)
    shutil.rmtree(root, ignore_errors=True)

    medians = {k: statistics.median(v) for group in (full, deletes, selective) for k, v in group.items()}
    full_ratio = round(medians["spark-parquet"] / medians["lakesink"], 3)  # throughput ratio
    floor_ratio = round(medians["spark-parquet"] / medians["bare-pyarrow-reader"], 3)
    dv_ratio = round(medians["lakesink, 10% hidden by DVs"] / medians["lakesink, no deletes"], 3)
    filter_ratio = round(medians["lakesink, one day (pushdown)"] / medians["lakesink, full scan"], 3)
    runs = {k: [round(x, 4) for x in v] for group in (full, deletes, selective) for k, v in group.items()}
    return {
        "id": "9", "key": "spark-read", "rows": rows,
        "title": f"Reading {rows:,} rows back in Spark: lakesink's reader vs Spark's Parquet reader on the same files",
        "runs": runs,
        "sides": {k: _summary(v, rows) for k, v in runs.items()},
        "metrics": {
            "full_scan_throughput_ratio": full_ratio,
            "bare_python_reader_vs_spark_throughput_ratio": floor_ratio,
            "dv_read_time_ratio": dv_ratio,
            "one_day_vs_full_scan_time_ratio": filter_ratio,
            "daily_files": len(daily_files),
            "spark_partitions_after_pruning": pruned_partitions,
        },
        "targets": [{"name": "full-scan throughput lakesink / Spark Parquet", "value": full_ratio, "target": TARGET_FULL_SCAN,
                     "op": ">=", "passed": full_ratio >= TARGET_FULL_SCAN, "note": ""}],
        "notes": [
            "Every side writes all columns to Spark's noop sink: Spark 4.3 offers Python data sources no column pruning.",
            "`bare-pyarrow-reader` is a Python data source that only reads the same files with pyarrow and yields the "
            "batches: the floor of any Python reader (Spark's transfer of Arrow batches from a Python worker).",
            f"The one-day filter keeps {pruned_partitions} Spark partition(s) of the {len(daily_files)}-file daily table.",
        ],
        "throughput": {"lakesink full scan": round(rows / medians["lakesink"], 1),
                       "bare pyarrow reader": round(rows / medians["bare-pyarrow-reader"], 1),
                       "spark-parquet full scan": round(rows / medians["spark-parquet"], 1)},
    }
