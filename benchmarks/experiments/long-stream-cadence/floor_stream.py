"""Spark's floor for the long stream: the same rate-micro-batch source and columns into a Python
streaming sink that only consumes its input (usage: python floor_stream.py BATCHES). Prints the
addBatch medians of the first and last 10% of batches, and per 100 batches."""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.streaming import StreamingQueryListener


class NullWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class NullSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "nullsink"

    def streamWriter(self, schema: Any, overwrite: bool) -> NullWriter:
        return NullWriter()


class AddBatchTimes(StreamingQueryListener):
    def __init__(self) -> None:
        self.by_batch: dict[int, int] = {}
        self.changed = threading.Condition()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.numInputRows:
            with self.changed:
                self.by_batch[progress.batchId] = progress.durationMs.get("addBatch", 0)
                self.changed.notify_all()


def main(batches: int) -> None:
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NullSink)
    times = AddBatchTimes()
    spark.streams.addListener(times)
    source = (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 2000).option("numPartitions", 2).load()
        .select((F.col("value") % 50000).alias("id"), F.col("value").alias("version"), F.col("timestamp").alias("ts"),
                F.concat(F.lit("payload-"), F.col("value").cast("string")).alias("payload"))
    )
    query = (
        source.writeStream.format("nullsink").option("checkpointLocation", f"/tmp/floor-cp-{time.time()}")
        .trigger(processingTime="0 seconds").start()
    )
    with times.changed:
        while len(times.by_batch) < batches:
            times.changed.wait(5)
    query.stop()
    ms = [times.by_batch[b] for b in sorted(times.by_batch)][:batches]
    tenth = len(ms) // 10
    print("first", statistics.median(ms[:tenth]), "last", statistics.median(ms[-tenth:]))
    for start in range(0, batches, 100):
        print(start, statistics.median(ms[start : start + 100]))


if __name__ == "__main__":
    main(int(sys.argv[1]))
