"""The scenarios: each is one function `(BenchContext) -> result dict`, registered below.

A scenario builds its `Side`s (the timed writes), hands them to `harness.measure` (warm-up,
alternating repetitions) and turns the medians into metrics and target checks. Later
scenarios (4 upsert, 5 CDC, 6 read cost) plug in the same way: write a function, add a
`Scenario` to `SCENARIOS`.

Result dict keys: id, key, title, rows, sides {name: summary}, runs {name: [raw runs]},
metrics {name: value}, targets [{name, value, target, op, passed, note}], notes [str],
throughput {label: rows/s} (what the plot shows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    DAYS,
    PARALLELISM,
    SCHEMA_DDL,
    BenchContext,
    Side,
    generate_data,
    inspect_lakesink,
    inspect_parquet_dir,
    log,
    measure,
    summarize,
)
from benchmarks.keyed_scenarios import scenario_cdc, scenario_keyed_tasks, scenario_read_cost, scenario_upsert
from benchmarks.read_scenarios import scenario_spark_read

TABLE = "bench.t"
OLAKE_ROWS_PER_S_PER_VCPU = 9_000
STREAM_TARGET_FACTOR = 40


@dataclass(frozen=True)
class Scenario:
    id: str
    key: str
    title: str
    run: Callable[[BenchContext], dict[str, Any]]


def _target(name: str, value: float | None, target: float, op: str, note: str = "") -> dict[str, Any]:
    if value is None:
        passed = None
    elif op == ">=":
        passed = value >= target
    elif op == "<=":
        passed = value <= target
    elif op == "within":  # |value - 1| <= target
        passed = abs(value - 1) <= target
    else:
        raise ValueError(op)
    return {"name": name, "value": value, "target": target, "op": op, "passed": passed, "note": note}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _lakesink_batch(ctx: BenchContext, df, partition_by: str | None = None) -> Side:  # type: ignore[no-untyped-def]
    def run(d: Path) -> None:
        writer = df.write.format("lakesink").option("table", TABLE).option("warehouse", str(d / "warehouse"))
        if partition_by:
            writer = writer.option("partition_by", partition_by)
        writer.mode("append").save()

    return Side("lakesink", run, lambda d: inspect_lakesink(d / "warehouse", TABLE), is_lakesink=True)


def _spark_parquet(df, partition_col: str | None = None) -> Side:  # type: ignore[no-untyped-def]
    def run(d: Path) -> None:
        writer = df.write.option("compression", "zstd")
        if partition_col:
            writer = writer.partitionBy(partition_col)
        writer.parquet(str(d / "out"))

    return Side("spark-parquet", run, lambda d: inspect_parquet_dir(d / "out"))


def _bare_parquet(df) -> Side:  # type: ignore[no-untyped-def]
    def run(d: Path) -> None:
        df.write.format("bare_parquet").option("path", str(d / "out")).mode("append").save()

    return Side("bare-pyarrow", run, lambda d: inspect_parquet_dir(d / "out"))


def _result(ctx: BenchContext, sc_id: str, key: str, title: str, rows: int, runs: dict[str, list]) -> dict[str, Any]:
    return {
        "id": sc_id,
        "key": key,
        "title": title,
        "rows": rows,
        "runs": runs,
        "sides": {name: summarize(recs, rows) for name, recs in runs.items()},
        "metrics": {},
        "targets": [],
        "notes": [],
        "throughput": {},
    }


def _side_value(res: dict[str, Any], side: str, key: str) -> Any:
    s = res["sides"].get(side, {})
    return s.get(key) if s.get("ok") else None


# --------------------------------------------------------------------------- 1. append


def scenario_append(ctx: BenchContext) -> dict[str, Any]:
    df, rows = ctx.data, ctx.config.rows
    runs = measure(ctx, "s1-append", [_lakesink_batch(ctx, df), _spark_parquet(df), _bare_parquet(df)], rows)
    res = _result(ctx, "1", "append", "Append, unpartitioned: lakesink vs Spark Parquet (zstd) and a bare pyarrow sink", rows, runs)
    lk, sp = _side_value(res, "lakesink", "rows_per_s"), _side_value(res, "spark-parquet", "rows_per_s")
    bare = _side_value(res, "bare-pyarrow", "rows_per_s")
    lk_out = res["sides"].get("lakesink", {}).get("output", {})
    sp_out = res["sides"].get("spark-parquet", {}).get("output", {})
    speed = _ratio(lk, sp)
    vs_bare = _ratio(lk, bare)
    size = _ratio(lk_out.get("bytes"), sp_out.get("bytes"))
    res["metrics"] = {
        "throughput_ratio": speed,
        "throughput_ratio_vs_bare_pyarrow": vs_bare,
        "bare_pyarrow_vs_spark": _ratio(bare, sp),
        "bytes_ratio": size,
        "lakesink_files": lk_out.get("files"),
        "spark_files": sp_out.get("files"),
        "lakesink_bytes": lk_out.get("bytes"),
        "spark_bytes": sp_out.get("bytes"),
    }
    res["targets"] = [
        _target("throughput lakesink / Spark", speed, 0.9, ">="),
        _target("throughput lakesink / bare pyarrow sink", vs_bare, 1.0, ">=", "the floor of a Python sink: Parquet encoding only"),
        _target("data bytes lakesink / Spark", size, 0.15, "within", "within 15% of Spark's total data-file bytes"),
    ]
    res["notes"].append(
        "`bare-pyarrow` is a Python data source that only writes Spark's Arrow batches with pyarrow (1M-row groups, "
        "zstd), no table or metadata: what any Python sink pays for the transfer and the Parquet encoding."
    )
    res["throughput"] = {"lakesink": lk, "spark-parquet": sp, "bare-pyarrow": bare}
    return res


# --------------------------------------------------------------------------- 2. partitioned append


def scenario_partitioned(ctx: BenchContext) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df, rows = ctx.data, ctx.config.rows
    # Spark needs a physical partition column: derived on the fly from the same cached
    # DataFrame (a cheap projection), so both sides read exactly the same cached data.
    with_day = df.withColumn("day", F.to_date("ts"))
    sides = [_lakesink_batch(ctx, df, partition_by="days(ts)"), _spark_parquet(with_day, partition_col="day")]
    runs = measure(ctx, "s2-partitioned", sides, rows)
    res = _result(ctx, "2", "partitioned", f"Append partitioned by days(ts) ({DAYS} days): lakesink vs Spark partitionBy(day)", rows, runs)
    lk, sp = _side_value(res, "lakesink", "rows_per_s"), _side_value(res, "spark-parquet", "rows_per_s")
    lk_out = res["sides"].get("lakesink", {}).get("output", {})
    sp_out = res["sides"].get("spark-parquet", {}).get("output", {})
    speed = _ratio(lk, sp)
    res["metrics"] = {
        "throughput_ratio": speed,
        "bytes_ratio": _ratio(lk_out.get("bytes"), sp_out.get("bytes")),
        "lakesink_files": lk_out.get("files"),
        "spark_files": sp_out.get("files"),
    }
    res["targets"] = [_target("throughput lakesink / Spark", speed, 1.0, ">=")]
    res["throughput"] = {"lakesink": lk, "spark-parquet": sp}
    return res


# --------------------------------------------------------------------------- 3. streaming append


def _stream_input(ctx: BenchContext) -> Path:
    """Pre-generated Parquet input (same rows as the batch data), written once per session."""
    path = ctx.cache.get("stream_input")
    if path is None:
        path = ctx.config.workdir / "stream-input"
        log(f"writing streaming input: {ctx.config.rows:,} rows in {ctx.config.stream_files} Parquet files")
        generate_data(ctx.spark, ctx.config.rows, partitions=ctx.config.stream_files).write.mode("overwrite").option(
            "compression", "zstd"
        ).parquet(str(path))
        ctx.cache["stream_input"] = path
    return path


def _stream_source(ctx: BenchContext, source: Path):  # type: ignore[no-untyped-def]
    return (
        ctx.spark.readStream.schema(SCHEMA_DDL)
        .option("maxFilesPerTrigger", ctx.config.stream_files_per_trigger)
        .parquet(str(source))
    )


def _run_query(query) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Wait for an availableNow query; return its progress summed over micro-batches."""
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = query.recentProgress
    out: dict[str, Any] = {"batches": len(progress), "batches_with_rows": sum(1 for p in progress if p.numInputRows)}
    for p in progress:
        for key, ms in (p.durationMs or {}).items():
            out[f"{key}_s"] = round(out.get(f"{key}_s", 0.0) + ms / 1000, 3)
    return out


