"""A stream routed to many tables in its own process, so a test can SIGKILL it and restart.

usage: routed_child.py SOURCE CHECKPOINT WAREHOUSE [extra option=value ...]
Reads Parquet files of CDC events (tbl, op, seq, after: the row as JSON), one file per
micro-batch with trigger(availableNow=True), into the tables `tbl` names: cdc keyed by id
with sequence column seq, new tables created and new columns added as they come. `route=N`
clusters each table's keys into N shards with cluster_by_key.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def main(source: str, checkpoint: str, warehouse: str, *extra: str) -> None:
    # The directory of this script is on sys.path when it runs as one.
    from stream_child import session

    spark = session()
    options = {
        "warehouse": warehouse, "table_column": "tbl", "namespace": "cdc", "payload_column": "after",
        "operation": "cdc", "op_column": "op", "sequence_column": "seq", "primary_key": "id", "merge_schema": "true",
        **dict(item.split("=", 1) for item in extra),
    }
    df = spark.readStream.schema("tbl string, op string, seq long, after string").option("maxFilesPerTrigger", 1).parquet(source)
    shards = options.pop("route", None)
    if shards is not None:
        # route=N: each table's keys clustered into N shards (cluster_by_key), the options given to it alone.
        from lakesink_datasource import cluster_by_key

        df, options = cluster_by_key(df, shards=int(shards), **options), {}
    query = df.writeStream.format("lakesink").options(**options).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
