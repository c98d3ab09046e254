"""A history stream in its own process, so a test can SIGKILL it and restart.

usage: history_child.py SOURCE CHECKPOINT WAREHOUSE [extra option=value ...]
Reads Parquet files of changes (id, v, op, seq), one file per micro-batch with
trigger(availableNow=True), into `db.hist` with operation=cdc, sequence_column=seq and
history=true.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def main(source: str, checkpoint: str, warehouse: str, *extra: str) -> None:
    from stream_child import session

    spark = session()
    options = {
        "warehouse": warehouse, "table": "db.hist", "operation": "cdc", "primary_key": "id", "op_column": "op",
        "sequence_column": "seq", "history": "true", **dict(item.split("=", 1) for item in extra),
    }
    df = spark.readStream.schema("id long, v string, op string, seq long").option("maxFilesPerTrigger", 1).parquet(source)
    # Each key's changes in one task, as a Kafka partition keeps them.
    query = df.repartition(2, "id").writeStream.format("lakesink").options(**options).option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
