"""lakesink's own modules with bytecode and without, each side a fresh process.

`python benchmarks/experiments/lakesink-bytecode/run.py [REPS]` (from the project's folder,
with `.venv`, after `python -m benchmarks stream-append --fresh` has made its source folder)
alternates three sides REPS times: the dropping sink; lakesink with no `.pyc` of its own
modules (what an editable install under PYTHONDONTWRITEBYTECODE=1 leaves: every Python process
Spark starts compiles what it imports); lakesink compiled (`compileall`, what a wheel's install
and scripts/setup.sh leave). Each side is `python -m benchmarks.stream_append one`: one
`availableNow` stream of 5 x 1M rows in a process of its own. It also times importing the
modules of lakesink's four roles in a fresh interpreter, each way. Leaves the modules compiled.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "lakesink_datasource"
SOURCE = Path("/tmp/lakesink-stream-append/source-5x1000000")
ROLE_MODULES = ("import pyspark.sql.types, pyarrow; import lakesink_datasource.datasource, lakesink_datasource.table.setup, "
                "lakesink_datasource.commit.committer, lakesink_datasource.write.task")


def _uncompiled() -> None:
    for cache in PACKAGE.rglob("__pycache__"):
        shutil.rmtree(cache)


def _compiled() -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(PACKAGE)], check=True, stdout=subprocess.DEVNULL)


def _fresh_job(side: str) -> tuple[float, float]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.harness import worker_environment

    worker_environment(Path("/tmp/lakesink-bytecode-events.jsonl"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.stream_append", "one", side, str(SOURCE), f"/tmp/lakesink-bytecode-{side}"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["seconds"], result["batch_ms"][0] / 1000


def _imports() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", ROLE_MODULES], check=True, cwd="/")
    return time.perf_counter() - started


def main(reps: int) -> None:
    jobs: dict[str, list[tuple[float, float]]] = {"null": [], "lakesink, no bytecode": [], "lakesink, compiled": []}
    imports: dict[str, list[float]] = {"no bytecode": [], "compiled": []}
    for _ in range(reps):
        jobs["null"].append(_fresh_job("null"))
        _uncompiled()
        imports["no bytecode"] += [_imports() for _ in range(3)]
        _uncompiled()
        jobs["lakesink, no bytecode"].append(_fresh_job("lakesink"))
        _compiled()
        imports["compiled"] += [_imports() for _ in range(3)]
        jobs["lakesink, compiled"].append(_fresh_job("lakesink"))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {reps} alternating runs a side, medians (min-max)")
    floor = statistics.median(s for s, _ in jobs["null"])
    for side, runs in jobs.items():
        seconds, first = [s for s, _ in runs], [f for _, f in runs]
        med = statistics.median(seconds)
        print(f"5 x 1M fresh job, {side}: {med:.2f} s ({min(seconds):.2f}-{max(seconds):.2f}), first batch {statistics.median(first):.2f} s, "
              f"{floor / med:.2f}x the dropping sink; runs {', '.join(f'{s:.2f}' for s in seconds)}")
    for way, runs in imports.items():
        print(f"the four roles' modules in a fresh interpreter, {way}: {statistics.median(runs):.2f} s ({min(runs):.2f}-{max(runs):.2f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
