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

from benchmarks.harness import (
    OUT_DIR,
    bytecode_sentence,
    bytecode_state,
    host_probe,
    log,
    log_events,
    stream_session,
    worker_environment,
)

WORKDIR = Path("/tmp/lakesink-stream-append")
# Issue 61's targets: a fresh process per side (a scheduled job) against the dropping sink and
# Spark's Parquet sink; one warm session (a running stream) against the dropping sink.
FRESH_LARGE_RATIO = 0.92
FRESH_LARGE_RATIO_JVM = 0.75
WARM_LARGE_RATIO = 0.95
WARM_SMALL_MS = 30.0
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
    from benchmarks.stream_sinks import NullStreamSink, PyarrowStreamSink
    from lakesink_datasource import LakeSinkDataSource

    return stream_session("stream-append", (LakeSinkDataSource, NullStreamSink, PyarrowStreamSink))


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
    # Imported before the clock starts: importing lakesink's maintenance code (pyiceberg, the
    # catalog) in this process took ~0.9 s in a fresh process, the benchmark's own cost, not
    # the sink's (a stream's driver process imports none of it).
    from lakesink_datasource.maintenance.background import wait_for_table

    mark = _log_size()
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    if side in LAKESINK_SIDES:
        wait_for_table(options)  # the last batch's compaction (background) counts: the table is done
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"{side}: {query.exception()}")
    batches = len(query.recentProgress)
    # Each micro-batch's own time: a fresh process's first batch carries its cold start.
    batch_ms = [p.durationMs.get("triggerExecution", 0) for p in query.recentProgress]
    out: dict[str, Any] = {"seconds": seconds, "batches": batches, "batch_ms": batch_ms}
    if side in LAKESINK_SIDES:
        out.update(table_stats(work / "warehouse"))
        out.update(_driver_cpu(mark, out["batches"]))
    return out


def _log_size() -> int:
    path = os.environ.get("LAKESINK_BENCH_LOG")
    return os.path.getsize(path) if path and os.path.exists(path) else 0


def _driver_cpu(mark: int, batches: int) -> dict[str, float]:
    """CPU seconds per micro-batch of lakesink's driver side (planning and commit, with the
    compaction it lands or runs), from the sink's own log events since `mark`."""
    path = os.environ.get("LAKESINK_BENCH_LOG")
    if not path or not os.path.exists(path):
        return {}
    with open(path) as fh:
        fh.seek(mark)
        events = log_events(fh.read())
    cpu = {step: sum(e["cpu_seconds"] for e in events if e.get("event") == f"driver_{step}") for step in ("plan", "commit")}
    return {"driver_cpu_per_batch": (cpu["plan"] + cpu["commit"]) / max(batches, 1),
            "driver_plan_cpu_per_batch": cpu["plan"] / max(batches, 1), "driver_commit_cpu_per_batch": cpu["commit"] / max(batches, 1)}


