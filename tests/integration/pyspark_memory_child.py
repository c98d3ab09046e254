"""Keyed writes in a Spark session of their own with spark.executor.pyspark.memory=1g: every
Python worker then runs under RLIMIT_AS (the shared test session cannot change it).

usage: pyspark_memory_child.py ROOT OUT_JSON SCENARIO...
Scenarios (tables under ROOT/warehouse, key indexes under ROOT/index):
- `upsert`, `cdc`: three batch writes of 4,000 rows whose keys come back (cdc: every fifth a
  delete, with a sequence column) into db.upsert / db.cdc;
- `routed`: two batch writes routed to 100 upsert tables (`table_column`, routed.t000 ..
  routed.t099), 20 rows per table each;
- `clustered`: a stream of 4 micro-batches through cluster_by_key (2 key shards) into
  db.clustered (upsert);
- `stream`: a keyed stream of 100 micro-batches of 10 rows (one Parquet file each,
  trigger availableNow) into db.stream (upsert).
Writes OUT_JSON: the RLIMIT_AS a Python worker saw, and the seconds each scenario took.
The rows each scenario writes come from `rows()` below, which the test's model reads too.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

ROUTED_TABLES = 100
STREAM_BATCHES = 100


def rows(scenario: str, batch: int) -> list[dict]:
    """The rows of one batch of `scenario`."""
    if scenario in ("upsert", "cdc"):
        out = []
        for i in range(4_000):
            row: dict = {"id": (batch * 1_500 + i) % 6_000, "name": f"{scenario}-b{batch}-{i}"}
            if scenario == "cdc":
                row |= {"op": "d" if i % 5 == 4 else "u", "seq": batch * 10_000 + i}
            out.append(row)
        return out
    if scenario == "routed":
        return [{"tbl": f"t{t:03d}", "id": (batch * 7 + i) % 30, "name": f"t{t}-b{batch}-{i}"} for t in range(ROUTED_TABLES) for i in range(20)]
    if scenario == "clustered":
        return [{"id": (batch * 37 + i) % 150, "name": f"c-b{batch}-{i}"} for i in range(100)]
    return [{"id": (batch * 3 + i) % 40, "name": f"s-b{batch}-{i}"} for i in range(10)]


BATCHES = {"upsert": 3, "cdc": 3, "routed": 2, "clustered": 4, "stream": STREAM_BATCHES}


def session():  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executor.pyspark.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LakeSinkDataSource)
    return spark


def _files(root: str, scenario: str) -> str:
    """One Parquet file per micro-batch, named and timed in batch order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(root, f"source-{scenario}")
    os.makedirs(folder)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    for b in range(BATCHES[scenario]):
        path = os.path.join(folder, f"{b:04d}.parquet")
        pq.write_table(pa.Table.from_pylist(rows(scenario, b), schema=schema), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
    return folder


def run(spark, root: str, scenario: str) -> None:  # type: ignore[no-untyped-def]
    base = {"warehouse": os.path.join(root, "warehouse"), "index_dir": os.path.join(root, "index")}
    if scenario in ("upsert", "cdc"):
        options = {**base, "table": f"db.{scenario}", "operation": scenario, "primary_key": "id"}
        schema = "id long, name string"
        if scenario == "cdc":
            options |= {"op_column": "op", "sequence_column": "seq"}
            schema += ", op string, seq long"
        for b in range(BATCHES[scenario]):
            spark.createDataFrame(rows(scenario, b), schema).write.format("lakesink").options(**options).mode("append").save()
    elif scenario == "routed":
        options = {**base, "table_column": "tbl", "namespace": "routed", "operation": "upsert", "primary_key": "id"}
        for b in range(BATCHES[scenario]):
            df = spark.createDataFrame(rows(scenario, b), "tbl string, id long, name string").repartition(2)
            df.write.format("lakesink").options(**options).mode("append").save()
    elif scenario == "clustered":
        from lakesink_datasource import cluster_by_key

        source = _files(root, scenario)
        df = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).parquet(source)
        query = (
            cluster_by_key(df, "id", shards=2, table="db.clustered", operation="upsert", **base)
            .writeStream.format("lakesink").option("checkpointLocation", os.path.join(root, "checkpoint-clustered"))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination()
    else:
        source = _files(root, scenario)
        query = (
            spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).parquet(source)
            .writeStream.format("lakesink").options(**base, table="db.stream", operation="upsert", primary_key="id")
            .option("checkpointLocation", os.path.join(root, "checkpoint-stream")).trigger(availableNow=True).start()
        )
        query.awaitTermination()


def worker_limit(spark) -> int:  # type: ignore[no-untyped-def]
    """RLIMIT_AS as a Python worker of this session has it."""

    def limit(_rows):  # type: ignore[no-untyped-def]
        import resource

        yield resource.getrlimit(resource.RLIMIT_AS)[0]

    return int(spark.sparkContext.parallelize([0], 1).mapPartitions(limit).collect()[0])


def main(root: str, out: str, *scenarios: str) -> None:
    spark = session()
    report: dict = {"worker_limit": worker_limit(spark), "seconds": {}}
    for scenario in scenarios:
        started = time.perf_counter()
        run(spark, root, scenario)
        report["seconds"][scenario] = round(time.perf_counter() - started, 1)
    with open(out, "w") as f:
        json.dump(report, f)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
