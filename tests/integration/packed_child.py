"""A driver whose cluster's workers have no lakesink: the executors run Python from a packed
environment shipped with `spark.archives` (how docs/deploy.md says to run on a cluster).

usage: packed_child.py MASTER ARCHIVE WAREHOUSE SOURCE CHECKPOINT OUT_JSON
Writes a batch append into db.batch and runs a keyed upsert stream (availableNow, one file a
micro-batch) into db.keyed; reports which Python the executors ran to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys


def main(master: str, archive: str, warehouse: str, source: str, checkpoint: str, out: str) -> None:
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource
    from lakesink_datasource.spark_version import register_replaces_found

    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "768m")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        # The executors unpack the archive into ./environment and run its Python (PYSPARK_PYTHON
        # is ./environment/bin/python in this process's environment).
        .config("spark.archives", f"{archive}#environment")
        # The JVM options tests/conftest.py gives every driver (the class archive, C1 only).
        .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if register_replaces_found():  # PySpark 4.0 refuses it: lakesink is found by name there
        spark.dataSource.register(LakeSinkDataSource)
    executors = spark.sparkContext.parallelize(range(4), 2).map(lambda _: __import__("sys").executable).distinct().collect()

    spark.range(0, 1000).selectExpr("id", "concat('v', id) AS v").write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.batch")
    df = spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1).parquet(source)
    query = (
        df.repartition(2, "id").writeStream.format("lakesink").option("checkpointLocation", checkpoint)
        .option("warehouse", warehouse).option("table", "db.keyed").option("operation", "upsert").option("primary_key", "id")
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    with open(out, "w") as f:
        json.dump({"executor_pythons": executors}, f)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:7])
