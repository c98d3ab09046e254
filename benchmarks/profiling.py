"""`python -m benchmarks profile append`: where scenario 1's lakesink write spends its time.

1. Checks whether Spark's own Python profilers see a Python data source writer
   (`spark.sql.pyspark.udf.profiler=perf` -> `spark.profile.show()`, and
   `spark.python.profile=true` -> `sc.show_profiles()`), and records what they printed.
2. Runs scenario 1's write through `lakesink_profiled` (benchmarks/profiled_sink.py: the
   same plan, tasks and commit as `lakesink`) twice: once timing each task and the time it
   waits for Arrow batches from the JVM, once under cProfile in every task and the commit.
3. Runs `lakesink_datasource.write.task.write_task` directly on the same rows as Arrow
   batches outside Spark (one task's share, 10,000-row batches), timed and under cProfile:
   the Python-side cost with no JVM, no Arrow IPC, no scheduling.
4. Writes PROFILE.md (and keeps the .prof files in the work directory if asked).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import pstats
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import harness

# (label, file suffix, function name): cumulative times reported per call site. They nest.
KEY_FUNCTIONS = [
    ("write_task (whole task)", "lakesink_datasource/write/task.py", "write_task"),
    ("  waiting for the next Arrow batch (JVM -> Python)", "benchmarks/profiled_sink.py", "__next__"),
    ("  BatchAligner.align", "schema/arrow_align.py", "align"),
    ("  PartitionSplitter.split", "io/partitioning.py", "split"),
    ("  PartitionedParquetWriter.write (buffering)", "io/rolling_writer.py", "write"),
    ("  PartitionedParquetWriter.close (final flush + footers)", "io/rolling_writer.py", "close"),
    ("    _flush (concat buffers, write row groups)", "io/rolling_writer.py", "_flush"),
    ("      pyarrow concat_tables", "pyarrow/__init__.py", "concat_tables"),
    ("      _write_row_group", "io/rolling_writer.py", "_write_row_group"),
    ("        pyarrow ParquetWriter.write_table (encode + compress + write)", "pyarrow/parquet/core.py", "write_table"),
    ("        count_nans", "io/metrics.py", "count_nans"),
    ("    _close_file (footer + file metrics)", "io/rolling_writer.py", "_close_file"),
    ("      data_file_message (Iceberg metrics from footer)", "io/metrics.py", "data_file_message"),
    ("  metadata_cache.load", "table/metadata_cache.py", "load"),
]


def _cumulative(stats: pstats.Stats, suffix: str, func: str) -> float | None:
    total, found = 0.0, False
    for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name == func and filename.replace("\\", "/").endswith(suffix):
            total += ct
            found = True
    return total if found else None


def _top(stats: pstats.Stats, sort: str, n: int) -> str:
    buf = io.StringIO()
    stats.stream = buf  # type: ignore[attr-defined]
    stats.sort_stats(sort).print_stats(n)
    text = buf.getvalue()
    # Keep the table, drop pstats' preamble; shorten site-packages paths.
    start = text.find("   ncalls")
    text = text[start:] if start >= 0 else text
    return text.replace(str(Path(harness.__file__).resolve().parents[1]) + "/", "").replace(
        os.path.dirname(os.path.dirname(pstats.__file__)) + "/", ""
    ).replace(".venv/lib/python3.11/site-packages/", "")


def _short_paths(text: str) -> str:
    import site

    for prefix in site.getsitepackages():
        text = text.replace(prefix + "/", "")
    return text


def _load(files: list[str]) -> pstats.Stats | None:
    if not files:
        return None
    stats = pstats.Stats(files[0])
    for f in files[1:]:
        stats.add(f)
    return stats


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(Path(f).read_text()) for f in sorted(glob.glob(str(path / "*.json")))]


def _spark_profilers(spark, df, workdir: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """What Spark's built-in profilers report for a lakesink write (they see UDFs, not data sources)."""
    out: dict[str, str] = {}
    spark.conf.set("spark.sql.pyspark.udf.profiler", "perf")
    try:
        wh = workdir / "spark-profiler"
        df.write.format("lakesink").option("table", "bench.t").option("warehouse", str(wh)).mode("append").save()
        for kind in ("perf", "memory"):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    spark.profile.show(type=kind)
                except Exception as exc:  # noqa: BLE001 - profiling is best effort
                    print(f"error: {exc}")
            out[f"spark.profile.show(type={kind!r}) with spark.sql.pyspark.udf.profiler=perf"] = buf.getvalue().strip()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            try:
                spark.sparkContext.show_profiles()
            except Exception as exc:  # noqa: BLE001 - profiling is best effort
                print(f"error: {exc}")
        out["sc.show_profiles() with spark.python.profile=true"] = buf.getvalue().strip()
    finally:
        spark.conf.unset("spark.sql.pyspark.udf.profiler")
    return out