def table_stats(warehouse: Path) -> dict[str, float]:
    """Write amplification (bytes compactions wrote per byte the batches wrote) and the live
    data files at the end, from the table's snapshots."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lakesink_datasource.iceberg.live_files import live_data_files
    from lakesink_datasource.iceberg.summary_keys import COMPACTION, EPOCH_ID

    table = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}").load_table("bench.events")
    ingested = rewritten = batches = 0
    for snapshot in table.metadata.snapshots:
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        added = int(props.get("added-files-size", 0))
        if props.get(COMPACTION) == "true":
            rewritten += added
        else:
            ingested += added
            batches += EPOCH_ID in props
    live = live_data_files(table.io, table.metadata.current_snapshot())
    # The table counts the micro-batches: a query's recent progress keeps only the last 100.
    return {"write_amplification": rewritten / max(ingested, 1), "live_files": len(live), "ingested_bytes": ingested,
            "batches": batches}


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


LONG_CASES = (Case("10K x 200", 200, 10_000), Case("1M x 20", 20, 1_000_000))


def _run_fresh(side: str, source: Path, work: Path) -> dict[str, Any]:
    """One side in a process of its own (its own SparkSession, Python workers, imports): what
    a scheduled `availableNow` job pays on every run. The session's start is not timed."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.stream_append", "one", side, str(source), str(work)],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{side} in a fresh process failed: {done.stderr.strip()[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(reps: int = 3, java: bool = True, out: Path = OUT_DIR, workdir: Path = WORKDIR, fresh: bool = False,
         long: bool = False) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events.jsonl"
    events.write_text("")
    worker_environment(events)  # the sink's log events (driver CPU) go to this file
    started = time.perf_counter()
    probe = host_probe()
    sources = {case.name: make_source(workdir, case) for case in CASES + (LONG_CASES if long else ())}
    log(f"touching memory: {touch_memory(8):.1f} s for 8 GiB")
    results: dict[str, Any] = {"reps": reps, "extra_options": EXTRA, "fresh": fresh, "date": time.strftime("%Y-%m-%d"), "cases": {},
                               "bytecode": bytecode_state()}
    spark = None if fresh else _spark()
    try:
        if spark is not None:
            # Warm-up: Spark's first streams, Python workers, imports, the JIT; not timed.
            for side in ("null", "lakesink"):
                run_side(spark, side, sources[CASES[1].name], workdir / f"warm-{side}")
        for case in CASES:
            times: dict[str, list[float]] = {side: [] for side in SIDES}
            first: dict[str, list[float]] = {side: [] for side in SIDES}
            metrics: dict[str, list[dict[str, float]]] = {side: [] for side in LAKESINK_SIDES}
            for rep in range(reps):
                order = SIDES[rep % len(SIDES):] + SIDES[:rep % len(SIDES)]
                for side in order:
                    if spark is None:
                        r = _run_fresh(side, sources[case.name], workdir / "run")
                    else:
                        r = run_side(spark, side, sources[case.name], workdir / "run")
                    if r["batches"] < case.batches:
                        raise RuntimeError(f"{side}: {r['batches']} batches where {case.batches} were expected")
                    times[side].append(r["seconds"])
                    first[side].append(r["batch_ms"][0] / 1000)
                    if side in metrics:
                        metrics[side].append({k: v for k, v in r.items() if k not in ("seconds", "batches")})
                    log(f"{case.name} rep {rep}: {side} {r['seconds']:.2f} s")
            results["cases"][case.name] = {"batches": case.batches, "rows": case.rows, "seconds": times, "metrics": metrics,
                                          "first_batch": first}
        if long:
            # A long stream with the default maintenance: how many bytes its compaction rewrites.
            for case in LONG_CASES:
                r = (_run_fresh("lakesink", sources[case.name], workdir / "run") if spark is None
                     else run_side(spark, "lakesink", sources[case.name], workdir / "run"))
                log(f"{case.name}: lakesink {r['seconds']:.1f} s, write amplification {r['write_amplification']:.2f}, "
                    f"{r['live_files']} live files, driver CPU {r.get('driver_cpu_per_batch', 0) * 1000:.0f} ms per batch")
                results.setdefault("long", {})[case.name] = {"batches": case.batches, "rows": case.rows, **r}
    finally:
        if spark is not None:
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
        f"`python -m benchmarks stream-append{' --fresh' if results.get('fresh') else ''}` (benchmarks/stream_append.py), "
        f"{results.get('date', '')}: a stream reads a folder of Parquet",
        "files, one per micro-batch (`maxFilesPerTrigger=1`, `trigger(availableNow=True)`), on `local[2]`"
        + (", each run in a process of its own (a fresh SparkSession: what a scheduled `availableNow` job pays; "
           "the session's start is not timed)." if results.get("fresh") else ", all runs in one session after a warm-up."),
        f"Medians of {results['reps']} runs per sink, sides interleaved in one run. `vs floor` is the dropping",
        "sink's time over the sink's (1.00 = as fast as a Python sink can be); `ms/batch above` is the",
        "extra time per micro-batch over the dropping sink.",
        "",
    ]
    if results.get("extra_options"):
        lines += [f"lakesink options added: `{results['extra_options']}`", ""]
    if results.get("bytecode"):
        lines += [bytecode_sentence(results["bytecode"]), ""]
    for case in results["cases"].values():
        seconds = case["seconds"]
        floor = statistics.median(seconds["null"])
        total_rows = case["batches"] * case["rows"]
        lines += [f"## {case['batches']} micro-batches of {case['rows']:,} rows", "",
                  "| sink | seconds (median) | runs | rows/s | vs floor | ms/batch above floor | first micro-batch, s (median) |",
                  "|---|---|---|---|---|---|---|"]
        for side, runs in seconds.items():
            if isinstance(runs, str):
                lines.append(f"| {side} | {runs} | | | | | |")
                continue
            med = statistics.median(runs)
            firsts = case.get("first_batch", {}).get(side)
            lines.append(
                f"| {side} | {med:.2f} | {', '.join(f'{r:.2f}' for r in runs)} | {total_rows / med:,.0f} | {floor / med:.2f} "
                f"| {(med - floor) / case['batches'] * 1000:+.0f} | {f'{statistics.median(firsts):.2f}' if firsts else ''} |"
            )
        lines.append("")
        metrics = case.get("metrics", {})
        if any(metrics.values()):
            lines += ["| lakesink | driver CPU ms/batch (plan + commit) | write amplification | live files at the end |", "|---|---|---|---|"]
            for side, runs in metrics.items():
                if not runs:
                    continue
                cpu = statistics.median(r.get("driver_cpu_per_batch", 0) for r in runs) * 1000
                amp = statistics.median(r["write_amplification"] for r in runs)
                lines.append(f"| {side} | {cpu:.0f} | {amp:.2f} | {statistics.median(r['live_files'] for r in runs):.0f} |")
            lines.append("")
    if results.get("long"):
        lines += ["## Long streams, default maintenance", "",
                  "Write amplification: bytes lakesink's compactions wrote per byte the micro-batches wrote (target at most 2).", "",
                  "| micro-batches | seconds | write amplification | live files at the end | driver CPU ms/batch |", "|---|---|---|---|---|"]
        for r in results["long"].values():
            lines.append(f"| {r['batches']} x {r['rows']:,} rows | {r['seconds']:.1f} | {r['write_amplification']:.2f} | {r['live_files']} "
                         f"| {r.get('driver_cpu_per_batch', 0) * 1000:.0f} |")
        lines.append("")
    large = results["cases"].get(CASES[0].name)
    small = results["cases"].get(CASES[1].name)
    if large and small:
        lf, sf = statistics.median(large["seconds"]["null"]), statistics.median(small["seconds"]["null"])
        fresh = bool(results.get("fresh"))
        title = ("## Targets (issue 61, a scheduled job: each side in a fresh process)" if fresh else
                 "## Targets (issue 61, a running stream: one warm session)")
        lines += [title, "",
                  "| target | " + " | ".join(f"lakesink (maintenance {m})" for m in LAKESINK_SIDES.values()) + " |", "|---|---|---|---|"]
        lr = [lf / statistics.median(large["seconds"][s]) for s in LAKESINK_SIDES]
        sm = [(statistics.median(small["seconds"][s]) - sf) / small["batches"] * 1000 for s in LAKESINK_SIDES]
        large_target = FRESH_LARGE_RATIO if fresh else WARM_LARGE_RATIO
        lines.append(f"| 1M-row batches: at least {large_target}x the dropping sink | " + " | ".join(f"{r:.2f}x" for r in lr) + " |")
        if fresh:
            jvm = large["seconds"].get("spark-parquet")
            if isinstance(jvm, list) and jvm:
                jr = [statistics.median(jvm) / statistics.median(large["seconds"][s]) for s in LAKESINK_SIDES]
                lines.append(f"| 1M-row batches: at least {FRESH_LARGE_RATIO_JVM}x Spark's Parquet sink | "
                             + " | ".join(f"{r:.2f}x" for r in jr) + " |")
            lines.append("| 10K-row batches, ms per batch above the dropping sink (no target for a fresh process) | "
                         + " | ".join(f"{m:+.0f} ms" for m in sm) + " |")
        else:
            lines.append(f"| 10K-row batches: at most {WARM_SMALL_MS:.0f} ms per batch above it | "
                         + " | ".join(f"{m:+.0f} ms" for m in sm) + " |")
        lines.append("")
    lines += [f"Total {results['total_seconds'] / 60:.1f} min. Profile and what was tried: "
              "benchmarks/experiments/stream-append/FINDINGS.md.", ""]
    return "\n".join(lines)


def _one(side: str, source: str, work: str) -> int:
    """`python -m benchmarks.stream_append one SIDE SOURCE WORK`: one side in this process."""
    spark = _spark()
    try:
        print(json.dumps(run_side(spark, side, Path(source), Path(work))))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "one":
        sys.exit(_one(*sys.argv[2:]))
    sys.exit(main())
