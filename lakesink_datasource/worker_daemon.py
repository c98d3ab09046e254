"""Spark's executor daemon with lakesink's task side imported before it forks.

Spark starts one daemon per executor (`python -m pyspark.daemon`) and forks a worker from it
for each task; a worker idle for 60 seconds is closed (a constant in Spark's
`PythonWorkerFactory`), so a stream triggered a minute or more apart forks anew on every
batch and each new worker imports lakesink again. With

    spark.python.daemon.module=lakesink_datasource.worker_daemon

the daemon imports PySpark's worker and lakesink's task modules once, and every worker forked
from it starts with them. Spark honours the setting for executor tasks only: the planner and
the commit run in daemons of Spark's own (docs/performance.md, "Start-up").
"""

from __future__ import annotations

import pyspark.worker  # noqa: F401  # what every forked worker runs
from pyspark.daemon import manager

import lakesink_datasource.routing.route_task  # a routed write's task
import lakesink_datasource.write.task  # noqa: F401  # a write's task

if __name__ == "__main__":
    manager()
