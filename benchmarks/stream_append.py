"""Streaming appends against the floor of a Python sink: `python -m benchmarks stream-append`.

A stream reads a folder of Parquet files, one file per micro-batch (`maxFilesPerTrigger=1`,
`trigger(availableNow=True)`), rows of (id, ts, cat, amount, name), and appends them to each
sink in turn, on one `local[2]` session, in one run:

- `null`: a Python streaming sink that drops the rows (benchmarks/stream_sinks.py): the floor
  of any Python sink, what Spark costs before a sink does anything;
- `pyarrow`: a Python streaming sink that only writes the rows to Parquet with pyarrow;
- `spark-parquet`: Spark's own Parquet file sink (JVM, no Python);
- `lakesink`: lakesink with its defaults (maintenance=auto: compaction after batches);
- `lakesink-background`: lakesink with maintenance=background (the same compaction, beside the
  next micro-batch; its time includes waiting for the last batch's compaction);
- `lakesink-off`: lakesink with maintenance=off;
- `iceberg-java`: Iceberg Java 1.10.2's own Spark sink on Spark 3.5 (a v3 table in a Hadoop
  catalog), in a process of its own, where the readers' set-up (../shared/tools/readers/) is
  present: ICEBERG_SPARK_JAR and SHADED_JACKSON_JAR, and its Spark 3.5 venv.

Two cases: 5 micro-batches of 1M rows and 30 of 10K. Reported per case and sink: the
median wall time of the query over `--reps` runs (sides interleaved, each rep in a rotated
order), rows/s, the ratio of the dropping sink's time to it (1.0 = at the floor) and the
milliseconds per micro-batch above the floor. Targets (issue 31): lakesink at least 0.95x
the floor for 1M-row batches and at most 30 ms per batch above it for 10K-row batches.
Writes STREAM-APPEND.md and stream_append.json.

This machine backs a guest's memory lazily (a first touch of a page costs about 2 s per GB):
the warm-up touches several GB once so that no side pays for pages the one before it never
used.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import OUT_DIR, host_probe, log

WORKDIR = Path("/tmp/lakesink-stream-append")
TARGET_LARGE_RATIO = 0.95
TARGET_SMALL_MS = 30.0
SPARK35_PYTHON = Path.home() / ".cache/iceberg-readers/venv-spark35/bin/python"


@dataclass(frozen=True)
class Case:
    name: str
    batches: int
    rows: int


CASES = (Case("1M x 5", 5, 1_000_000), Case("10K x 30", 30, 10_000))
SIDES = ("null", "pyarrow", "spark-parquet", "lakesink", "lakesink-background", "lakesink-off")
LAKESINK_SIDES = {"lakesink": "auto", "lakesink-background": "background", "lakesink-off": "off"}
# Options added to both lakesink sides (`--lakesink-option key=value`), for trying settings.
EXTRA: dict[str, str] = {}


def make_source(root: Path, case: Case) -> Path:
    """One Parquet file per micro-batch, as a landing folder of an upstream job holds them."""
    folder = root / f"source-{case.batches}x{case.rows}"
    if folder.exists():
        return folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(31)
    names = np.array([f"name-{i:05d}" for i in range(5000)], dtype=object)
    for b in range(case.batches):
        ids = np.arange(b * case.rows, (b + 1) * case.rows, dtype=np.int64)
        table = pa.table({
            "id": ids,
            "ts": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
            "cat": pa.array([f"c{v}" for v in rng.integers(0, 20, case.rows)]),
            "amount": rng.random(case.rows) * 1000,
            "name": pa.array(names[rng.integers(0, len(names), case.rows)].tolist(), pa.string()),
        })
        pq.write_table(table, folder / f"part-{b:05d}.parquet", compression="snappy")
    return folder


def touch_memory(gib: int) -> float:
    """Write every page of `gib` GiB once and free it: the VM backs them from then on."""
    started = time.perf_counter()
    for _ in range(gib):
        block = np.ones(1 << 27, dtype=np.int64)  # 1 GiB, every page written
        del block
    return time.perf_counter() - started


def _spark() -> Any:
    from pyspark.sql import SparkSession

    from benchmarks.stream_sinks import NullStreamSink, PyarrowStreamSink
    from lakesink_datasource import LakeSinkDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("stream-append")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.compression.codec", "zstd")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    for source in (LakeSinkDataSource, NullStreamSink, PyarrowStreamSink):
        spark.dataSource.register(source)
    return spark


def run_side(spark: Any, side: str, source: Path, work: Path) -> dict[str, Any]:
    """One stream over the whole folder; the query's wall time from start to its end."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    schema = pq.read_schema(next(source.iterdir()))
    from pyspark.sql.pandas.types import from_arrow_schema

    stream = spark.readStream.schema(from_arrow_schema(schema)).option("maxFilesPerTrigger", 1).parquet(str(source))
    writer = stream.writeStream.trigger(availableNow=True).option("checkpointLocation", str(work / "checkpoint"))
    if side == "null":
        writer = writer.format("null_stream")
    elif side == "pyarrow":
        writer = writer.format("pyarrow_stream").option("path", str(work / "out"))
    elif side == "spark-parquet":
        writer = writer.format("parquet").option("path", str(work / "out"))
    elif side in LAKESINK_SIDES:
        options = {"table": "bench.events", "warehouse": str(work / "warehouse"), "progress": "true",
                   "maintenance": LAKESINK_SIDES[side], **EXTRA}
        writer = writer.format("lakesink").options(**options)
    else:
        raise ValueError(side)
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    if side in LAKESINK_SIDES:
        from lakesink_datasource.maintenance.background import wait_for_table

        wait_for_table(options)  # the last batch's compaction (background) counts: the table is done
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{side}: {query.exception()}")
    batches = len(query.recentProgress)
    return {"seconds": seconds, "batches": batches}


