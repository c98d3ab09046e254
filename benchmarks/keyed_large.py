"""Scenario 4 at a large table: `python -m benchmarks keyed-large [--rows 100000000]`.

The same 100K-row upserts (half updates of random existing keys, half new keys) into a
1M-row table and into a `--rows` table, lakesink through Spark next to delta-rs's merge, in
one run. The large base is built in chunks (lakesink: one keyed write per chunk, the index
built as it goes; delta-rs: appends). Reported besides batch times: build time, the key
index's size on disk per key, and the first batch after the index directory is deleted
(which rebuilds the index from the table). `--no-delta` runs lakesink alone: delta-rs's
copy-on-write merges write ~1.5 GB per batch at 100M rows, which competes with the key
index for the page cache on a small machine. pyiceberg is left out: its upsert already takes
~9 s at 1M rows. Writes KEYED-LARGE.md and keyed_large.json.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import BenchConfig, log, start_spark, worker_environment
from benchmarks.keyed_scenarios import IDENT, UPSERT_BATCH_FULL, arrow_rows, upsert_batch

TARGET_LARGE_OVER_SMALL = 1.6


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _lakesink(spark: Any, root: Path) -> dict[str, Any]:
    options = {"table": IDENT, "warehouse": str(root / "warehouse"), "operation": "upsert", "primary_key": "id",
               "index_dir": str(root / "index")}

    def prepare(batch: Any) -> Any:
        df = spark.createDataFrame(batch).repartition(2).cache()
        df.count()
        return df

    def write(df: Any) -> None:
        writer = df.write.format("lakesink")
        for k, v in options.items():
            writer = writer.option(k, v)
        writer.mode("append").save()
        df.unpersist()

    return {"prepare": prepare, "write": write, "index": root / "index", "data": root / "warehouse"}


def _delta(root: Path) -> dict[str, Any] | None:
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError:
        return None
    path = str(root / "delta")

    def append(batch: Any) -> None:
        write_deltalake(path, batch, mode="append")

    def merge(batch: Any) -> None:
        (
            DeltaTable(path).merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all().when_not_matched_insert_all().execute()
        )

    return {"append": append, "merge": merge, "data": root / "delta"}


def _one_size(spark: Any, workdir: Path, size: int, chunk: int, reps: int, with_delta: bool) -> dict[str, Any]:
    root = workdir / f"size-{size}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    lakesink, delta = _lakesink(spark, root), _delta(root) if with_delta else None
    result: dict[str, Any] = {"rows": size}
    started = time.perf_counter()
    for start in range(0, size, chunk):
        lakesink["write"](lakesink["prepare"](arrow_rows(np.arange(start, min(size, start + chunk)), 0)))
        log(f"  {size:,}: lakesink base {min(size, start + chunk):,} rows, {time.perf_counter() - started:.0f} s")
    result["lakesink_build_s"] = round(time.perf_counter() - started, 1)
    index_bytes = _dir_bytes(lakesink["index"])
    result["index_bytes"] = index_bytes
    result["index_bytes_per_key"] = round(index_bytes / size, 1)
    result["lakesink_data_bytes"] = _dir_bytes(lakesink["data"])
    if delta:
        started = time.perf_counter()
        for start in range(0, size, chunk):
            delta["append"](arrow_rows(np.arange(start, min(size, start + chunk)), 0))
        result["delta_build_s"] = round(time.perf_counter() - started, 1)
    rng = np.random.default_rng(size)
    existing = size
    times: dict[str, list[float]] = {"lakesink": [], "delta-rs": []}
    for rep in range(1 + reps):
        batch, existing = upsert_batch(rng, existing, UPSERT_BATCH_FULL, rep + 1)
        sides = [("lakesink", lakesink), ("delta-rs", delta)] if rep % 2 == 0 else [("delta-rs", delta), ("lakesink", lakesink)]
        for name, engine in sides:
            if engine is None:
                continue
            if name == "lakesink":
                df = engine["prepare"](batch)
                began = time.perf_counter()
                engine["write"](df)
            else:
                began = time.perf_counter()
                engine["merge"](batch)
            seconds = time.perf_counter() - began
            log(f"  {size:,}: {name:<9} {'warm-up' if rep == 0 else 'rep'} {rep}: {seconds:.2f} s")
            if rep:
                times[name].append(round(seconds, 3))
    # The index is a cache: deleted, the next batch rebuilds it from the table first.
    shutil.rmtree(lakesink["index"])
    batch, existing = upsert_batch(rng, existing, UPSERT_BATCH_FULL, 99)
    df = lakesink["prepare"](batch)
    began = time.perf_counter()
    lakesink["write"](df)
    result["lakesink_batch_with_rebuild_s"] = round(time.perf_counter() - began, 2)
    log(f"  {size:,}: lakesink batch after deleting the index (rebuild): {result['lakesink_batch_with_rebuild_s']} s")
    result["times"] = times
    result["medians"] = {k: statistics.median(v) for k, v in times.items() if v}
    shutil.rmtree(root, ignore_errors=True)
    return result


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _markdown(result: dict[str, Any]) -> str:
    small, large = result["sizes"]
    beside = "next to delta-rs's merge" if small["times"].get("delta-rs") else "alone (--no-delta)"
    lines = [
        "# Keyed upserts into a large table (issue 12)",
        "",
        f"`python -m benchmarks keyed-large --rows {large['rows']}` on {result['date']}: batches of "
        f"{UPSERT_BATCH_FULL:,} rows (half updates of random keys, half new) into {small['rows']:,} and "
        f"{large['rows']:,} rows, lakesink through Spark (local[2]) {beside}, "
        f"{result['reps']} timed repetitions after a warm-up, sides alternating; medians.",
        "",
        "| table rows | lakesink batch | delta-rs merge | lakesink build | delta-rs build | index on disk | per key | "
        "lakesink batch that rebuilds the index |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in (small, large):
        lines.append(
            f"| {s['rows']:,} | {s['medians']['lakesink']:.2f} s | {_seconds(s['medians'].get('delta-rs'))} | "
            f"{s['lakesink_build_s']} s | {_seconds(s.get('delta_build_s'))} | {s['index_bytes'] / 2**20:,.0f} MiB | "
            f"{s['index_bytes_per_key']} B | {s['lakesink_batch_with_rebuild_s']} s |"
        )
    ratio = result["lakesink_large_over_small"]
    lines += [
        "",
        f"lakesink batch time at {large['rows']:,} / at {small['rows']:,} rows: **{ratio}** "
        f"(target <= {TARGET_LARGE_OVER_SMALL}: {'met' if ratio <= TARGET_LARGE_OVER_SMALL else 'missed'}).",
        "",
        "Every repetition: " + "; ".join(f"{s['rows']:,} {k} {v}" for s in (small, large) for k, v in s["times"].items() if v),
        "",
    ]
    return "\n".join(lines)


def run(rows: int, chunk: int, reps: int, workdir: Path, out: Path, with_delta: bool = True) -> dict[str, Any]:
    config = BenchConfig(workdir=workdir, out_dir=out)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    worker_environment(workdir / "phases.log")
    spark = start_spark(config)
    try:
        sizes = [_one_size(spark, workdir, size, chunk, reps, with_delta) for size in (1_000_000, rows)]
    finally:
        spark.stop()
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "reps": reps, "sizes": sizes,
        "lakesink_large_over_small": round(sizes[1]["medians"]["lakesink"] / sizes[0]["medians"]["lakesink"], 3),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "keyed_large.json").write_text(json.dumps(result, indent=1))
    (out / "KEYED-LARGE.md").write_text(_markdown(result))
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"wrote {out / 'KEYED-LARGE.md'}")
    return result
