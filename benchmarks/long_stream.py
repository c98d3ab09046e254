"""Benchmark "long stream": thousands of small upsert micro-batches, maintenance on vs off.

    .venv/bin/python -m benchmarks long-stream                 # 2,000 batches per side (~30 min on 2 cores)
    .venv/bin/python -m benchmarks long-stream --batches 300   # a quick look

Spark's `rate-micro-batch` source gives every micro-batch exactly `--rows-per-batch` rows
(2 partitions), so both sides see the same input whatever their speed; the key is the
source's value modulo 50,000, so keys are updated again and again and deletion vectors pile
up. The sink upserts (`primary_key=id`, `partition_by=bucket(4, id)`), once with default
settings (maintenance=auto) and once with `maintenance=off`, one after the other in one
Spark session, with snapshot retention shortened to 1 minute on both sides.

Per side: the `addBatch` time of every micro-batch (Spark's own progress report), the median
of the first and last 10% of batches, and at the end metadata.json size, files in
`metadata/`, live data files and DVs, and DuckDB's scan time of the table against a fully
compacted copy holding the same rows. Writes LONG-STREAM.md, long_stream.json and
long_stream.png (per-batch latency over time) to `--out` (default benchmarks/).
"""

from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, BenchConfig, log, log_events, start_spark, worker_environment

IDENT = "bench.stream"
KEYS = 50_000
RETENTION_MS = 60 * 1000
TARGET_LATENCY_RATIO = 1.2
TARGET_METADATA_JSON_BYTES = 256 * 1024
TARGET_SCAN_RATIO = 1.2


class _Progress:
    """Every micro-batch's durations, pushed by Spark's StreamingQueryListener (no polling of
    `recentProgress`, which would cost the driver more with every batch)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._by_query: dict[str, dict[int, dict[str, Any]]] = {}

    def record(self, query_id: str, batch_id: int, rows: int, durations: dict[str, int]) -> None:
        if not rows:
            return
        with self._lock:
            self._by_query.setdefault(query_id, {})[batch_id] = {
                "batch": batch_id, "add_batch_ms": durations.get("addBatch", 0), "trigger_ms": durations.get("triggerExecution", 0),
                # Spark's other phases of the trigger (planning, offsets, WAL), to tell them from the sink's.
                "spark_other_ms": sum(v for k, v in durations.items() if k not in ("addBatch", "triggerExecution")),
            }
            self._lock.notify_all()

    def reached(self, query_id: Any, count: int) -> bool:
        with self._lock:
            done = len(self._by_query.get(str(query_id), {}))
        if done and done % 250 == 0:
            log(f"  {done} batches")
        return done >= count

    def wait(self, seconds: float) -> None:
        with self._lock:
            self._lock.wait(seconds)

    def batches(self, query_id: Any) -> list[dict[str, Any]]:
        with self._lock:
            seen = self._by_query.get(str(query_id), {})
            return [seen[b] for b in sorted(seen)]


def _listen(spark: Any) -> _Progress:
    from pyspark.sql.streaming import StreamingQueryListener

    progress = _Progress()

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            progress.record(str(p.id), p.batchId, p.numInputRows, dict(p.durationMs or {}))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Listener())
    return progress


def _phases(log_path: Path) -> dict[int, dict[str, float]]:
    """Per batch, from the sink's own log events (benchmarks/_worker_hooks): the driver's commit
    seconds, the after-commit compaction seconds, and the tasks' seconds (summed over tasks)."""
    out: dict[int, dict[str, float]] = {}
    if not log_path.exists():
        return out
    for event in log_events(log_path.read_text()):
        if event.get("batch") is None:
            continue
        batch = int(event["batch"])
        if event.get("event") == "commit":
            out.setdefault(batch, {}).update(
                tasks_s=event["partition_s"] + event["index_s"] + event["write_s"], index_s=event["index_s"],
                commit_s=event["commit_s"],
            )
        elif event.get("event") == "compaction":
            out.setdefault(batch, {})["compaction_s"] = event["seconds"]
    return out


def _run_side(
    spark: Any, progress: _Progress, root: Path, batches: int, rows_per_batch: int, maintenance: str, phase_log: Path
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    shutil.rmtree(root, ignore_errors=True)
    phase_log.unlink(missing_ok=True)  # this side's lines only
    source = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows_per_batch)
        .option("numPartitions", 2)
        .load()
        .select(
            (F.col("value") % KEYS).alias("id"),
            F.col("value").alias("version"),
            F.col("timestamp").alias("ts"),
            F.concat(F.lit("payload-"), F.col("value").cast("string")).alias("payload"),
        )
    )
    query = (
        source.writeStream.format("lakesink")
        .option("table", IDENT)
        .option("warehouse", str(root / "warehouse"))
        .option("index_dir", str(root / "index"))
        .option("checkpointLocation", str(root / "checkpoint"))
        .option("operation", "upsert")
        .option("primary_key", "id")
        .option("partition_by", "bucket(4, id)")
        .option("maintenance", maintenance)
        .option("property.history.expire.max-snapshot-age-ms", str(RETENTION_MS))
        .trigger(processingTime="0 seconds")
        .start()
    )
    started = time.monotonic()
    try:
        while not progress.reached(query.id, batches):
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            progress.wait(5.0)
    finally:
        query.stop()
    elapsed = time.monotonic() - started
    per_batch = progress.batches(query.id)[:batches]
    phases = _phases(phase_log)
    for b in per_batch:
        b.update(phases.get(b["batch"], {}))
    return {"maintenance": maintenance, "batches": per_batch, "seconds": round(elapsed, 1), **_inspect(root)}


