"""What each of the Python processes Spark starts for a lakesink stream imports, in seconds.

Spark runs a Python data source's planning (`streamWriter()`), its tasks and its commit in
three Python processes of their own, one after the other on a micro-batch's path, each
forked from a daemon that has imported only pyspark. A stream's first micro-batch in a fresh
application pays every role's imports; a sink that imports nothing (the dropping sink) pays
none. This script measures each role's imports in a fresh interpreter that starts from
what Spark's worker has already imported (pyspark's worker and data source modules, pyarrow
for the Arrow transfer), `--reps` times, and the largest packages under each.

    .venv/bin/python benchmarks/experiments/cold-start/role_imports.py [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

# What the role calls first, as datasource.py imports it.
ROLES = {
    "plan (streamWriter)": ["lakesink_datasource.datasource", "lakesink_datasource.table.setup"],
    "task (write)": ["lakesink_datasource.datasource", "lakesink_datasource.write.task"],
    "commit": ["lakesink_datasource.datasource", "lakesink_datasource.table.setup", "lakesink_datasource.commit.committer",
               "lakesink_datasource.maintenance.after_batch", "lakesink_datasource.maintenance.tombstone_storing",
               "lakesink_datasource.progress"],
}
GROUPS = ("pyiceberg", "pydantic", "sqlalchemy", "pandas", "numpy", "pyarrow", "lakesink_datasource")

_CHILD = """
import importlib, sys, time
import pyspark.daemon, pyspark.worker, pyspark.sql.datasource, pyspark.sql.pandas.serializers, pyarrow
before = set(sys.modules)
started = time.perf_counter()
for name in sys.argv[1:]:
    importlib.import_module(name)
print(time.perf_counter() - started, len(set(sys.modules) - before))
"""


def _once(modules: list[str]) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", _CHILD, *modules], capture_output=True, text=True, check=True)
    seconds, count = out.stdout.split()
    return float(seconds), int(count)


def _by_package(modules: list[str]) -> dict[str, float]:
    """Import time by top-level package (each module's own time, summed), from `-X importtime`:
    what is left after lakesink's own modules is what its dependencies cost."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", _CHILD, *modules], capture_output=True, text=True,
                         check=True)
    lines = [line for line in out.stderr.splitlines() if line.startswith("import time:") and "self [us]" not in line]
    # The worker's baseline ends with pyarrow's own import at the top level.
    start = max(i for i, line in enumerate(lines) if line.rstrip().endswith("| pyarrow")) + 1
    seen: dict[str, float] = {}
    for line in lines[start:]:
        own, _, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
        top = {"pydantic_core": "pydantic"}.get(name.split(".")[0], name.split(".")[0])
        group = top if top in GROUPS else "other"
        seen[group] = seen.get(group, 0.0) + int(own) / 1e6
    return seen


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print("| role | imports, s (median) | runs | modules | by package (own import time, s, one run) |")
    print("|---|---|---|---|---|")
    total = 0.0
    for role, modules in ROLES.items():
        runs = [_once(modules) for _ in range(args.reps)]
        median = statistics.median(s for s, _ in runs)
        total += median
        packages = ", ".join(f"{k} {v:.2f}" for k, v in sorted(_by_package(modules).items(), key=lambda kv: -kv[1]))
        print(f"| {role} | {median:.2f} | {', '.join(f'{s:.2f}' for s, _ in runs)} | {runs[0][1]} | {packages} |")
    print(f"\nOne after the other on a fresh application's first micro-batch: {total:.2f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
