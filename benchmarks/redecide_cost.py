"""What deciding shared keys at commit costs a keyed batch (commit/key_conflicts.py).

`python -m benchmarks redecide [--rows N] [--batch N] [--reps N]` -> REDECIDE.md + redecide.json

A table of `rows` keys; writer A upserts `batch` random existing keys per batch. Three kinds
of batch, interleaved (rotated each round), through the production path without Spark
(plan_write -> write_task -> commit_write, each writer its own key index, as two hosts):

* alone: nobody else commits while A's batch is in flight;
* none shared: writer B commits 10% of A's batch size of *other* keys between A's tasks and
  A's commit (the commit reads B's files and finds no shared key);
* 1% shared: the same, with 1% of A's keys among B's (those keys are decided at commit).

A's batch time is its task (index sync, lookups, Parquet) plus its commit; after each batch,
A's index is brought up to date by an untimed one-row batch, so no batch pays for
following the one before. Medians with min-max over the timed rounds.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.messages import LakeSinkCommitMessage, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType()), T.StructField("n", T.LongType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64())])
KINDS = ("alone", "none shared", "1% shared")


class _Writer:
    def __init__(self, warehouse: Path, name: str) -> None:
        self.options = parse_options({
            "table": "db.keyed", "warehouse": str(warehouse), "operation": "upsert", "primary_key": "id",
            "index_dir": str(warehouse.parent / f"index-{name}"), "partition_by": "bucket(4, id)", "progress": "false",
        })
        self.name = name
        self.batches = 0

    def plan(self) -> WritePlan:
        return plan_write(self.options, SCHEMA, overwrite=False)

    def write(self, plan: WritePlan, ids: np.ndarray) -> LakeSinkCommitMessage:
        rows = pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"{self.name}{self.batches}"] * len(ids)), pa.array(ids, pa.int64())], schema=ARROW)
        who = TaskIdentity(batch_id=self.batches, query_id=f"writer-{self.name}")
        return write_task(plan, iter([rows]), who)

    def commit(self, plan: WritePlan, message: LakeSinkCommitMessage) -> CommitOutcome:
        outcome = commit_write(plan, decode_messages([message]), self.batches)
        self.batches += 1
        return outcome

    def batch(self, ids: np.ndarray) -> CommitOutcome:
        plan = self.plan()
        return self.commit(plan, self.write(plan, ids))


def run(rows: int, batch: int, reps: int, workdir: Path) -> dict:
    shutil.rmtree(workdir, ignore_errors=True)
    warehouse = workdir / "warehouse"
    warehouse.mkdir(parents=True)
    a, b = _Writer(warehouse, "a"), _Writer(warehouse, "b")
    rng = np.random.default_rng(11)
    for start in range(0, rows, 250_000):
        a.batch(np.arange(start, min(rows, start + 250_000), dtype=np.int64))
    b.batch(np.arange(0, 1, dtype=np.int64))  # B's index built before the timed rounds
    other = max(1, batch // 10)
    samples: dict[str, list[dict]] = {k: [] for k in KINDS}
    for round_ in range(reps + 1):  # round 0 warms up
        for kind in KINDS[round_ % 3:] + KINDS[: round_ % 3]:
            ids = rng.choice(rows, batch, replace=False)
            started = time.perf_counter()
            plan = a.plan()
            message = a.write(plan, ids)
            task_seconds = time.perf_counter() - started
            if kind != "alone":
                shared = ids[: batch // 100] if kind == "1% shared" else np.empty(0, dtype=np.int64)
                rest = np.setdiff1d(rng.choice(rows, other * 2, replace=False), ids)[: other - len(shared)]
                b.batch(np.concatenate([shared, rest]))
            started_commit = time.perf_counter()
            outcome = a.commit(plan, message)
            commit_seconds = time.perf_counter() - started_commit
            a.batch(rng.choice(rows, 1))  # untimed: A's index follows what just committed
            if round_:
                samples[kind].append({"task": task_seconds, "commit": commit_seconds, "batch": task_seconds + commit_seconds,
                                      "decided": outcome.keys_redecided})
    summary = {}
    for kind, rounds in samples.items():
        summary[kind] = {
            field: {"median": statistics.median(r[field] for r in rounds), "min": min(r[field] for r in rounds), "max": max(r[field] for r in rounds)}
            for field in ("task", "commit", "batch", "decided")
        }
    return {"rows": rows, "batch": batch, "other": other, "reps": reps, "samples": samples, "summary": summary,
            "ratio_1pct_vs_none": summary["1% shared"]["batch"]["median"] / summary["none shared"]["batch"]["median"],
            "ratio_1pct_vs_alone": summary["1% shared"]["batch"]["median"] / summary["alone"]["batch"]["median"]}


def write_report(result: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "redecide.json").write_text(json.dumps(result, indent=2))
    lines = [
        "# Deciding shared keys at commit: what it costs a keyed batch",
        "",
        f"Run {time.strftime('%Y-%m-%d')} (`python -m benchmarks redecide --rows {result['rows']} --batch {result['batch']} "
        f"--reps {result['reps']}`): a table of {result['rows']:,} keys, upserts of {result['batch']:,} random keys per batch; "
        f"the concurrent writer commits {result['other']:,} rows between the batch's task and its commit. "
        "Seconds, median (min-max) over the timed rounds; no Spark (the production write and commit path).",
        "",
        "| batch | keys decided at commit | task | commit | whole batch | vs none shared |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = result["summary"]["none shared"]["batch"]["median"]
    for kind in KINDS:
        s = result["summary"][kind]

        def cell(field: str, s: dict = s) -> str:
            return f"{s[field]['median']:.3f} ({s[field]['min']:.3f}-{s[field]['max']:.3f})"

        lines.append(f"| {kind} | {s['decided']['median']:.0f} | {cell('task')} | {cell('commit')} | {cell('batch')} | "
                     f"{s['batch']['median'] / base:.2f}x |")
    lines += [
        "",
        f"A batch deciding 1% of its keys costs **{result['ratio_1pct_vs_none']:.2f}x** one whose concurrent commit shares no key "
        f"(target at most 1.2x), and {result['ratio_1pct_vs_alone']:.2f}x one with no concurrent commit at all.",
    ]
    path = out / "REDECIDE.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main_args(rows: int, batch: int, reps: int, workdir: str | None, out: str | None) -> int:
    result = run(rows, batch, reps, Path(workdir or "/tmp/lakesink-redecide"))
    path = write_report(result, Path(out or "benchmark-results"))
    print(path.read_text())
    return 0
