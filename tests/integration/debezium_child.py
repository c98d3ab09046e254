"""A Debezium stream into its replicas in its own process, so a test can SIGKILL it and restart.

usage: debezium_child.py SOURCE CHECKPOINT WAREHOUSE [extra option=value ...]
Reads Parquet files of Kafka records (key, value, topic, partition, offset: the columns
Spark's Kafka source gives), one file per micro-batch with trigger(availableNow=True), with
cdc_format=debezium into namespace `replica`.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

KAFKA = "key binary, value binary, topic string, partition int, offset long"


def main(source: str, checkpoint: str, warehouse: str, *extra: str) -> None:
    # The directory of this script is on sys.path when it runs as one.
    from stream_child import session

    spark = session()
    options = {"warehouse": warehouse, "cdc_format": "debezium", "namespace": "replica", **dict(item.split("=", 1) for item in extra)}
    df = spark.readStream.schema(KAFKA).option("maxFilesPerTrigger", 1).parquet(source)
    query = df.writeStream.format("lakesink").options(**options).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
