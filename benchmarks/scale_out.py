"""Keyed writes on one host and on two: `python -m benchmarks scale-out [--sizes 1000000,10000000]`.

A real standalone cluster (benchmarks/standalone.py: a master and one-core workers, each
with a HOME of its own, so its own key index) takes the same 100K-row upserts (half updates
of existing keys, half new keys, `repartition(workers, "id")` as docs/usage.md asks) into a
table of each size, in one run:

1. one host: one two-core worker (two tasks share its index, as `local[2]` does), a first
   batch builds its index (untimed), then `--reps` timed batches;
2. two hosts: two fresh one-core workers (two tasks, one per index), the same;
3. a fresh worker joining: one of the two is killed and a new worker (empty HOME) starts;
   the next batch is timed (its index starts from a published copy and catches up), then
   the same again after deleting the published copies (its index is rebuilt from the table).

Reported per size: the batch's wall time and its `lakesink.index-seconds` (summed over the
batch's tasks) as medians, their two-host/one-host ratios, the fresh worker's first batch
against a steady one, and the key index's bytes on each host. Targets (issue 27): index
seconds on two hosts at most 1.3x one host and not growing from 1M to 10M rows; a fresh
worker's first batch at 10M rows at most 3x a steady batch. Writes SCALE-OUT.md and
scale_out.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, host_probe, log
from benchmarks.standalone import Cluster

IDENT = "bench.keyed"
TARGET_TWO_OVER_ONE = 1.3
TARGET_FRESH_OVER_STEADY = 3.0


TASKS = 2  # task slots in both set-ups: the comparison is one index against two


def _session(cluster: Cluster, workers: int) -> Any:
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource

    spark = (
        SparkSession.builder.master(cluster.master)
        .appName(f"scale-out-{workers}")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", str(TASKS // workers))
        .config("spark.executor.memory", "2g")
        .config("spark.cores.max", str(TASKS))
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(TASKS))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LakeSinkDataSource)
    return spark


def _wait_for_executors(spark: Any, count: int) -> None:
    deadline = time.monotonic() + 180
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < count + 1:  # + the driver
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} executor(s) never registered")
        time.sleep(0.2)


def _options(warehouse: Path) -> dict[str, str]:
    return {"table": IDENT, "warehouse": str(warehouse), "progress": "false"}


def _build_base(spark: Any, warehouse: Path, rows: int) -> float:
    """The base table by plain appends (the keys are unique by construction): no index yet."""
    started = time.perf_counter()
    chunk = 5_000_000
    for start in range(0, rows, chunk):
        df = spark.range(start, min(rows, start + chunk), numPartitions=4).selectExpr(
            "id", "concat('base-', cast(id as string)) as v", "cast(id % 1000 as int) as cat", "cast(0 as long) as batch")
        df.write.format("lakesink").options(**_options(warehouse), maintenance="off").mode("append").save()
    return time.perf_counter() - started


def _batch(spark: Any, rows: int, batch: int, workers: int, batch_rows: int) -> Any:
    """`batch_rows` upserts: half of existing keys (spread over the table), half new ones."""
    half = batch_rows // 2
    existing = spark.range(half).selectExpr(f"pmod(id * 7919 + {batch * 104_729}, {rows}) as id")
    new = spark.range(rows + batch * half, rows + (batch + 1) * half)
    df = existing.union(new).selectExpr(
        "id", f"concat('b{batch}-', cast(id as string)) as v", "cast(id % 1000 as int) as cat", f"cast({batch} as long) as batch")
    df = df.repartition(TASKS, "id").cache()
    df.count()
    return df


def _upsert(spark: Any, warehouse: Path, rows: int, batch: int, workers: int, batch_rows: int) -> dict[str, Any]:
    df = _batch(spark, rows, batch, workers, batch_rows)
    started = time.perf_counter()
    df.write.format("lakesink").options(**_options(warehouse), operation="upsert", primary_key="id").mode("append").save()
    seconds = time.perf_counter() - started
    df.unpersist()
    summary = _summary(warehouse)
    return {
        "batch": batch,
        "seconds": round(seconds, 3),
        "index_seconds": float(summary.get("lakesink.index-seconds", 0)),
        "write_seconds": float(summary.get("lakesink.write-seconds", 0)),
        "hosts": len([h for h in summary.get("lakesink.hosts", "").split(",") if h]),
        "index_starts": summary.get("lakesink.index-starts"),
    }


def _summary(warehouse: Path) -> dict[str, str]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    metadata = catalog.load_table(IDENT).metadata
    # The batch's own snapshot: maintenance may have committed a compaction after it.
    for snapshot in sorted(metadata.snapshots, key=lambda s: -(s.sequence_number or 0)):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get("lakesink.compaction") != "true":
            return dict(props)
    raise AssertionError("no batch snapshot")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _index_bytes(home: Path) -> int:
    return _dir_bytes(home / ".cache" / "lakesink" / "index")


def _median(records: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in records), 3)


def _phase(cluster_root: Path, warehouse: Path, rows: int, workers: int, reps: int, batch_rows: int, first_batch: int,
           fresh: bool) -> dict[str, Any]:
    """`workers` fresh workers: a warm-up batch (their indexes start), `reps` timed ones, and
    with `fresh` a worker replaced by a new one twice (with and without published copies)."""
    cluster = Cluster(cluster_root)
    cluster.start_master()
    for _ in range(workers):
        cluster.start_worker(memory="3g", cores=TASKS // workers)
    spark = _session(cluster, workers)
    out: dict[str, Any] = {"workers": workers}
    try:
        _wait_for_executors(spark, workers)
        batch = first_batch
        warm = _upsert(spark, warehouse, rows, batch, workers, batch_rows)
        log(f"    warm-up batch {batch}: {warm['seconds']:.2f} s (index {warm['index_seconds']:.2f} s; {warm['index_starts']})")
        out["warmup"] = warm
        steady = []
        for _ in range(reps):
            batch += 1
            steady.append(_upsert(spark, warehouse, rows, batch, workers, batch_rows))
            log(f"    batch {batch}: {steady[-1]['seconds']:.2f} s, index {steady[-1]['index_seconds']:.2f} s, {steady[-1]['hosts']} host(s)")
        out["steady"] = steady
        out["index_bytes_per_host"] = [_index_bytes(h) for h in cluster.homes]
        if fresh:
            # The floor of any fresh worker's first batch: a plain append (no key index) on a
            # new worker, then on the same worker warm.
            plain = {**_options(warehouse), "table": "bench.plain"}
            spark.range(1).selectExpr("id", "'x' as v", "0 as cat", "cast(0 as long) as batch").write.format("lakesink") \
                .options(**plain).mode("append").save()  # the table exists before the timed writes
            for label in ("fresh_append", "warm_append"):
                if label == "fresh_append":
                    cluster.kill_worker(len(cluster.homes) - 1)
                    cluster.start_worker(memory="3g", cores=TASKS // workers)
                    _wait_for_executors(spark, workers)
                df = _batch(spark, rows, 0, workers, batch_rows)
                t0 = time.perf_counter()
                df.write.format("lakesink").options(**plain).mode("append").save()
                out[label] = round(time.perf_counter() - t0, 3)
                df.unpersist()
            log(f"    plain append on a fresh worker {out['fresh_append']:.2f} s, warm {out['warm_append']:.2f} s")
            for copies in (True, False):
                if not copies:
                    shutil.rmtree(warehouse / "bench" / "keyed" / "_lakesink_index", ignore_errors=True)
                cluster.kill_worker(len(cluster.homes) - 1)
                cluster.start_worker(memory="3g", cores=TASKS // workers)
                _wait_for_executors(spark, workers)
                batch += 1
                joined = _upsert(spark, warehouse, rows, batch, workers, batch_rows)
                log(f"    fresh worker ({'published copy' if copies else 'no copy'}) batch {batch}: {joined['seconds']:.2f} s, "
                    f"index {joined['index_seconds']:.2f} s; {joined['index_starts']}")
                out["fresh_with_copy" if copies else "fresh_without_copy"] = joined
                batch += 1
                after = _upsert(spark, warehouse, rows, batch, workers, batch_rows)
                out.setdefault("after_fresh", []).append(after)
        out["last_batch"] = batch
    finally:
        spark.stop()
        cluster.stop()
    return out


def run(sizes: list[int], reps: int, batch_rows: int, workdir: Path, out_dir: Path) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.perf_counter()
    results: dict[str, Any] = {"batch_rows": batch_rows, "reps": reps, "host_probe_start": host_probe(), "sizes": []}
    for rows in sizes:
        root = workdir / f"rows-{rows}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        warehouse = root / "warehouse"
        log(f"{rows:,} rows: building the base table")
        cluster = Cluster(root / "build")
        cluster.start_master()
        cluster.start_worker(memory="2g")
        cluster.start_worker(memory="2g")
        spark = _session(cluster, 2)
        try:
            _wait_for_executors(spark, 2)
            build = _build_base(spark, warehouse, rows)
        finally:
            spark.stop()
            cluster.stop()
        log(f"  base built in {build:.1f} s")
        entry: dict[str, Any] = {"rows": rows, "build_seconds": round(build, 1)}
        log("  one worker")
        one = _phase(root / "one", warehouse, rows, 1, reps, batch_rows, 1, fresh=False)
        log("  two workers")
        two = _phase(root / "two", warehouse, rows, 2, reps, batch_rows, one["last_batch"] + 1, fresh=True)
        entry.update(one=one, two=two)
        entry["summary"] = {
            "one_batch_s": _median(one["steady"], "seconds"),
            "one_index_s": _median(one["steady"], "index_seconds"),
            "two_batch_s": _median(two["steady"], "seconds"),
            "two_index_s": _median(two["steady"], "index_seconds"),
            "fresh_with_copy_s": two["fresh_with_copy"]["seconds"],
            "fresh_without_copy_s": two["fresh_without_copy"]["seconds"],
            "fresh_append_s": two["fresh_append"],
            "warm_append_s": two["warm_append"],
            "index_bytes_one_host": one["index_bytes_per_host"],
            "index_bytes_two_hosts": two["index_bytes_per_host"],
        }
        summary = entry["summary"]
        summary["two_over_one_index"] = round(summary["two_index_s"] / max(summary["one_index_s"], 1e-9), 2)
        summary["two_over_one_batch"] = round(summary["two_batch_s"] / max(summary["one_batch_s"], 1e-9), 2)
        summary["fresh_over_steady"] = round(summary["fresh_with_copy_s"] / max(summary["two_batch_s"], 1e-9), 2)
        results["sizes"].append(entry)
        shutil.rmtree(root, ignore_errors=True)
    results["host_probe_end"] = host_probe()
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scale_out.json").write_text(json.dumps(results, indent=2))
    (out_dir / "SCALE-OUT.md").write_text(render(results))
    log(f"wrote {out_dir / 'SCALE-OUT.md'}")
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Keyed writes on one host and on two (standalone cluster)",
        "",
        f"`python -m benchmarks scale-out`: {results['batch_rows']:,}-row upserts (half existing keys), "
        f"{results['reps']} timed batches per side after a warm-up batch; one-core workers, each with its own HOME "
        f"(key index); medians. Host probe {results['host_probe_start']} -> {results['host_probe_end']}; "
        f"{results['total_seconds'] / 60:.1f} min in all.",
        "",
        "| rows | 1 host: batch / index s | 2 hosts: batch / index s | index 2/1 (<= 1.3) | batch 2/1 | fresh worker, copy: s (x steady, <= 3 at 10M) | fresh worker, rebuild: s | plain append, fresh / warm worker: s | index MB per host (1 / 2 hosts) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in results["sizes"]:
        s = entry["summary"]
        one_mb = ", ".join(f"{b / 1e6:.0f}" for b in s["index_bytes_one_host"])
        two_mb = ", ".join(f"{b / 1e6:.0f}" for b in s["index_bytes_two_hosts"])
        lines.append(
            f"| {entry['rows']:,} | {s['one_batch_s']:.2f} / {s['one_index_s']:.2f} | {s['two_batch_s']:.2f} / {s['two_index_s']:.2f} | "
            f"{s['two_over_one_index']:.2f} | {s['two_over_one_batch']:.2f} | {s['fresh_with_copy_s']:.2f} ({s['fresh_over_steady']:.2f}x) | "
            f"{s['fresh_without_copy_s']:.2f} | {s['fresh_append_s']:.2f} / {s['warm_append_s']:.2f} | {one_mb} / {two_mb} |"
        )
    lines += ["", "Per batch (seconds, index seconds summed over tasks, what the hosts' indexes did):", ""]
    for entry in results["sizes"]:
        for side in ("one", "two"):
            phase = entry[side]
            rows = [phase["warmup"], *phase["steady"], *[phase[k] for k in ("fresh_with_copy", "fresh_without_copy") if k in phase]]
            lines.append(f"- {entry['rows']:,} rows, {phase['workers']} worker(s): " + "; ".join(
                f"b{r['batch']} {r['seconds']:.2f}/{r['index_seconds']:.2f}" + (f" [{r['index_starts']}]" if r["index_starts"] else "") for r in rows))
    return "\n".join(lines) + "\n"


def main_args(sizes: str, reps: int, batch_rows: int, workdir: str | None, out: str | None) -> int:
    run([int(s) for s in sizes.split(",")], reps, batch_rows, Path(workdir or "/tmp/lakesink-scale-out"),
        Path(out).resolve() if out else OUT_DIR)
    return 0