def _inspect(root: Path) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{root}/warehouse/catalog.db", warehouse=f"file://{root}/warehouse")
    table = catalog.load_table(IDENT)
    snapshot = table.metadata.current_snapshot()
    metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
    files = [p for p in metadata_dir.iterdir() if p.is_file()]
    live = live_data_files(table.io, snapshot)
    return {
        "metadata_location": table.metadata_location,
        "metadata_json_bytes": Path(table.metadata_location.removeprefix("file://")).stat().st_size,
        "metadata_dir_files": len(files),
        "metadata_dir_bytes": sum(p.stat().st_size for p in files),
        "snapshots": len(table.metadata.snapshots),
        "live_data_files": len(live),
        "live_data_bytes": sum(e.data_file.file_size_in_bytes for e in live),
        "live_dvs": len(live_position_deletes(table.io, snapshot)),
        "rows": int(snapshot.summary.additional_properties.get("total-records", 0)) if snapshot and snapshot.summary else 0,
    }


def _scan_ratio(spark: Any, side: dict[str, Any], root: Path) -> dict[str, Any]:
    """DuckDB scan of the streamed table vs a compacted copy of the same live rows."""
    from benchmarks.read_helpers import duckdb_connection, lakesink_metadata

    con = duckdb_connection()
    streamed = side["metadata_location"]
    rows = con.execute(f"SELECT * FROM iceberg_scan('{streamed}')").to_arrow_table()
    copy = root / "compacted"
    shutil.rmtree(copy, ignore_errors=True)
    spark.createDataFrame(rows).coalesce(1).write.format("lakesink").option("table", "bench.copy") \
        .option("warehouse", str(copy / "warehouse")).option("partition_by", "bucket(4, id)").mode("append").save()
    compacted = lakesink_metadata(copy / "warehouse", "bench.copy")
    query = "SELECT count(*), sum(version), max(payload) FROM iceberg_scan('{}')"
    times: dict[str, list[float]] = {"streamed": [], "compacted": []}
    for rep in range(1 + 9):
        order = (("streamed", streamed), ("compacted", compacted)) if rep % 2 == 0 else (("compacted", compacted), ("streamed", streamed))
        for name, meta in order:
            t0 = time.perf_counter()
            con.execute(query.format(meta)).fetchall()
            if rep:
                times[name].append(time.perf_counter() - t0)
    a, b = statistics.median(times["streamed"]), statistics.median(times["compacted"])
    return {"scan_s_streamed": round(a, 4), "scan_s_compacted": round(b, 4), "scan_ratio": round(a / b, 3), "live_rows": rows.num_rows}


