"""Where a CDC batch of scenario 5 goes through Spark: PYTHONPATH=. python benchmarks/experiments/cdc-phases/run.py [batches [out.json]]
(from the checkout's root: it imports the `benchmarks` package).

Same data as scenario 5 (1M rows, then batches of 100K changes: 70% updates, 20% inserts,
10% deletes, sequence column; the input cached and repartitioned by key before the timing),
written through `lakesink_profiled`, which records the driver's plan (`writer()`), each
task's `write()` and the commit with their start times. Prints, per batch: the whole
write as the caller sees it, the plan, the slower task, the commit, and what is left
(Spark's scheduling, the Python workers' start-up and the Arrow transfer).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.cdc_data import cdc_batches
from benchmarks.keyed_scenarios import arrow_rows


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    work = Path("/tmp/lakesink-cdc-phases")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prof_dir = work / "prof"
    harness.worker_environment(work / "phases.jsonl", {"LAKESINK_BENCH_PROFILE_DIR": str(prof_dir)})
    config = harness.BenchConfig(workdir=work)
    spark = harness.start_spark(config)
    from benchmarks.profiled_sink import ProfiledLakeSink

    spark.dataSource.register(ProfiledLakeSink)
    options = {"table": "bench.cdc", "warehouse": str(work / "warehouse"), "operation": "cdc", "primary_key": "id",
               "op_column": "op", "sequence_column": "lsn", "index_dir": str(work / "index")}
    import pyarrow as pa

    def write(table: pa.Table) -> tuple[float, float]:
        df = spark.createDataFrame(table).repartition(2, "id").cache()
        df.count()
        writer = df.write.format("lakesink_profiled")
        for k, v in options.items():
            writer = writer.option(k, v)
        started = time.time()
        t0 = time.perf_counter()
        writer.mode("append").save()
        seconds = time.perf_counter() - t0
        df.unpersist()
        return started, seconds

    batch_rows = 100_000
    rows = []
    for b, table, _ in cdc_batches(arrow_rows, 1_000_000, batch_rows, batches):
        shutil.rmtree(prof_dir, ignore_errors=True)
        started, seconds = write(table)
        if b == 0:
            continue  # the base table
        recs = [json.loads(p.read_text()) for p in prof_dir.glob("*.json")]
        plan = sum(r["wall_s"] for r in recs if r["kind"] == "plan")
        tasks = [r for r in recs if r["kind"] == "task"]
        commit = sum(r["wall_s"] for r in recs if r["kind"] == "commit")
        task_max = max((r["wall_s"] for r in tasks), default=0.0)
        wait = max((r["input_wait_s"] for r in tasks), default=0.0)
        first_task = min((r["started"] for r in tasks), default=started) - started
        task_walls = ", ".join(format(r["wall_s"], ".3f") for r in tasks)
        rows.append((b, seconds, plan, first_task, task_max, wait, commit))
        print(f"batch {b:2d}: {seconds:5.2f} s  plan {plan:5.3f}  first task at {first_task:5.3f}  "
              f"tasks {task_walls} (input wait {wait:.3f})  commit {commit:5.3f}  "
              f"rest {seconds - plan - task_max - commit:5.3f}", flush=True)
    if len(sys.argv) > 2:  # a JSON file for compare.py
        Path(sys.argv[2]).write_text(json.dumps([dict(zip(["batch", "whole", "plan", "first_task", "slower_task", "input_wait", "commit"], r))
                                                 for r in rows]))
    a = np.array(rows)
    print(f"\nmedian of {batches}: whole {np.median(a[:, 1]):.3f} s  plan {np.median(a[:, 2]):.3f}  first task at "
          f"{np.median(a[:, 3]):.3f}  slower task {np.median(a[:, 4]):.3f} (input wait {np.median(a[:, 5]):.3f})  "
          f"commit {np.median(a[:, 6]):.3f}  rows/s {batch_rows * batches / a[:, 1].sum():,.0f}")
    spark.stop()


if __name__ == "__main__":
    main()
