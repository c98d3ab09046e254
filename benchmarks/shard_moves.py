"""Do key shards stay on their executor? `python -m benchmarks shard-moves --runs 10`.

Issue 53 saw a shard move in steady state in 1 of 2 runs: 4 key shards on two one-core
workers with `spark.locality.wait.process=100ms`. Each run here starts a standalone cluster
of two one-core workers (each its own HOME, so its own key index), builds a table of
ROWS keys by plain appends, and runs two routed upsert streams into two tables, one after
the other, each a warm-up micro-batch and BATCHES steady ones of BATCH_ROWS (half updates,
half new keys):

- `shards=4`: more shards than the 2 task slots (what the default was: the shuffle
  partitions, 4 here);
- the default: `cluster_by_key` with no `shards`, now one per task slot (2).

Which worker held each shard in every batch comes from the hosts each batch's snapshot
lists (benchmarks/scale_out.annotate). Writes SHARD-MOVES.md and shard_moves.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, host_probe, log, tests_module
from benchmarks.scale_out import LOCALITY_WAIT, SCHEMA, Source, annotate, moves

Cluster = tests_module("standalone_cluster").Cluster  # the cluster the tests start

ROWS = 400_000
BATCH_ROWS = 50_000
BATCHES = 6
SHUFFLE_PARTITIONS = 4
SETUPS = {"shards=4": 4, "default": None}


def _session(cluster: Any) -> Any:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(cluster.master)
        .appName("shard-moves")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "1g")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.locality.wait.process", LOCALITY_WAIT)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _wait_for_executors(spark: Any, count: int) -> None:
    deadline = time.monotonic() + 180
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < count + 1:  # + the driver
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} executor(s) never registered")
        time.sleep(0.2)


def _stream(spark: Any, source: Source, checkpoint: Path, warehouse: Path, ident: str, shards: int | None) -> list[dict[str, Any]]:
    from lakesink_datasource import cluster_by_key

    options = {"table": ident, "warehouse": str(warehouse), "progress": "false", "operation": "upsert"}
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(source.folder))
    routed = cluster_by_key(df, "id", shards=shards, **options)
    query = (routed.writeStream.format("lakesink").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return [{"batch": int(p["batchId"]), "seconds": p["durationMs"]["triggerExecution"] / 1000, "query": p["id"]}
            for p in query.recentProgress if p["numInputRows"] > 0]


def _one_run(root: Path, run: int) -> dict[str, Any]:
    cluster = Cluster(root)
    cluster.start_master()
    for _ in range(2):
        cluster.start_worker(memory="2g", cores=1)
    spark = _session(cluster)
    out: dict[str, Any] = {"run": run}
    try:
        _wait_for_executors(spark, 2)
        warehouse = root / "warehouse"
        for name, shards in SETUPS.items():
            ident = "bench.s4" if shards else "bench.sdefault"
            base = spark.range(ROWS, numPartitions=2).selectExpr(
                "id", "concat('base-', cast(id as string)) as v", "cast(id % 1000 as int) as cat", "cast(0 as long) as batch")
            base.write.format("lakesink").options(table=ident, warehouse=str(warehouse), progress="false").mode("append").save()
            source = Source(root / f"source-{ident}", ROWS, BATCH_ROWS)
            source.folder.mkdir()
            source.add(spark, BATCHES + 1)
            batches = _stream(spark, source, root / f"checkpoint-{ident}", warehouse, ident, shards)
            count = shards or 2
            annotate(warehouse, batches, cluster.homes, shards=count, ident=ident)
            steady = moves(batches)[1:]  # from the first timed batch on (the warm-up places every shard)
            out[name] = {"shards": count, "moves": steady, "placement": [b["placement"] for b in batches],
                         "seconds": [round(b["seconds"], 2) for b in batches]}
            log(f"  run {run} {name}: {count} shards, moves per steady batch {steady}, placements {[b['placement'] for b in batches]}")
    finally:
        spark.stop()
        cluster.stop()
    return out


def run(runs: int, workdir: Path, out_dir: Path) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.perf_counter()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "rows": ROWS, "batch_rows": BATCH_ROWS, "batches": BATCHES,
                               "locality_wait": LOCALITY_WAIT, "host_probe_start": host_probe(), "runs": []}
    for r in range(runs):
        root = workdir / f"run-{r}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        results["runs"].append(_one_run(root, r))
        shutil.rmtree(root, ignore_errors=True)
    results["host_probe_end"] = host_probe()
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "shard_moves.json").write_text(json.dumps(results, indent=2))
    (out_dir / "SHARD-MOVES.md").write_text(render(results))
    log(f"wrote {out_dir / 'SHARD-MOVES.md'}")
    return results


def render(results: dict[str, Any]) -> str:
    runs = results["runs"]
    lines = [
        "# Do key shards stay on their executor? (standalone cluster, two one-core workers)",
        "",
        f"`python -m benchmarks shard-moves --runs {len(runs)}`, {results['date']}: per run a new standalone cluster of two "
        f"one-core workers (2 task slots, `spark.locality.wait.process={results['locality_wait']}`, "
        f"{SHUFFLE_PARTITIONS} shuffle partitions), a table of {results['rows']:,} keys, a routed upsert stream of a warm-up and "
        f"{results['batches']} steady micro-batches of {results['batch_rows']:,} rows, with 4 shards (more than the slots; the "
        "old default here) and with cluster_by_key's default (one shard per slot). A move: a shard on another worker than in "
        f"the batch before. Host probe {results['host_probe_start']} -> {results['host_probe_end']}; "
        f"{results['total_seconds'] / 60:.1f} min in all.",
        "",
        "| set-up | shards | runs with a move in steady state | moves in all | batches |",
        "|---|---|---|---|---|",
    ]
    for name in SETUPS:
        per_run = [sum(r[name]["moves"]) for r in runs]
        lines.append(f"| {name} | {runs[0][name]['shards']} | {sum(1 for m in per_run if m)} of {len(runs)} | {sum(per_run)} | "
                     f"{sum(len(r[name]['moves']) for r in runs)} |")
    lines += ["", "Per run, moves per steady batch:", ""]
    for r in runs:
        lines.append(f"- run {r['run']}: " + "; ".join(f"{name} {r[name]['moves']}" for name in SETUPS))
    return "\n".join(lines) + "\n"


def main_args(runs: int, workdir: str | None, out: str | None) -> int:
    run(runs, Path(workdir or "/tmp/lakesink-shard-moves"), Path(out).resolve() if out else OUT_DIR)
    return 0
