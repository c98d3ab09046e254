"""Scenario 5's CDC batches through Spark, two versions of lakesink side by side in one run.

    python benchmarks/experiments/cdc-phases/compare.py BEFORE_REV [batches]

Checks BEFORE_REV out into a git worktree, runs run.py (this version's script, which only
uses lakesink's public pieces) once with the worktree's lakesink and once with this
checkout's, one after the other on the same machine, and writes COMPARE.md here: rows/s,
p50/p99/max batch latency and the per-phase medians of both, with ratios.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def side(root: Path, batches: int, out: Path) -> list[dict]:
    # The script runs from `root`, so the driver and (through harness.worker_environment)
    # Spark's Python workers import that tree's lakesink_datasource first.
    script = root / "benchmarks" / "experiments" / "cdc-phases" / "run.py"
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, str(script), str(batches), str(out)], check=True, env=env, cwd=root)
    return json.loads(out.read_text())


def summary(rows: list[dict]) -> dict[str, float]:
    whole = np.array([r["whole"] for r in rows])
    return {
        "rows/s": 100_000 * len(rows) / whole.sum(),
        "p50 s": float(np.percentile(whole, 50)),
        "p99 s": float(np.percentile(whole, 99)),
        "max s": float(whole.max()),
        "slower task p50 s": float(np.median([r["slower_task"] for r in rows])),
        "slower task max s": float(max(r["slower_task"] for r in rows)),
        "commit p50 s": float(np.median([r["commit"] for r in rows])),
    }


def main() -> None:
    before_rev = sys.argv[1]
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    tmp = Path(tempfile.mkdtemp(prefix="cdc-compare-"))
    tree = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), before_rev], check=True)
    try:
        shutil.copytree(HERE, tree / "benchmarks" / "experiments" / "cdc-phases", dirs_exist_ok=True)
        for helper in ("profiled_sink.py", "cdc_data.py"):  # the script's helpers, same on both sides
            shutil.copy(ROOT / "benchmarks" / helper, tree / "benchmarks" / helper)
        results = {"before": side(tree, batches, tmp / "before.json"), "after": side(ROOT, batches, tmp / "after.json")}
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    s = {k: summary(v) for k, v in results.items()}
    lines = [f"# CDC through Spark: {before_rev} (before) and {head} (after), one run, {batches} batches of 100K changes each", "",
             "| | before | after | after / before |", "|---|---|---|---|"]
    for key in s["before"]:
        b, a = s["before"][key], s["after"][key]
        fmt = ",.0f" if key == "rows/s" else ".3f"
        lines.append(f"| {key} | {b:{fmt}} | {a:{fmt}} | {a / b:.2f} |")
    lines += ["", "Per batch (whole write as the caller sees it, s):", "", "| batch | before | after |", "|---|---|---|"]
    for b, a in zip(results["before"], results["after"]):
        lines.append(f"| {int(b['batch'])} | {b['whole']:.2f} | {a['whole']:.2f} |")
    (HERE / "COMPARE.md").write_text("\n".join(lines) + "\n")
    (HERE / "compare.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
