"""Spark's Python daemons with lakesink imported before they fork: the `lakesink-python`
interpreter.

Spark runs every Python role of a write in a worker forked from a daemon of its own
(`python -m pyspark.daemon <worker module>`, started once per session and kept), and closes a
worker idle for 60 seconds (a constant in Spark's `PythonWorkerFactory`). A stream triggered
a minute or more apart therefore forks its planner, task and commit workers anew on every
batch, and each would import its share of lakesink again. With the `lakesink-python` script
(installed with the package) as Spark's Python,

    PYSPARK_PYTHON=/path/to/venv/bin/lakesink-python    (spark-submit: --conf spark.pyspark.python=...)

each daemon imports, before it starts forking, the lakesink modules its worker module runs,
and every worker forked from it starts with them. It reaches the driver-side daemons (write
planning, commit) as well as the executors', which `spark.python.daemon.module` does not.
Anything else the script is asked to run is handed to the interpreter unchanged (the script,
bin/lakesink-python, decides that before importing anything). Only writes are
preloaded: the daemons that plan a read, run a streaming read's source or look sources up run
as Spark's own do (their workers import what they need after the fork).

Only modules are imported here: no file or connection is opened. Spark's own daemon imports
worker modules only after each fork, because pandas and pyarrow may start threads at import.
At these imports two native threads start: jemalloc's background thread (pyarrow) and
OpenBLAS's thread server (numpy); both libraries hold their locks across a fork by their own
fork handlers, so a forked worker starts clean (lakesink's worker_daemon has relied on the same
since it was added; tests/integration/test_exactly_once.py runs streams through both).
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Sequence

# Spark's worker module (the daemon's argument) -> the lakesink modules that worker imports.
_DRIVER_WRITE = (
    "lakesink_datasource.datasource",
    "lakesink_datasource.options",
    "lakesink_datasource.table.setup",
    "lakesink_datasource.routing.route_plan",
    "lakesink_datasource.catalog.loader",
    "lakesink_datasource.catalog.embedded",
)
_DRIVER_COMMIT = (
    *_DRIVER_WRITE,
    "lakesink_datasource.catalog.transient",
    "lakesink_datasource.commit.committer",
    "lakesink_datasource.commit.new_checkpoint",
    "lakesink_datasource.maintenance.after_batch",
    "lakesink_datasource.maintenance.background",
    "lakesink_datasource.maintenance.compaction",
    "lakesink_datasource.maintenance.tombstone_storing",
    "lakesink_datasource.messages",
    "lakesink_datasource.progress",
    "lakesink_datasource.routing.route_commit",
)
MODULES_FOR_WORKER: dict[str, tuple[str, ...]] = {
    "pyspark.worker": ("lakesink_datasource.write.task", "lakesink_datasource.routing.route_task"),
    "pyspark.sql.worker.create_data_source": ("lakesink_datasource.datasource",),
    "pyspark.sql.worker.write_into_data_source": _DRIVER_WRITE,
    "pyspark.sql.worker.python_streaming_sink_runner": _DRIVER_COMMIT,
    "pyspark.sql.worker.commit_data_source_write": _DRIVER_COMMIT,
}


def preload(worker_module: str) -> list[str]:
    """Import what a worker of `worker_module` would import of lakesink (and the worker module
    itself, as Spark's executor daemon would after each fork). Returns the modules imported."""
    names = [worker_module, *MODULES_FOR_WORKER.get(worker_module, ())]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            # A worker module this PySpark minor lacks: its workers are never asked for.
            if name.startswith("lakesink_datasource"):
                raise
    return names


def run_daemon(argv: Sequence[str]) -> None:
    """`python -m pyspark.daemon *argv`, after importing what its workers will run."""
    worker_module = argv[0] if argv and argv[0].startswith("pyspark") else "pyspark.worker"
    sys.path[0] = os.getcwd()  # as `python -m` sets it (the script's folder otherwise)
    try:
        preload(worker_module)
    except Exception as exc:  # noqa: BLE001  # the daemon serves every Python job of the session
        # A lakesink that cannot import here (a missing dependency, an unsupported pyiceberg)
        # must not take Spark's daemon down with it: its workers then import it themselves,
        # after the fork, and a lakesink write fails there with lakesink's own error.
        print(f"lakesink-python: nothing preloaded for {worker_module}: {exc!r}", file=sys.stderr)
    sys.argv = ["pyspark.daemon", *argv]
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)

