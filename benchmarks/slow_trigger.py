"""Streams triggered a minute or more apart: what each micro-batch costs once Spark's Python
workers have been closed for being idle (60 s, a constant in Spark's `PythonWorkerFactory`).

Four sides, each a `local[2]` streaming query of its own process over the `rate` source
(`ROWS` rows a batch), started a quarter of the trigger apart so their batches do not overlap:
- `null_stream`: drops its Arrow batches (the floor of any Python sink);
- `lakesink`: appends to a table of the embedded catalog;
- `lakesink + worker_daemon`: the same with `spark.python.daemon.module=
  lakesink_datasource.worker_daemon` (the executor daemon imports the task side before it forks);
- `lakesink + lakesink-python`: the same with `PYSPARK_PYTHON=<venv>/bin/lakesink-python` (every
  daemon, the driver's planner and commit daemons too, imports lakesink before it forks).
Each side's batch durations come from Spark's progress (`durationMs.triggerExecution`); the
first batch (every process starts cold) is reported apart. Run: `python -m benchmarks
slow-trigger [--trigger 65] [--batches 11]` -> SLOW-TRIGGER.md, slow_trigger.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from benchmarks.harness import bytecode_sentence, bytecode_state, log

ROWS = 70_000
LAKESINK_PYTHON = str(Path(sysconfig.get_path("scripts")) / "lakesink-python")
# side -> (Spark conf, Spark's Python)
SIDES: dict[str, tuple[dict[str, str], str]] = {
    "null_stream": ({}, sys.executable),
    "lakesink": ({}, sys.executable),
    "lakesink + worker_daemon": ({"spark.python.daemon.module": "lakesink_datasource.worker_daemon"}, sys.executable),
    "lakesink + lakesink-python": ({}, LAKESINK_PYTHON),
}

CHILD = """
import json, sys
from benchmarks.harness import stream_session
from benchmarks.stream_sinks import NullStreamSink
from lakesink_datasource import LakeSinkDataSource

side, trigger, batches, rows, workdir, conf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], json.loads(sys.argv[6])
spark = stream_session("slow-trigger", (LakeSinkDataSource, NullStreamSink), conf=conf)
df = spark.readStream.format("rate").option("rowsPerSecond", max(1, rows // trigger)).option("numPartitions", 2).load()
if side == "null_stream":
    writer = df.writeStream.format("null_stream")
else:
    writer = df.writeStream.format("lakesink").option("table", "db.rate").option("warehouse", workdir + "/wh").option("maintenance", "off")
query = writer.option("checkpointLocation", workdir + "/ck").trigger(processingTime=f"{trigger} seconds").start()
seen = []
while len(seen) < batches:
    query.awaitTermination(trigger)
    seen = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
query.stop()
print(json.dumps([{"batch": p["batchId"], "rows": p["numInputRows"], "ms": p["durationMs"]["triggerExecution"]} for p in seen]))
"""


def main(trigger: int, batches: int, out: Path) -> int:
    started = time.time()
    procs = {}
    for n, (side, (conf, python)) in enumerate(SIDES.items()):
        if n:
            time.sleep(trigger / len(SIDES))  # staggered: the sides' batches do not overlap
        workdir = tempfile.mkdtemp(prefix=f"slow-trigger-{n}-")
        args = [sys.executable, "-c", CHILD, side, str(trigger), str(batches), str(ROWS), workdir, json.dumps(conf)]
        env = {**os.environ, "PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": sys.executable}
        procs[side] = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).resolve().parents[1])
        log(f"started {side}")
    results = {}
    for side, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=trigger * (batches + 4) + 600)
        if proc.returncode != 0:
            raise RuntimeError(f"{side} failed: {stderr[-3000:]}")
        results[side] = json.loads(stdout.strip().splitlines()[-1])
    bytecode, date = bytecode_state(), time.strftime("%Y-%m-%d")
    report = _report(results, trigger, batches, time.time() - started, bytecode, date)
    out.mkdir(parents=True, exist_ok=True)
    (out / "slow_trigger.json").write_text(json.dumps({"trigger_s": trigger, "batches": batches, "rows": ROWS, "bytecode": bytecode,
                                                       "date": date, "sides": results}, indent=1))
    (out / "SLOW-TRIGGER.md").write_text(report)
    log(f"wrote {out / 'SLOW-TRIGGER.md'}")
    print(report)
    return 0


def _report(results: dict[str, list[dict]], trigger: int, batches: int, seconds: float, bytecode: dict[str, str],
            date: str) -> str:
    floor = statistics.median(b["ms"] for b in results["null_stream"][1:]) / 1000
    floor_mean = statistics.fmean(b["ms"] for b in results["null_stream"][1:]) / 1000
    lines = [
        f"# Slow triggers: batches {trigger} s apart\n",
        f"`python -m benchmarks slow-trigger --trigger {trigger} --batches {batches}`: {len(SIDES)} `local[2]` streams of {ROWS:,}-row "
        f"batches from the `rate` source, one process each, started {trigger // len(SIDES)} s apart ({seconds / 60:.0f} min). "
        "Spark closes a Python worker idle for 60 s, so every batch after the first forks its workers anew. Batch time is "
        "Spark's `triggerExecution`; the first batch (a cold process) is apart. "
        f"{date}. {bytecode_sentence(bytecode)}\n",
        "Batches alternate between a fast and a slow kind on every side (the 60 s idle check falls on alternate sides of "
        "the trigger), so the median of so few can land in either group: read the mean beside it.\n",
        "| side | first batch (s) | later batches: median (s) | mean (s) | min-max (s) | median above null_stream (s) | mean above null_stream (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for side, seen in results.items():
        later = [b["ms"] / 1000 for b in seen[1:]]
        median, mean = statistics.median(later), statistics.fmean(later)
        lines.append(f"| {side} | {seen[0]['ms'] / 1000:.2f} | {median:.2f} | {mean:.2f} | {min(later):.2f}-{max(later):.2f} "
                     f"| {median - floor:+.2f} | {mean - floor_mean:+.2f} |")
    for side, seen in results.items():
        lines.append(f"\n{side}, each batch (s): " + ", ".join(f"{b['ms'] / 1000:.2f}" for b in seen))
    return "\n".join(lines) + "\n"
