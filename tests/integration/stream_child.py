"""A streaming job in its own process, so a test can SIGKILL it mid-flight and restart it.

usage: stream_child.py SOURCE CHECKPOINT WAREHOUSE TABLE [extra option=value ...]
Runs the query with trigger(availableNow=True), one input file per micro-batch; with
route=N the rows go through cluster_by_key(df, "id", shards=N, **options). The environment's
STREAM_CHILD_SPARK_CONF ("key=value;...") adds session settings and STREAM_CHILD_PYSPARK_PYTHON
sets Spark's Python; with either, the job prints the Python daemons it left running (their
command lines, and whether each has lakesink's modules loaded) before it stops.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = os.environ.get("STREAM_CHILD_PYSPARK_PYTHON") or sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def session():  # type: ignore[no-untyped-def]
    """The child job's local[2] session with lakesink registered (routed_child.py's too)."""
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource
    from lakesink_datasource.spark_version import register_replaces_found

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for item in filter(None, os.environ.get("STREAM_CHILD_SPARK_CONF", "").split(";")):
        builder = builder.config(*item.split("=", 1))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register_replaces_found():  # PySpark 4.0 refuses it: lakesink is found by name there
        spark.dataSource.register(LakeSinkDataSource)
    return spark


def main(source: str, checkpoint: str, warehouse: str, table: str, *extra: str) -> None:
    spark = session()
    options = {"warehouse": warehouse, "table": table, **dict(item.split("=", 1) for item in extra)}
    df = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).parquet(source)
    shards = options.pop("route", None)
    if shards is not None:
        # route=N: keyed writes through cluster_by_key, the write's options given to it alone.
        from lakesink_datasource import cluster_by_key

        writer = cluster_by_key(df, "id", shards=int(shards), **options).writeStream.format("lakesink")
    else:
        writer = df.writeStream.format("lakesink").options(**options)
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    if os.environ.get("STREAM_CHILD_SPARK_CONF") or os.environ.get("STREAM_CHILD_PYSPARK_PYTHON"):
        print("daemons:", *_python_daemons(), sep="\n")
    spark.stop()


def _python_daemons() -> list[str]:
    """The Python daemons of this job running now (Spark keeps them until it stops): each
    one's command line, then " | lakesink loaded" when the daemon itself has msgspec's library
    mapped (every lakesink role imports msgspec, PySpark never does; Spark's own daemon imports
    its worker modules only in the workers it forks). A forked worker shares its daemon's
    command line; it is told apart by its parent."""
    session = os.getsid(0)
    lines = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != session:
                continue  # another job's
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/maps") as f:
                loaded = "/msgspec/" in f.read()
        except (OSError, ProcessLookupError):
            continue
        if "-m" in words and any(w.endswith("daemon") for w in words):
            lines[pid] = (parent, " ".join(words).strip(), loaded)
    return [line + (" | lakesink loaded" if loaded else "") for parent, line, loaded in lines.values()
            if parent not in lines or lines[parent][1] != line]


if __name__ == "__main__":
    main(*sys.argv[1:])
