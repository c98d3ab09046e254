"""Scenario 4's upsert next to Spark's floor, with lakesink's tasks taken apart:
PYTHONPATH=. python benchmarks/experiments/keyed-floor/floor_upsert.py [table rows [repetitions]]
(from the checkout's root: it imports the `benchmarks` package)

Builds a table of `table rows` (default 1M) with operation=upsert and a delta-rs table of
the same rows, then per repetition one batch of 100K rows (half updates of random keys,
half new keys), cached in 2 partitions outside the timing, written three ways in
alternating order: a Python sink that does nothing (`noop_python`, the floor), lakesink
through the profiling sink (each task's wall and CPU seconds, the time it waited for
Spark's Arrow batches, the commit), and delta-rs's merge. MODE=cprofile in the environment
also dumps every lakesink task's cProfile into $PROFILE_OUT (default /tmp/keyed-floor-prof).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.keyed_scenarios import arrow_rows, delta_engine, save_df, upsert_batch


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    work = Path("/tmp/lakesink-keyed-floor")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prof = work / "prof"
    mode_file = work / "mode"
    mode_file.write_text(os.environ.get("MODE", "time"))
    saved = Path(os.environ.get("PROFILE_OUT", "/tmp/keyed-floor-prof"))
    shutil.rmtree(saved, ignore_errors=True)
    saved.mkdir(parents=True)
    harness.worker_environment(work / "phases.jsonl", {"LAKESINK_BENCH_PROFILE_DIR": str(prof), "LAKESINK_BENCH_PROFILE_MODE_FILE": str(mode_file)})
    spark = harness.start_spark(harness.BenchConfig(workdir=work))
    from benchmarks.profiled_sink import ProfiledLakeSink

    spark.dataSource.register(ProfiledLakeSink)
    options = {"table": "bench.keyed", "warehouse": str(work / "warehouse"), "operation": "upsert", "primary_key": "id",
               "index_dir": str(work / "index")}

    base = arrow_rows(np.arange(size), 0)
    df = spark.createDataFrame(base).repartition(2).cache()
    df.count()
    save_df(df, "lakesink", options)
    df.unpersist()
    delta = delta_engine(work)
    if delta is not None:
        delta.build(base)
    rng = np.random.default_rng(size)
    existing = size
    sides = ["noop", "lakesink", *(["delta-rs"] if delta is not None else [])]
    times: dict[str, list[float]] = {s: [] for s in sides}
    task_cpu: list[float] = []
    for rep in range(reps + 1):  # the first is a warm-up
        batch, existing = upsert_batch(rng, existing, 100_000, rep + 1)
        df = spark.createDataFrame(batch).repartition(2).cache()
        df.count()
        line = []
        for side in sides if rep % 2 == 0 else list(reversed(sides)):
            shutil.rmtree(prof, ignore_errors=True)
            started = time.perf_counter()
            if side == "noop":
                save_df(df, "noop_python", {})
            elif side == "lakesink":
                save_df(df, "lakesink_profiled", options)
            else:
                assert delta is not None
                delta.upsert(batch)
            seconds = time.perf_counter() - started
            text = f"{side} {seconds:.3f} s"
            if side == "lakesink":
                records = [json.loads(p.read_text()) for p in prof.glob("*.json")]
                tasks = [r for r in records if r["kind"] == "task"]
                commit = sum(r["wall_s"] for r in records if r["kind"] == "commit")
                text += (f" (tasks {', '.join(format(r['wall_s'], '.3f') for r in tasks)} s wall, "
                         f"{', '.join(format(r['cpu_s'], '.3f') for r in tasks)} s CPU, "
                         f"input wait {max(r['input_wait_s'] for r in tasks):.3f} s, commit {commit:.3f} s)")
                if rep:
                    task_cpu += [r["cpu_s"] for r in tasks]
                    for p in prof.glob("task-*.prof"):
                        shutil.copy(p, saved / f"{rep}-{p.name}")
            if rep:
                times[side].append(seconds)
            line.append(text)
        df.unpersist()
        print(f"{'warm-up' if rep == 0 else f'rep {rep}'}: " + " | ".join(line), flush=True)
    floor = statistics.median(times["noop"])
    print(f"\n{size:,} rows, medians of {reps}: " + ", ".join(f"{s} {statistics.median(v):.3f} s" for s, v in times.items())
          + f"; lakesink above the floor {statistics.median(times['lakesink']) - floor:.3f} s; "
          f"lakesink task CPU median {statistics.median(task_cpu):.3f} s")
    spark.stop()


if __name__ == "__main__":
    main()