def scenario_streaming(ctx: BenchContext) -> dict[str, Any]:
    source, rows = _stream_input(ctx), ctx.config.rows

    def lakesink(d: Path) -> dict[str, Any]:
        query = (
            _stream_source(ctx, source)
            .writeStream.format("lakesink")
            .option("table", TABLE)
            .option("warehouse", str(d / "warehouse"))
            .option("checkpointLocation", str(d / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        return _run_query(query)

    def spark_files(d: Path) -> dict[str, Any]:
        query = (
            _stream_source(ctx, source)
            .writeStream.format("parquet")
            .option("path", str(d / "out"))
            .option("compression", "zstd")
            .option("checkpointLocation", str(d / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        return _run_query(query)

    sides = [
        Side("lakesink", lakesink, lambda d: inspect_lakesink(d / "warehouse", TABLE), is_lakesink=True),
        Side("spark-parquet", spark_files, lambda d: inspect_parquet_dir(d / "out")),
    ]
    runs = measure(ctx, "s3-streaming", sides, rows)
    batches = -(-ctx.config.stream_files // ctx.config.stream_files_per_trigger)
    res = _result(
        ctx, "3", "streaming",
        f"Streaming append, availableNow over {ctx.config.stream_files} Parquet files "
        f"({ctx.config.stream_files_per_trigger} per trigger = {batches} micro-batches)",
        rows, runs,
    )
    lk, sp = _side_value(res, "lakesink", "rows_per_s"), _side_value(res, "spark-parquet", "rows_per_s")
    per_core = round(lk / PARALLELISM, 1) if lk else None
    target = OLAKE_ROWS_PER_S_PER_VCPU * STREAM_TARGET_FACTOR
    res["metrics"] = {
        "rows_per_s_per_core": per_core,
        "x_olake_anchor": round(per_core / OLAKE_ROWS_PER_S_PER_VCPU, 1) if per_core else None,
        "spark_rows_per_s_per_core": round(sp / PARALLELISM, 1) if sp else None,
        "throughput_ratio_vs_spark_file_sink": _ratio(lk, sp),
        "micro_batches": batches,
    }
    res["targets"] = [
        _target("lakesink rows/s per core", per_core, target, ">=", f"{STREAM_TARGET_FACTOR}x OLake's ~{OLAKE_ROWS_PER_S_PER_VCPU:,} rows/s/vCPU"),
    ]
    res["notes"].append(
        "Wall time from start() to the end of awaitTermination(): query start, file listing, every micro-batch "
        "(read Parquet, write, commit) and the checkpoint writes. Spark's own file sink is run the same way as a reference."
    )
    res["throughput"] = {"lakesink": lk, "spark-parquet": sp}
    return res


# --------------------------------------------------------------------------- 7. fanout memory


FANOUT_RSS_TARGET_MIB = 512


def _spark_parquet_by(df, column: str, expression: str) -> Side:  # type: ignore[no-untyped-def]
    """Spark's writer partitioned by a column derived on the fly from the cached data."""
    from pyspark.sql import functions as F

    derived = df.withColumn(column, F.expr(expression))
    side = _spark_parquet(derived, partition_col=column)
    side.max_reps = 1  # about 4 minutes a run on 2 cores: once keeps the full run under 30 minutes
    return side


def scenario_fanout(ctx: BenchContext) -> dict[str, Any]:
    """One batch over 1,000 identity partitions (`cat`) and over 10,000 (`bucket(10000, id)`,
    Spark: `pmod(id, 10000)`): peak RSS per Python task worker and throughput."""
    df, rows = ctx.data, ctx.config.rows
    runs: dict[str, list] = {}
    for label, lk_spec, spark_side in (
        ("1k", "cat", lambda: _spark_parquet(df, partition_col="cat")),
        ("10k", "bucket(10000, id)", lambda: _spark_parquet_by(df, "b", "pmod(id, 10000)")),
    ):
        sides = [_lakesink_batch(ctx, df, partition_by=lk_spec), spark_side()]
        for name, recs in measure(ctx, f"s7-fanout-{label}", sides, rows).items():
            runs[f"{name} ({label})"] = recs
    res = _result(ctx, "7", "fanout", "Fanout: one batch over 1,000 and 10,000 partitions", rows, runs)
    metrics: dict[str, Any] = {}
    for label in ("1k", "10k"):
        lk = res["sides"].get(f"lakesink ({label})", {})
        sp = res["sides"].get(f"spark-parquet ({label})", {})
        lk_out, sp_out = lk.get("output", {}), sp.get("output", {})
        rss = lk.get("peak_task_worker_mb")
        metrics.update({
            f"peak_task_worker_mb_{label}": rss,
            f"lakesink_files_{label}": lk_out.get("files"),
            f"spark_files_{label}": sp_out.get("files"),
            f"throughput_ratio_{label}": _ratio(
                _side_value(res, f"lakesink ({label})", "rows_per_s"), _side_value(res, f"spark-parquet ({label})", "rows_per_s")
            ),
        })
        res["targets"].append(_target(f"peak RSS per task worker, {label} partitions (MiB)", rss, FANOUT_RSS_TARGET_MIB, "<="))
        res["throughput"][f"lakesink {label}"] = _side_value(res, f"lakesink ({label})", "rows_per_s")
        res["throughput"][f"spark {label}"] = _side_value(res, f"spark-parquet ({label})", "rows_per_s")
    metrics["input_arrow_mib_per_task"] = round(ctx.bytes_per_row * rows / PARALLELISM / 2**20, 1)
    res["metrics"] = metrics
    res["notes"].append(
        "The rolling writer keeps each input chunk once and lets partitions hold row ranges of it (no per-partition "
        "copies), caps buffered Arrow data at 256 MiB per task, opens output streams with 64 KiB buffers, keeps at most "
        "100 files open, and returns the allocator's unused memory to the OS when a task ends."
    )
    return res


# --------------------------------------------------------------------------- 8. clustering


CLUSTER_INPUT_TASKS = 8  # an upstream with 8 partitions (e.g. 8 Kafka partitions or files)


def _lakesink_clustered(ctx: BenchContext, df, partition_by: str) -> Side:  # type: ignore[no-untyped-def]
    from lakesink_datasource import cluster_by_partition

    def run(d: Path) -> None:
        options = {"warehouse": str(d / "warehouse"), "partition_by": partition_by}
        clustered = cluster_by_partition(df, TABLE, **options)
        clustered.write.format("lakesink").option("table", TABLE).options(**options).mode("append").save()

    return Side("lakesink-clustered", run, lambda d: inspect_lakesink(d / "warehouse", TABLE), is_lakesink=True)


def scenario_clustering(ctx: BenchContext) -> dict[str, Any]:
    """Files per batch and throughput of a partitioned append from an 8-task input, as it
    comes and clustered by partition first (`cluster_by_partition`)."""
    df = ctx.data.repartition(CLUSTER_INPUT_TASKS)
    rows = ctx.config.rows
    spec = "days(ts)"
    sides = [_lakesink_batch(ctx, df, partition_by=spec), _lakesink_clustered(ctx, df, spec)]
    runs = measure(ctx, "s8-clustering", sides, rows)
    res = _result(ctx, "8", "clustering", f"Partitioned append from {CLUSTER_INPUT_TASKS} input tasks: as is vs cluster_by_partition", rows, runs)
    plain, clustered = _side_value(res, "lakesink", "rows_per_s"), _side_value(res, "lakesink-clustered", "rows_per_s")
    plain_out = res["sides"].get("lakesink", {}).get("output", {})
    clustered_out = res["sides"].get("lakesink-clustered", {}).get("output", {})
    res["metrics"] = {
        "files_as_is": plain_out.get("files"),
        "files_clustered": clustered_out.get("files"),
        "table_partitions": DAYS,
        "throughput_ratio_clustered_vs_as_is": _ratio(clustered, plain),
        "mean_file_bytes_as_is": _ratio(plain_out.get("bytes"), plain_out.get("files")),
        "mean_file_bytes_clustered": _ratio(clustered_out.get("bytes"), clustered_out.get("files")),
    }
    res["notes"].append(
        f"Both sides read the same cached data through repartition({CLUSTER_INPUT_TASKS}); the clustered side adds one "
        "shuffle by the Iceberg partition value, so each of the table's partitions is written by one task."
    )
    res["throughput"] = {"lakesink": plain, "lakesink-clustered": clustered}
    return res


SCENARIOS: list[Scenario] = [
    Scenario("1", "append", "Append, unpartitioned", scenario_append),
    Scenario("2", "partitioned", "Append, partitioned by days(ts)", scenario_partitioned),
    Scenario("3", "streaming", "Streaming append (availableNow)", scenario_streaming),
    Scenario("4", "upsert", "Upsert vs pyiceberg and delta-rs", scenario_upsert),
    Scenario("5", "cdc", "CDC mix with a sequence column", scenario_cdc),
    Scenario("6", "read", "Read cost of deletion vectors (DuckDB)", scenario_read_cost),
    Scenario("7", "fanout", "Fanout memory, 1,000 and 10,000 partitions", scenario_fanout),
    Scenario("8", "clustering", "Files per batch with cluster_by_partition", scenario_clustering),
    Scenario("9", "spark-read", "Reading back in Spark vs Spark's Parquet reader", scenario_spark_read),
    Scenario("10", "keyed-tasks", "Keyed upserts by 1 and by 2 tasks on one host", scenario_keyed_tasks),
]


def select(names: list[str] | None) -> list[Scenario]:
    if not names:
        return list(SCENARIOS)
    chosen: list[Scenario] = []
    for name in names:
        match = [s for s in SCENARIOS if name in (s.id, s.key)]
        if not match:
            valid = ", ".join(f"{s.id}/{s.key}" for s in SCENARIOS)
            raise SystemExit(f"unknown scenario {name!r} (valid: {valid})")
        chosen.extend(m for m in match if m not in chosen)
    return chosen
