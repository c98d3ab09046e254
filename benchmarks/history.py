"""History tables: `python -m benchmarks history` -> HISTORY.md, history.json.

A table of 1M keys, then micro-batches of 100K upserts (half of them updates of existing
keys, half new keys), written through Spark (`local[2]`, batch writes of cached DataFrames
in one session per side) with `history=true` and without, sides interleaved over `--reps`
runs, each in a fresh process. Per side: the mean time of the upsert batches, and the bytes
each batch writes (data files, deletion vectors, from the snapshot summaries). Issue 55's
target: history at most 2x the time of the same upserts without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, PROJECT_ROOT, host_probe, log, register_lakesink

WORKDIR = Path("/tmp/lakesink-history")
KEYS = 1_000_000
BATCH = 100_000
BATCHES = 4


def run_side(side: str, work: Path) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F


    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_lakesink(spark)
    options = {
        "warehouse": str(work / "warehouse"), "index_dir": str(work / "index"), "progress": "false", "maintenance": "off",
        "operation": "upsert", "primary_key": "id", "sequence_column": "seq", **({"history": "true"} if side == "history" else {}),
    }

    def rows(ids: Any, seq: int) -> Any:
        return ids.select(F.col("id"), F.concat(F.lit("name "), F.col("id").cast("string"), F.lit(f" {seq}")).alias("name"),
                          (F.col("id") * 7 % 1000).alias("amount"), F.lit(seq).cast("long").alias("seq"))

    def write(df: Any, table: str) -> float:
        # Each key's changes reach one task, as a keyed stream's input is clustered by key.
        started = time.perf_counter()
        df.repartition(2, "id").write.format("lakesink").options(**options).mode("append").save(table)
        return time.perf_counter() - started

    write(rows(spark.range(1000), 0), "warm.t")
    base = rows(spark.range(KEYS), 1).cache()
    base.count()
    load_s = write(base, "db.t")
    batches = []
    for b in range(BATCHES):
        updates = spark.range(KEYS).where(F.pmod(F.xxhash64("id", F.lit(b)), F.lit(KEYS // (BATCH // 2))) == 0).limit(BATCH // 2)
        fresh = spark.range(KEYS + b * BATCH, KEYS + b * BATCH + BATCH // 2)
        df = rows(updates.union(fresh), 2 + b).cache()
        df.count()
        batches.append(write(df, "db.t"))
        df.unpersist()
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{work / 'warehouse' / 'catalog.db'}", warehouse=f"file://{work / 'warehouse'}")
    table = catalog.load_table("db.t")
    sizes = []
    for snapshot in table.metadata.snapshots[1:]:
        summary = snapshot.summary.additional_properties if snapshot.summary else {}
        sizes.append(int(summary.get("added-files-size", 0)))
    live = table.scan().to_arrow().num_rows
    spark.stop()
    return {"side": side, "load_s": load_s, "batch_s": batches, "bytes": sizes, "rows": live}


def _child(side: str, work: Path) -> dict[str, Any]:
    for folder in ("warehouse", "index"):
        shutil.rmtree(work / folder, ignore_errors=True)
    out = work / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "benchmarks.history", "--side", side, "--work", str(work), "--result", str(out)],
                   check=True, env=env, cwd=PROJECT_ROOT)
    return json.loads(out.read_text())


def main(reps: int, out: Path, work: Path = WORKDIR) -> int:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    probe_before = host_probe()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    sides = ["history", "plain"]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for rep in range(reps):
        for side in sides[rep % 2:] + sides[: rep % 2]:
            result = _child(side, work)
            log(f"rep {rep}: {side} load {result['load_s']:.1f} s, batches {', '.join(f'{x:.2f}' for x in result['batch_s'])} s")
            results[side].append(result)
    report = {"started": started, "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "host_before": probe_before, "host_after": host_probe(),
              "reps": reps, "keys": KEYS, "batch": BATCH, "batches": BATCHES, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.json").write_text(json.dumps(report, indent=1))
    (out / "HISTORY.md").write_text(render(report))
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out / 'HISTORY.md'}")
    return 0


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def render(report: dict[str, Any]) -> str:
    lines = [f"# History tables ({report['started']} to {report['ended']}, local[2], {report['reps']} runs per side)", "",
             f"A table of {report['keys']:,} keys, then {report['batches']} batch writes of {report['batch']:,} upserts (half updates, "
             "half new keys) each, with history=true and without.", "",
             f"Host probe before/after: {report['host_before']} / {report['host_after']}", "",
             "| side | load of 1M keys, s | mean upsert batch, s | bytes written per batch (data + DVs) | rows in the table after |",
             "|---|---|---|---|---|"]
    means = {}
    for side, runs in report["results"].items():
        means[side] = [statistics.fmean(r["batch_s"]) for r in runs]
        per_batch = [statistics.fmean(r["bytes"][1:]) for r in runs]
        lines.append(f"| {side} | {_spread([r['load_s'] for r in runs])} | {_spread(means[side])} | {_spread(per_batch, 0)} | "
                     f"{runs[0]['rows']:,} |")
    ratios = [h / p for h, p in zip(means["history"], means["plain"])]
    lines += ["", f"history / plain, mean upsert batch: **{statistics.median(ratios):.2f}x** (runs {', '.join(f'{x:.2f}' for x in ratios)}; "
              "target at most 2x). Each figure: median (min-max) over the runs.", ""]
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks history")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", help="where HISTORY.md and history.json go (default ./benchmark-results/)")
    parser.add_argument("--workdir", default=str(WORKDIR), help=f"where the tables go (default {WORKDIR}); emptied first")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        result = run_side(args.side, Path(args.work))
        Path(args.result).write_text(json.dumps(result))
        return 0
    return main(args.reps, Path(args.out).resolve() if args.out else OUT_DIR, Path(args.workdir).resolve())


if __name__ == "__main__":
    sys.exit(cli())
