"""One stream, many tables: `python -m benchmarks routed` -> ROUTED.md, routed.json.

Three cases, each side in a fresh process of its own (`local[2]`, the embedded catalog, a
warm-up stream first so no side pays for imports), sides interleaved over `--reps` runs:

- `replicate`: 3 micro-batches of 20 tables x 5,000 rows (tbl, id, amount, name), appended.
  `routed`: one stream, `table_column="tbl"`; `streams`: 20 queries at once, each filtering
  its table (what a Spark user does today); `single`: one stream of the same rows into one
  table (the rows' cost without routing). Issue 47's target: routed at least 10x ahead of
  the 20 streams.
- `wide`: 3 micro-batches of 100 tables x 1,000 rows, routed, against the same rows into one
  table. Target: a routed batch at most 3x the single table's.
- `thousand`: a keyed (upsert) stream over 1,000 tables, each micro-batch touching 100 of
  them (1,000 rows each), 20 batches: every table met twice. Flat batch times mean the
  tables (and key indexes) a batch does not touch cost it nothing.

Reported per side: the query's wall time, the mean micro-batch time (Spark's
triggerExecution), and the CPU seconds of the driver, its JVM and the Python workers
(utime + stime of the process tree, read from /proc before the stream starts and before the
session stops).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import OUT_DIR, PROJECT_ROOT, _cpu_ticks, _descendants, host_probe, log, register_lakesink

WORKDIR = Path("/tmp/lakesink-routed")
SCHEMA = pa.schema([("tbl", pa.string()), ("id", pa.int64()), ("amount", pa.float64()), ("name", pa.string())])
CASES: dict[str, dict[str, Any]] = {
    "replicate": {"tables": 20, "rows": 5_000, "batches": 3, "touched": 20, "sides": ("routed", "streams", "single")},
    "wide": {"tables": 100, "rows": 1_000, "batches": 3, "touched": 100, "sides": ("routed", "single")},
    "thousand": {"tables": 1_000, "rows": 1_000, "batches": 20, "touched": 100, "sides": ("routed",)},
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ data


def make_source(folder: Path, tables: int, rows: int, batches: int, touched: int, seed: int = 47) -> None:
    """One Parquet file per micro-batch; batch b touches `touched` tables in turn."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for b in range(batches):
        first = (b * touched) % tables
        names = [f"t{(first + i) % tables:04d}" for i in range(touched)]
        columns: dict[str, list[Any]] = {"tbl": [], "id": [], "amount": [], "name": []}
        for name in names:
            ids = rng.sample(range(rows * 4), rows)  # keys repeat across batches: updates
            columns["tbl"] += [name] * rows
            columns["id"] += ids
            columns["amount"] += [i / 7 for i in ids]
            columns["name"] += [f"{name}-{i}" for i in ids]
        path = folder / f"{b:04d}.parquet"
        pq.write_table(pa.table(columns, schema=SCHEMA), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))


# ------------------------------------------------------------------ one side, in its own process


def _tree_cpu_seconds() -> float:
    pids = [os.getpid(), *_descendants(os.getpid())]
    return sum((t[0] if (t := _cpu_ticks(p)) else 0) for p in pids) / CLK_TCK


def run_side(side: str, case: str, work: Path) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F


    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_lakesink(spark)
    spec = CASES[case]
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": str(work / "index")} if case == "thousand" else {}
    common = {"warehouse": str(work / "warehouse"), "progress": "false", "maintenance": "off", **keyed}

    def stream(source: Path, checkpoint: str, **options: str):  # type: ignore[no-untyped-def]
        df = spark.readStream.schema("tbl string, id long, amount double, name string").option("maxFilesPerTrigger", 1).parquet(str(source))
        table = options.pop("only", None)
        if table is not None:
            df = df.filter(F.col("tbl") == table).drop("tbl")
        return (df.writeStream.format("lakesink").options(**common, **options)
                .option("checkpointLocation", str(work / "checkpoints" / checkpoint)).trigger(availableNow=True).start())

    # Warm-up: the session's Python workers, imports and catalog, on tables of their own.
    warm = work / "warm-source"
    warm_query = stream(warm, "warm", table_column="tbl", namespace="warm") if side == "routed" else stream(warm, "warm", table="warm.one")
    warm_query.awaitTermination()
    source = work / f"source-{case}"
    cpu0, started = _tree_cpu_seconds(), time.perf_counter()
    if side == "routed":
        queries = [stream(source, "routed", table_column="tbl", namespace="db")]
    elif side == "single":
        queries = [stream(source, "single", table="db.all_rows")]
    else:
        queries = [stream(source, f"s{i}", table=f"db.t{i:04d}", only=f"t{i:04d}") for i in range(spec["tables"])]
    for query in queries:
        query.awaitTermination()
    wall = time.perf_counter() - started
    cpu = _tree_cpu_seconds() - cpu0
    batch_ms = [p["durationMs"]["triggerExecution"] for q in queries for p in q.recentProgress if p["numInputRows"]]
    spark.stop()
    return {"side": side, "case": case, "wall_s": wall, "cpu_s": cpu, "batch_ms": batch_ms}


def _child(side: str, case: str, work: Path) -> dict[str, Any]:
    shutil.rmtree(work / "warehouse", ignore_errors=True)
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    shutil.rmtree(work / "index", ignore_errors=True)
    out = work / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "benchmarks.routed_tables", "--side", side, "--case", case, "--work", str(work), "--result", str(out)],
                   check=True, env=env, cwd=PROJECT_ROOT)
    return json.loads(out.read_text())


# ------------------------------------------------------------------ the run