def run_iceberg_java(case: Case, source: Path, work: Path, reps: int) -> list[float] | str:
    jar, jackson = os.environ.get("ICEBERG_SPARK_JAR"), os.environ.get("SHADED_JACKSON_JAR")
    if not (jar and jackson and SPARK35_PYTHON.exists()):
        return "not run: the readers' set-up (ICEBERG_SPARK_JAR, SHADED_JACKSON_JAR, venv-spark35) is missing"
    script = Path(__file__).with_name("stream_append_iceberg.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_HOME", "PYTHONPATH"))}
    done = subprocess.run(
        [str(SPARK35_PYTHON), str(script), str(source), str(work), str(reps), jar, jackson],
        env=env, capture_output=True, text=True, timeout=3600,
    )
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return [float(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]


def main(reps: int = 3, java: bool = True, out: Path = OUT_DIR, workdir: Path = WORKDIR) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    probe = host_probe()
    sources = {case.name: make_source(workdir, case) for case in CASES}
    log(f"touching memory: {touch_memory(8):.1f} s for 8 GiB")
    spark = _spark()
    results: dict[str, Any] = {"reps": reps, "extra_options": EXTRA, "cases": {}}
    try:
        # Warm-up: Spark's first streams, Python workers, imports, the JIT; not timed.
        for side in ("null", "lakesink"):
            run_side(spark, side, sources[CASES[1].name], workdir / f"warm-{side}")
        for case in CASES:
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            for rep in range(reps):
                order = SIDES[rep % len(SIDES):] + SIDES[:rep % len(SIDES)]
                for side in order:
                    r = run_side(spark, side, sources[case.name], workdir / "run")
                    if r["batches"] < case.batches:
                        raise RuntimeError(f"{side}: {r['batches']} batches where {case.batches} were expected")
                    times[side].append(r["seconds"])
                    log(f"{case.name} rep {rep}: {side} {r['seconds']:.2f} s")
            results["cases"][case.name] = {"batches": case.batches, "rows": case.rows, "seconds": times}
    finally:
        spark.stop()
    if java:
        for case in CASES:
            java_times = run_iceberg_java(case, sources[case.name], workdir / "java", reps)
            log(f"{case.name}: iceberg-java {java_times}")
            results["cases"][case.name]["seconds"]["iceberg-java"] = java_times
    results["host_probe"] = {"start": probe, "end": host_probe()}
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stream_append.json").write_text(json.dumps(results, indent=2))
    (out / "STREAM-APPEND.md").write_text(render(results))
    log(f"wrote {out / 'STREAM-APPEND.md'} in {results['total_seconds'] / 60:.1f} min")
    return 0


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Streaming appends against the floor of a Python sink",
        "",
        "`python -m benchmarks stream-append` (benchmarks/stream_append.py): a stream reads a folder of Parquet",
        "files, one per micro-batch (`maxFilesPerTrigger=1`, `trigger(availableNow=True)`), on `local[2]`.",
        f"Medians of {results['reps']} runs per sink, sides interleaved in one run. `vs floor` is the dropping",
        "sink's time over the sink's (1.00 = as fast as a Python sink can be); `ms/batch above` is the",
        "extra time per micro-batch over the dropping sink.",
        "",
    ]
    if results.get("extra_options"):
        lines += [f"lakesink options added: `{results['extra_options']}`", ""]
    for case in results["cases"].values():
        seconds = case["seconds"]
        floor = statistics.median(seconds["null"])
        total_rows = case["batches"] * case["rows"]
        lines += [f"## {case['batches']} micro-batches of {case['rows']:,} rows", "",
                  "| sink | seconds (median) | runs | rows/s | vs floor | ms/batch above floor |", "|---|---|---|---|---|---|"]
        for side, runs in seconds.items():
            if isinstance(runs, str):
                lines.append(f"| {side} | {runs} | | | | |")
                continue
            med = statistics.median(runs)
            lines.append(
                f"| {side} | {med:.2f} | {', '.join(f'{r:.2f}' for r in runs)} | {total_rows / med:,.0f} | {floor / med:.2f} "
                f"| {(med - floor) / case['batches'] * 1000:+.0f} |"
            )
        lines.append("")
    large = results["cases"].get(CASES[0].name)
    small = results["cases"].get(CASES[1].name)
    if large and small:
        lf, sf = statistics.median(large["seconds"]["null"]), statistics.median(small["seconds"]["null"])
        lines += ["## Targets (issue 31)", "", "| target | " + " | ".join(f"lakesink (maintenance {m})" for m in LAKESINK_SIDES.values())
                  + " |", "|---|---|---|---|"]
        lr = [lf / statistics.median(large["seconds"][s]) for s in LAKESINK_SIDES]
        sm = [(statistics.median(small["seconds"][s]) - sf) / small["batches"] * 1000 for s in LAKESINK_SIDES]
        lines.append(f"| 1M-row batches: at least {TARGET_LARGE_RATIO}x the floor | " + " | ".join(f"{r:.2f}x" for r in lr) + " |")
        lines.append(f"| 10K-row batches: at most {TARGET_SMALL_MS:.0f} ms per batch above it | "
                     + " | ".join(f"{m:+.0f} ms" for m in sm) + " |")
        lines.append("")
    lines += [f"Total {results['total_seconds'] / 60:.1f} min. Profile and what was tried: "
              "benchmarks/experiments/stream-append/FINDINGS.md.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
