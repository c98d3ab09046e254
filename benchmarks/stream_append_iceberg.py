"""Iceberg Java's own Spark sink on the stream-append cases (run by benchmarks/stream_append.py
with the readers' Spark 3.5 venv, never imported by lakesink's code).

argv: source folder, scratch folder, reps, Iceberg's Spark runtime jar, its shaded Jackson jar.
Prints one JSON list: the wall time of each timed run (after one untimed warm-up run).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def main(source: str, work: str, reps: int, jar: str, jackson: str) -> None:
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.types import from_arrow_schema

    root = Path(work)
    shutil.rmtree(root, ignore_errors=True)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("stream-append-iceberg")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.jars", f"{jar},{jackson}")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.catalog.bench", "org.apache.iceberg.spark.SparkCatalog")
        .config("spark.sql.catalog.bench.type", "hadoop")
        .config("spark.sql.catalog.bench.warehouse", str(root / "warehouse"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    schema = from_arrow_schema(pq.read_schema(next(Path(source).iterdir())))
    times = []
    for run in range(reps + 1):
        table = f"bench.db.events{run}"
        columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
        spark.sql(f"CREATE TABLE {table} ({columns}) USING iceberg TBLPROPERTIES ('format-version'='3')")
        stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
        started = time.perf_counter()
        query = (stream.writeStream.format("iceberg").outputMode("append").trigger(availableNow=True)
                 .option("checkpointLocation", str(root / f"checkpoint{run}")).toTable(table))
        query.awaitTermination()
        if run > 0:  # the first run warms the JVM
            times.append(time.perf_counter() - started)
    spark.stop()
    print(json.dumps(times))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