def file_create_ms(work: Path, files: int = 400) -> float:
    """Milliseconds to create one empty file, over `files` in 100 fresh directories under
    `work` (the routed side creates four files per table and batch, the single-table side
    four per batch: a slow file system weighs on the ratio)."""
    probe = work / "create-probe"
    for i in range(100):
        (probe / f"t{i:03d}").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i in range(files):
        (probe / f"t{i % 100:03d}" / f"f{i}").touch()
    ms = (time.perf_counter() - started) / files * 1e3
    shutil.rmtree(probe)
    return ms


def main(reps: int, cases: list[str], out: Path, work: Path = WORKDIR) -> int:
    shutil.rmtree(work, ignore_errors=True)
    make_source(work / "warm-source", tables=2, rows=100, batches=1, touched=2)
    create_before = file_create_ms(work)
    for case in cases:
        spec = CASES[case]
        make_source(work / f"source-{case}", spec["tables"], spec["rows"], spec["batches"], spec["touched"])
    probe_before = host_probe()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for case in cases:
        sides = list(CASES[case]["sides"])
        results[case] = {side: [] for side in sides}
        for rep in range(reps):
            for side in sides[rep % len(sides):] + sides[: rep % len(sides)]:
                result = _child(side, case, work)
                log(f"{case} rep {rep}: {side} {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s")
                results[case][side].append(result)
    report = {"started": started, "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "host_before": probe_before,
              "host_after": host_probe(), "reps": reps, "results": results, "workdir": str(work),
              "file_create_ms": [create_before, file_create_ms(work)]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "routed.json").write_text(json.dumps(report, indent=1))
    (out / "ROUTED.md").write_text(render(report))
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out / 'ROUTED.md'}")
    return 0


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def render(report: dict[str, Any]) -> str:
    lines = [f"# One stream, many tables ({report['started']} to {report['ended']}, local[2], {report['reps']} runs per side)", "",
             f"Host probe before/after: {report['host_before']} / {report['host_after']}", ""]
    if "file_create_ms" in report:
        before, after = report["file_create_ms"]
        lines += [f"Tables under {report['workdir']}: creating an empty file there took {before:.3f} ms before the runs, "
                  f"{after:.3f} ms after (the routed side creates four files per table and batch).", ""]
    for case, sides in report["results"].items():
        spec = CASES[case]
        lines += [f"## {case}: {spec['batches']} micro-batches of {spec['touched']} tables x {spec['rows']:,} rows"
                  f" ({spec['tables']:,} tables in all)", "",
                  "| side | wall s, median (min-max) | mean micro-batch ms, median (min-max) | CPU s, median (min-max) |", "|---|---|---|---|"]
        medians = {}
        for side, runs in sides.items():
            means = [statistics.fmean(r["batch_ms"]) for r in runs]
            medians[side] = statistics.median(r["wall_s"] for r in runs)
            lines.append(f"| {side} | {_spread([r['wall_s'] for r in runs])} | {_spread(means)} | {_spread([r['cpu_s'] for r in runs])} |")
        lines.append("")
        if "streams" in medians:
            cpu = {s: statistics.median(r["cpu_s"] for r in runs) for s, runs in sides.items()}
            later = {s: statistics.median(statistics.fmean(r["batch_ms"][1:]) for r in runs) for s, runs in sides.items() if s != "streams"}
            lines.append(f"20 filtering streams / routed (wall): **{medians['streams'] / medians['routed']:.1f}x** (target at least 10x); "
                         f"CPU: **{cpu['streams'] / cpu['routed']:.1f}x**; routed / single table: {medians['routed'] / medians['single']:.2f}x "
                         f"(after the first micro-batch, which creates the 20 tables: {later['routed']:.0f} ms against {later['single']:.0f} ms a batch)")
        elif "single" in medians:
            batch = {s: statistics.median(statistics.fmean(r["batch_ms"]) for r in runs) for s, runs in sides.items()}
            later = {s: statistics.median(statistics.fmean(r["batch_ms"][1:]) for r in runs) for s, runs in sides.items()}
            first = {s: statistics.median(r["batch_ms"][0] for r in runs) for s, runs in sides.items()}
            lines.append(f"routed / single table, per micro-batch: **{batch['routed'] / batch['single']:.2f}x** (target at most 3x); "
                         f"after the first micro-batch (the tables exist): {later['routed']:.0f} ms against {later['single']:.0f} ms, "
                         f"**{later['routed'] / later['single']:.2f}x**; the first (the routed side creates its {spec['touched']} tables): "
                         f"{first['routed']:.0f} ms against {first['single']:.0f} ms")
        else:
            runs = sides["routed"]
            per_batch = [statistics.median(r["batch_ms"][i] for r in runs) for i in range(len(runs[0]["batch_ms"]))]
            half = len(per_batch) // 2
            lines.append("micro-batch ms (median over runs), in order: " + ", ".join(f"{v:.0f}" for v in per_batch))
            lines.append(f"\nfirst pass (tables new) mean {statistics.fmean(per_batch[:half]):.0f} ms, second pass (tables met before) "
                         f"mean {statistics.fmean(per_batch[half:]):.0f} ms")
        lines.append("")
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks routed")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--out", help="where ROUTED.md and routed.json go (default ./benchmark-results/)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=str(WORKDIR), help=f"where the tables go (default {WORKDIR}); emptied first")
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        result = run_side(args.side, args.case, Path(args.work))
        Path(args.result).write_text(json.dumps(result))
        return 0
    return main(args.reps, args.cases.split(","), Path(args.out).resolve() if args.out else OUT_DIR, Path(args.workdir).resolve())


if __name__ == "__main__":
    sys.exit(cli())