def _direct(df, rows: int, workdir: Path, partition_by: str | None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """write_task on one task's share of the rows, outside Spark."""
    import cProfile

    from lakesink_datasource.options import parse_options
    from lakesink_datasource.table.setup import plan_write
    from lakesink_datasource.write.task import TaskIdentity, write_task

    table = df.toArrow()
    share = table.slice(0, rows // harness.PARALLELISM)
    batches = share.to_batches(max_chunksize=10_000)
    wh = workdir / "wh-direct"
    shutil.rmtree(wh, ignore_errors=True)
    options = {"table": "bench.direct", "warehouse": str(wh)}
    if partition_by:
        options["partition_by"] = partition_by
    plan = plan_write(parse_options(options), df.schema, False)
    # The first run warms caches and doubles as the memory measurement (fresh allocator).
    memory = _measure_memory(lambda: write_task(plan, iter(batches), TaskIdentity(partition_id=99)))
    timings = []
    for attempt in range(3):
        t0 = time.perf_counter()
        message = write_task(plan, iter(batches), TaskIdentity(partition_id=attempt))
        timings.append((time.perf_counter() - t0, message.result().stats))
    plain_s, stats = sorted(timings, key=lambda t: t[0])[1]  # the median of 3
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    write_task(plan, iter(batches), TaskIdentity(partition_id=10))
    profiler.disable()
    profiled_s = time.perf_counter() - t0
    prof_path = workdir / "direct.prof"
    profiler.dump_stats(str(prof_path))
    shutil.rmtree(wh, ignore_errors=True)
    return {
        "rows": share.num_rows,
        "batches": len(batches),
        "plain_s": plain_s,
        "profiled_s": profiled_s,
        "partition_s": stats.partition_seconds,
        "write_s": stats.write_seconds,
        "bytes": stats.bytes_written,
        "stats": pstats.Stats(str(prof_path)),
        "memory": memory,
        "input_arrow_bytes": share.nbytes,
    }


def _measure_memory(run) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Run one write_task in this process and compare what the writer accounts for
    (`peak_buffered_bytes`, the figure its buffer limit applies to) with what Arrow really
    allocated (pyarrow.total_allocated_bytes, sampled) and the process's RSS growth."""
    import threading

    import pyarrow as pa

    from lakesink_datasource.write import task_writers as task_module

    writers: list[Any] = []
    original = task_module.PartitionedParquetWriter

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            writers.append(self)

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    peak_arrow = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak_arrow[0] = max(peak_arrow[0], pa.total_allocated_bytes())

    base_arrow = pa.total_allocated_bytes()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base_rss = status("VmRSS")
    sampler = threading.Thread(target=sample, daemon=True)
    task_module.PartitionedParquetWriter = Recording  # type: ignore[misc]
    sampler.start()
    try:
        run()
    finally:
        stop.set()
        sampler.join()
        task_module.PartitionedParquetWriter = original  # type: ignore[misc]
    return {
        "accounted_peak_buffered_bytes": max((w.peak_buffered_bytes for w in writers), default=0),
        "arrow_allocated_peak_bytes": max(peak_arrow[0] - base_arrow, 0),
        "rss_growth_bytes": status("VmHWM") - base_rss,
    }


# target -> (lakesink partition_by, Spark partition column, Spark-side derived column, output file)
TARGETS = {
    "append": (None, None, None, "PROFILE.md"),
    "partitioned": ("days(ts)", "day", "day", "PROFILE-partitioned.md"),
    "fanout": ("cat", "cat", None, "PROFILE-fanout.md"),
}


def _lakesink_write(df, fmt: str, warehouse: Path, partition_by: str | None) -> float:  # type: ignore[no-untyped-def]
    writer = df.write.format(fmt).option("table", "bench.t").option("warehouse", str(warehouse))
    if partition_by:
        writer = writer.option("partition_by", partition_by)
    t0 = time.perf_counter()
    writer.mode("append").save()
    return time.perf_counter() - t0


def main(args: argparse.Namespace) -> int:
    partition_by, spark_col, derived, out_name = TARGETS[args.target]
    config = harness.BenchConfig(rows=args.rows, workdir=Path(args.workdir).resolve())
    out_dir = Path(args.out).resolve() if args.out else harness.OUT_DIR
    shutil.rmtree(config.workdir, ignore_errors=True)
    config.workdir.mkdir(parents=True)
    phases = harness.PhaseLog(config.workdir / "lakesink-phases.log")
    profile_dir = config.workdir / "profiles"
    # Workers are started once and reused, so their environment cannot switch modes between
    # writes: the profiled sink re-reads the mode from this file at every write/commit.
    mode_file = config.workdir / "profile-mode"
    harness.worker_environment(
        phases.path,
        {"LAKESINK_BENCH_PROFILE_DIR": str(profile_dir), "LAKESINK_BENCH_PROFILE_MODE_FILE": str(mode_file)},
    )
    spark = harness.start_spark(config, {"spark.python.profile": "true"})
    from benchmarks.profiled_sink import ProfiledLakeSink

    spark.dataSource.register(ProfiledLakeSink)
    try:
        harness.log(f"profile {args.target}: {config.rows:,} rows, partition_by={partition_by}")
        df = harness.generate_data(spark, config.rows).cache()
        df.count()
        # Warm-up: workers started, modules imported, as in the benchmark's timed runs.
        warm_s = _lakesink_write(df, "lakesink", config.workdir / "wh-warm", partition_by)
        shutil.rmtree(config.workdir / "wh-warm", ignore_errors=True)
        harness.log(f"warm-up write: {warm_s:.2f} s")
        spark_profilers = _spark_profilers(spark, df, config.workdir)
        harness.log("spark profilers checked")

        runs = {}
        for mode in ("time", "cprofile"):
            mode_file.write_text(mode)
            shutil.rmtree(profile_dir, ignore_errors=True)
            profile_dir.mkdir(parents=True)
            wh = config.workdir / f"wh-{mode}"
            phases.mark()
            wall = _lakesink_write(df, "lakesink_profiled", wh, partition_by)
            task_profiles = sorted(glob.glob(str(profile_dir / "task-*.prof")))
            commit_profiles = sorted(glob.glob(str(profile_dir / "commit-*.prof")))
            runs[mode] = {
                "wall_s": wall,
                "records": _records(profile_dir),
                "phases": phases.read_new(),
                "task_stats": _load(task_profiles),
                "commit_stats": _load(commit_profiles),
            }
            harness.log(f"lakesink_profiled ({mode}): {wall:.2f} s")
        # File sizes: the untimed `time` run's table against Spark's writer on the same data.
        spark_out = config.workdir / "spark-out"
        sdf = df.withColumn("day", __import__("pyspark.sql.functions", fromlist=["to_date"]).to_date("ts")) if derived else df
        writer = sdf.write.option("compression", "zstd")
        if spark_col:
            writer = writer.partitionBy(spark_col)
        writer.parquet(str(spark_out))
        sizes = _compare_sizes(config.workdir / "wh-time", spark_out)
        harness.log(f"sizes: lakesink/spark = {sizes['ratio']:.3f}")
        direct = _direct(df, config.rows, config.workdir, partition_by)
        harness.log(f"direct write_task: {direct['plain_s']:.2f} s plain, {direct['profiled_s']:.2f} s profiled")
        from benchmarks import report

        env = report.environment(spark)
    finally:
        spark.stop()
    path = out_dir / out_name
    write_profile(path, args.target, partition_by, config, env, warm_s, spark_profilers, runs, sizes, direct, args.top)
    harness.log(f"wrote {path}")
    shutil.rmtree(config.workdir, ignore_errors=True)
    return 0


def _column_bytes(files: list[Path]) -> tuple[dict[str, int], dict[str, set[str]]]:
    import pyarrow.parquet as pq

    sizes: dict[str, int] = {}
    encodings: dict[str, set[str]] = {}
    for f in files:
        md = pq.read_metadata(f)
        for rg in range(md.num_row_groups):
            group = md.row_group(rg)
            for c in range(group.num_columns):
                col = group.column(c)
                sizes[col.path_in_schema] = sizes.get(col.path_in_schema, 0) + col.total_compressed_size
                encodings.setdefault(col.path_in_schema, set()).update(col.encodings)
    return sizes, encodings


def _compare_sizes(warehouse: Path, spark_out: Path) -> dict[str, Any]:
    """Per-column compressed bytes of both outputs, and one lakesink file re-encoded without
    dictionaries for its high-cardinality columns (what parquet-mr ends up doing)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lk_files = harness.parquet_files(warehouse / "bench" / "t" / "data")
    sp_files = harness.parquet_files(spark_out)
    lk_cols, lk_enc = _column_bytes(lk_files)
    sp_cols, sp_enc = _column_bytes(sp_files)
    lk_total = sum(p.stat().st_size for p in lk_files)
    sp_total = sum(p.stat().st_size for p in sp_files)
    sample = sorted(lk_files, key=lambda p: p.stat().st_size)[len(lk_files) // 2]
    table = pq.read_table(sample)
    low_card = [n for n in table.column_names if pc.count_distinct(table[n]).as_py() <= table.num_rows // 2]
    variants = {}
    scratch = warehouse.parent / "reencode.parquet"
    for label, kwargs in (
        ("as lakesink writes it (pyarrow defaults, zstd)", {}),
        (f"dictionary only for low-cardinality columns ({', '.join(low_card) or 'none'})", {"use_dictionary": low_card or False}),
        ("no dictionary at all", {"use_dictionary": False}),
    ):
        pq.write_table(table, scratch, compression="zstd", **kwargs)
        variants[label] = scratch.stat().st_size
    scratch.unlink(missing_ok=True)
    return {
        "lakesink_files": len(lk_files), "spark_files": len(sp_files),
        "lakesink_bytes": lk_total, "spark_bytes": sp_total, "ratio": lk_total / sp_total if sp_total else float("nan"),
        "columns": {c: (lk_cols.get(c, 0), sp_cols.get(c, 0), sorted(lk_enc.get(c, ())), sorted(sp_enc.get(c, ()))) for c in lk_cols},
        "sample_rows": table.num_rows, "sample_bytes": sample.stat().st_size, "variants": variants,
    }


def _indent(label: str) -> str:
    depth = len(label) - len(label.lstrip(" "))
    return "&nbsp;" * depth + label.strip()


TITLES = {
    "append": "scenario 1 (unpartitioned append)",
    "partitioned": "scenario 2 (append partitioned by days(ts))",
    "fanout": "scenario 7 (fanout over 1000 identity partitions)",
}


def write_profile(path: Path, target: str, partition_by: str | None, config: harness.BenchConfig, env: dict[str, Any],
                  warm_s: float, spark_profilers: dict[str, str], runs: dict[str, Any], sizes: dict[str, Any],
                  direct: dict[str, Any], top: int) -> None:
    rows = config.rows
    lines: list[str] = []
    add = lines.append
    add(f"# Profile: {TITLES[target]}, lakesink side")
    add("")
    add(f"Generated by `python -m benchmarks profile {target} --rows {rows}` (see benchmarks/profiling.py and README.md). "
        "Single runs, not medians: read proportions, not absolute speeds (RESULTS.md has the medians).")
    add("")
    add(f"- **Date**: {env['date']}; {env['cores']} cores, {env['memory_gib']} GiB; Spark {env['spark']}, pyiceberg {env['pyiceberg']}, "
        f"pyarrow {env['pyarrow']}, Python {env['python']}; 1-minute load average at the end {os.getloadavg()[0]:.2f}")
    add(f"- **Data**: {rows:,} rows of the benchmark data (cached, 2 partitions = 2 tasks of {rows // 2:,} rows, Arrow batches "
        f"of 10,000 rows); `partition_by` = {partition_by or '(none)'}")
    add(f"- **First (warm-up) `lakesink` write of the session**: {warm_s:.2f} s (includes starting the Python workers)")
    add("")

    add("## 1. Spark's own Python profilers")
    add("")
    captured = any(v and "error" not in v for v in spark_profilers.values())
    for name, text in spark_profilers.items():
        add(f"- `{name}`: " + ("printed nothing" if not text else f"printed {len(text.splitlines())} lines"))
    add("")
    add(
        "Spark's profilers hook Python UDFs (and RDD functions); a Python data source's `write()` runs inside Spark's "
        "internal map-in-Arrow function, which neither profiler instruments"
        + (", so they capture nothing for it. The figures below come from the benchmark's own instrumentation."
           if not captured else ". (They did print something this time: see the raw output above.)")
    )
    add("")

    t = runs["time"]
    tasks = [r for r in t["records"] if r["kind"] == "task"]
    commits = [r for r in t["records"] if r["kind"] == "commit"]
    add("## 2. Inside Spark: per task (no profiler)")
    add("")
    add(f"`lakesink_profiled` write: **{t['wall_s']:.2f} s** wall ({rows / t['wall_s']:,.0f} rows/s). Per task (`write()` in the Python worker):")
    add("")
    add("| task | rows | batches | write() wall | waiting for Arrow batches from the JVM | partition_s (align + split) | write_s (buffer + Parquet) | rest |")
    add("|---|---|---|---|---|---|---|---|")
    for r in sorted(tasks, key=lambda r: r.get("partition") or 0):
        rest = r["wall_s"] - r.get("input_wait_s", 0) - r.get("partition_s", 0) - r.get("write_s", 0)
        add(f"| {r.get('partition')} | {r.get('rows', 0):,} | {r.get('batches', 0)} | {r['wall_s']:.2f} | {r.get('input_wait_s', 0):.2f} | "
            f"{r.get('partition_s', 0):.2f} | {r.get('write_s', 0):.2f} | {rest:.2f} |")
    for r in commits:
        add(f"| commit (driver) | | | {r['wall_s']:.2f} | | | | |")
    add("")
    if tasks:
        wall = max(r["wall_s"] for r in tasks)
        wait = statistics.mean(r.get("input_wait_s", 0) for r in tasks)
        write_s = statistics.mean(r.get("write_s", 0) for r in tasks)
        add(
            f"Job wall {t['wall_s']:.2f} s vs slowest task {wall:.2f} s: the remaining {t['wall_s'] - wall:.2f} s are planning "
            "(`writer()` in the planner process, table creation), scheduling and the commit. Inside a task, "
            f"{wait / max(wall, 1e-9):.0%} of the time is spent waiting for input batches (Spark reading its cache, converting "
            f"rows to Arrow and streaming them to the worker) and {write_s / max(wall, 1e-9):.0%} in lakesink's Parquet writing."
        )
        add("")
    add(f"Commit log line phases: `{t['phases']}`")
    add("")

    c = runs["cprofile"]
    add("## 3. Inside Spark under cProfile (both tasks merged)")
    add("")
    add(f"Write wall under the profiler: {c['wall_s']:.2f} s (profiler overhead included).")
    add("")
    stats = c["task_stats"]
    if stats is not None:
        add("Cumulative time of the main steps (they nest; summed over the 2 tasks):")
        add("")
        add("| step | cumulative s |")
        add("|---|---|")
        for label, suffix, func in KEY_FUNCTIONS:
            value = _cumulative(stats, suffix, func)
            if value is not None:
                add(f"| {_indent(label)} | {value:.2f} |")
        add("")
        add(f"Top {top} functions by own time (tottime):")
        add("")
        add("```")
        add(_short_paths(_top(stats, "tottime", top)).rstrip())
        add("```")
        add("")
        add(f"Top {top} by cumulative time:")
        add("")
        add("```")
        add(_short_paths(_top(stats, "cumulative", top)).rstrip())
        add("```")
        add("")
    if c["commit_stats"] is not None:
        add("Driver commit (`commit()` in the commit process), top 15 by cumulative time:")
        add("")
        add("```")
        add(_short_paths(_top(c["commit_stats"], "cumulative", 15)).rstrip())
        add("```")
        add("")

    add("## 4. Output size against Spark's Parquet writer (same rows, zstd)")
    add("")
    add(f"lakesink {sizes['lakesink_files']:,} files, {sizes['lakesink_bytes'] / 2**20:,.1f} MiB; Spark {sizes['spark_files']:,} files, "
        f"{sizes['spark_bytes'] / 2**20:,.1f} MiB: ratio **{sizes['ratio']:.3f}**. Compressed bytes per column, summed over files:")
    add("")
    add("| column | lakesink MiB | Spark MiB | ratio | lakesink encodings | Spark encodings |")
    add("|---|---|---|---|---|---|")
    for col, (lk, sp, lk_enc, sp_enc) in sizes["columns"].items():
        ratio = f"{lk / sp:.2f}" if sp else "-"
        add(f"| {col} | {lk / 2**20:,.2f} | {sp / 2**20:,.2f} | {ratio} | {', '.join(lk_enc)} | {', '.join(sp_enc)} |")
    add("")
    add(f"One median lakesink file ({sizes['sample_rows']:,} rows, {sizes['sample_bytes']:,} bytes) re-encoded with pyarrow:")
    add("")
    add("| encoding | bytes | vs as written |")
    add("|---|---|---|")
    base = next(iter(sizes["variants"].values()))
    for label, size in sizes["variants"].items():
        add(f"| {label} | {size:,} | {size / base:.3f} |")
    add("")
    low = list(sizes["variants"].values())[1]
    if low < 0.95 * base:
        add(
            f"Dropping dictionaries for the high-cardinality columns shrinks this file by {1 - low / base:.0%}. pyarrow "
            "dictionary-encodes every column by default and only falls back to plain encoding once a column chunk's "
            "dictionary passes 1 MiB; parquet-mr (Spark) gives the dictionary up as soon as it does not pay off. In small "
            "files the dictionary of a high-cardinality column never reaches the limit, so the column is stored as "
            "dictionary + indices, which zstd compresses worse than plain values."
        )
    else:
        add("The dictionary choice makes no material difference for this file size.")
    add("")

    d = direct
    add("## 5. `write_task` outside Spark (one task's rows, no JVM)")
    add("")
    add(f"{d['rows']:,} rows in {d['batches']} Arrow batches of 10,000 rows, fed from memory: **{d['plain_s']:.2f} s** (median of 3) "
        f"({d['rows'] / d['plain_s']:,.0f} rows/s on one core; partition_s {d['partition_s']:.2f}, write_s {d['write_s']:.2f}); "
        f"under cProfile {d['profiled_s']:.2f} s. Compare with the task wall inside Spark above: the difference is the "
        "cost of getting the rows to the worker.")
    add("")
    m = d["memory"]
    add(f"Memory of that one task (first run in this process; input {d['input_arrow_bytes'] / 2**20:,.0f} MiB of Arrow batches, "
        "held by the benchmark, not counted):")
    add("")
    add("| what | MiB |")
    add("|---|---|")
    add(f"| buffered bytes as the writer accounts them (`peak_buffered_bytes`; its 256 MiB buffer limit applies to this) | "
        f"{m['accounted_peak_buffered_bytes'] / 2**20:,.1f} |")
    add(f"| peak Arrow memory allocated during the write (`pyarrow.total_allocated_bytes()`, sampled every 20 ms) | "
        f"{m['arrow_allocated_peak_bytes'] / 2**20:,.1f} |")
    add(f"| peak RSS growth of the process during the write (VmHWM after reset) | {m['rss_growth_bytes'] / 2**20:,.1f} |")
    add("")
    ds = d["stats"]
    add("| step | cumulative s |")
    add("|---|---|")
    for label, suffix, func in KEY_FUNCTIONS:
        value = _cumulative(ds, suffix, func)
        if value is not None:
            add(f"| {_indent(label)} | {value:.2f} |")
    add("")
    add(f"Top {top} by own time:")
    add("")
    add("```")
    add(_short_paths(_top(ds, "tottime", top)).rstrip())
    add("```")
    add("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