def _latency_summary(side: dict[str, Any]) -> dict[str, Any]:
    batches = side["batches"]
    ms = [b["add_batch_ms"] for b in batches]
    tenth = max(1, len(ms) // 10)
    first, last = statistics.median(ms[:tenth]), statistics.median(ms[-tenth:])
    out = {"first_10pct_ms": first, "last_10pct_ms": last, "latency_ratio": round(last / first, 3) if first else None,
           "median_ms": statistics.median(ms)}
    # Where a batch's time goes, first and last 10%: the driver's commit, the compaction after
    # it, the tasks (summed), and what addBatch holds besides (Spark, planning, task start-up).
    for key in ("commit_s", "compaction_s", "tasks_s"):
        for name, part in (("first", batches[:tenth]), ("last", batches[-tenth:])):
            out[f"{key.removesuffix('_s')}_{name}_ms"] = round(statistics.median(1000 * b.get(key, 0.0) for b in part), 1)
    for name, part in (("first", batches[:tenth]), ("last", batches[-tenth:])):
        rest = [b["add_batch_ms"] - 1000 * (b.get("commit_s", 0.0) + b.get("compaction_s", 0.0)) for b in part]
        out[f"rest_{name}_ms"] = round(statistics.median(rest), 1)
    return out


def _plot(sides: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for side in sides:
        ms = [b["add_batch_ms"] for b in side["batches"]]
        window = 25
        rolling = [statistics.median(ms[max(0, i - window + 1): i + 1]) for i in range(len(ms))]
        ax.plot(range(len(ms)), ms, alpha=0.15, linewidth=0.5)
        ax.plot(range(len(ms)), rolling, label=f"maintenance={side['maintenance']} (rolling median of {window})")
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("addBatch ms")
    ax.set_title("Long upsert stream: per-batch latency")
    every = sorted(b["add_batch_ms"] for side in sides for b in side["batches"])
    # The first batch (JVM and worker start-up) would flatten everything else: clip it.
    ax.set_ylim(0, every[int(len(every) * 0.995)] * 1.2 if every else None)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _markdown(result: dict[str, Any]) -> str:
    sides = result["sides"]
    lines = [
        "# Long stream: maintenance on vs off",
        "",
        f"Generated by `python -m benchmarks long-stream --batches {result['batches']}` on {result['date']}. "
        f"{result['batches']:,} micro-batches of {result['rows_per_batch']:,} upserted rows per side "
        f"(keys = rate value mod {KEYS:,}, `partition_by=bucket(4, id)`, snapshot retention {RETENTION_MS // 60000} min), "
        "one side after the other in one Spark session (`local[2]`).",
        "",
        "| | maintenance=auto | maintenance=off | target |",
        "|---|---|---|---|",
    ]
    auto, off = sides.get("auto", {}), sides.get("off", {})
    rows = [
        ("addBatch median, first 10% (ms)", "first_10pct_ms", ""),
        ("addBatch median, last 10% (ms)", "last_10pct_ms", ""),
        ("  driver commit, first / last 10% (ms)", "commit_first_ms/commit_last_ms", ""),
        ("  compaction after it, first / last 10% (ms)", "compaction_first_ms/compaction_last_ms", ""),
        ("  tasks (summed), first / last 10% (ms)", "tasks_first_ms/tasks_last_ms", ""),
        ("  addBatch minus commit and compaction, first / last 10% (ms)", "rest_first_ms/rest_last_ms", ""),
        ("last / first", "latency_ratio", f"<= {TARGET_LATENCY_RATIO} (auto)"),
        ("wall time (s)", "seconds", ""),
        ("metadata.json (bytes)", "metadata_json_bytes", f"< {TARGET_METADATA_JSON_BYTES:,} (auto)"),
        ("files in metadata/", "metadata_dir_files", ""),
        ("bytes in metadata/", "metadata_dir_bytes", ""),
        ("snapshots kept", "snapshots", ""),
        ("live data files", "live_data_files", "a few per partition and size class"),
        ("live DVs", "live_dvs", ""),
        ("live rows (DuckDB count)", "live_rows", "50,000 (every key)"),
        ("records in live data files (incl. rows hidden by DVs)", "rows", ""),
        ("DuckDB scan (s)", "scan_s_streamed", ""),
        ("DuckDB scan of a compacted copy (s)", "scan_s_compacted", ""),
        ("scan / compacted copy", "scan_ratio", f"<= {TARGET_SCAN_RATIO} (auto)"),
    ]
    for label, key, target in rows:
        def value(side: dict[str, Any], key: str = key) -> str:
            return " / ".join(_fmt(side.get(k)) for k in key.split("/"))

        lines.append(f"| {label} | {value(auto)} | {value(off)} | {target} |")
    lines += ["", "![per-batch latency](long_stream.png)", ""]
    lines += [f"- {n}" for n in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def run(batches: int, rows_per_batch: int, workdir: Path, out: Path, which: tuple[str, ...] = ("auto", "off")) -> dict[str, Any]:
    config = BenchConfig(workdir=workdir, out_dir=out)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    worker_environment(workdir / "phases.log")
    spark = start_spark(config)
    progress = _listen(spark)
    sides: dict[str, dict[str, Any]] = {}
    try:
        for maintenance in which:
            log(f"long stream, maintenance={maintenance}: {batches} batches of {rows_per_batch} rows")
            side = _run_side(spark, progress, workdir / maintenance, batches, rows_per_batch, maintenance, workdir / "phases.log")
            side |= _latency_summary(side) | _scan_ratio(spark, side, workdir / maintenance)
            sides[maintenance] = side
            log(f"  done: latency ratio {side['latency_ratio']}, metadata.json {side['metadata_json_bytes']:,} B, "
                f"{side['live_data_files']} live files, scan ratio {side['scan_ratio']}")
    finally:
        spark.stop()
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "batches": batches,
        "rows_per_batch": rows_per_batch,
        "sides": sides,
        "notes": [
            "addBatch is Spark's time for the sink's write and commit of one micro-batch (the driver's commit includes "
            "lakesink's after-commit compaction when maintenance=auto).",
            "The compacted copy is the streamed table's live rows written by one lakesink batch write into one table "
            "(one file per bucket, no DVs).",
        ],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "long_stream.json").write_text(json.dumps(result, indent=1, default=str))
    _plot(list(sides.values()), out / "long_stream.png")
    (out / "LONG-STREAM.md").write_text(_markdown(result))
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def main_args(batches: int, rows_per_batch: int, workdir: str | None, out: str | None, sides: str = "auto,off") -> int:
    chosen = tuple(s.strip() for s in sides.split(",") if s.strip())
    if not chosen or any(s not in ("auto", "off") for s in chosen):
        raise SystemExit(f"--sides takes auto, off or both (auto,off), got {sides!r}")
    run(batches, rows_per_batch, Path(workdir or "/tmp/lakesink-long-stream").resolve(), Path(out).resolve() if out else OUT_DIR, chosen)
    return 0
