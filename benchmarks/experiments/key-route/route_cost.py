"""What does each form of a sticky key route cost per micro-batch, against today's route?

Forms (each into a Python streaming sink that drops what it gets, local[2]):
- `plain`: `repartition(P, shard)` then the sink (today's route: no placement kept);
- `passthrough`: `groupBy(shard).applyInPandasWithState` yielding its input unchanged, then
  the sink (rows cross into Python twice, and back to the JVM once, as pandas);
- `inside`: the same operator doing the sink's part itself: each group's pandas frames are
  turned back into Arrow (what a keyed task would then write) and one small row per group
  goes on to the sink (rows cross into Python once);
- `inside-keys`: as `inside`, but only the key and the shard pass through pandas: measures
  what the other columns cost in the pandas conversion.

A stream over a folder of Parquet files, one file (ROWS rows of id, v, s) per micro-batch;
mean `triggerExecution` of batches 1..5 (batch 0 warms up), each form run twice, interleaved.
Usage: PYTHONPATH=. .venv/bin/python benchmarks/experiments/key-route/route_cost.py WORK ROWS PARTITIONS [conf=value ...]
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FORMS = ("plain", "passthrough", "inside", "inside-keys")


def make_source(work: Path, rows: int) -> Path:
    src = work / f"src{rows}"
    if not src.exists():
        src.mkdir(parents=True)
        for i in range(6):
            ids = np.random.default_rng(i).integers(0, 10_000_000, rows)
            table = pa.table({"id": ids, "v": np.full(rows, i), "s": pa.array([f"name-{x}" for x in ids])})
            pq.write_table(table, src / f"f{i}.parquet")
    return src


def main() -> None:
    work, rows, partitions = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    confs = dict(arg.split("=", 1) for arg in sys.argv[4:])
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    src = make_source(work, rows)

    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from benchmarks.stream_sinks import NullStreamSink

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
    )
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NullStreamSink)

    def passthrough(key: tuple, pdfs: Iterator[pd.DataFrame], state: object) -> Iterator[pd.DataFrame]:
        yield from pdfs

    def inside(key: tuple, pdfs: Iterator[pd.DataFrame], state: object) -> Iterator[pd.DataFrame]:
        n = 0
        for pdf in pdfs:
            n += pa.RecordBatch.from_pandas(pdf, preserve_index=False).num_rows
        yield pd.DataFrame({"shard": [int(key[0])], "rows": [n]})

    results: dict[str, list[float]] = {}
    for form in FORMS * 2:
        df = spark.readStream.schema("id long, v long, s string").option("maxFilesPerTrigger", 1).parquet(str(src))
        df = df.withColumn("shard", F.pmod(F.xxhash64("id"), F.lit(partitions)).cast("int"))
        if form == "plain":
            out = df.repartition(partitions, "shard")
        elif form == "passthrough":
            out = df.groupBy("shard").applyInPandasWithState(
                passthrough, "id long, v long, s string, shard int", "x int", "append", GroupStateTimeout.NoTimeout
            )
        else:
            grouped = df.select("id", "shard") if form == "inside-keys" else df
            out = grouped.groupBy("shard").applyInPandasWithState(
                inside, "shard int, rows long", "x int", "append", GroupStateTimeout.NoTimeout
            )
        chk = work / f"chk-{form}-{time.time()}"
        query = out.writeStream.format("null_stream").option("checkpointLocation", str(chk)).trigger(availableNow=True).start()
        query.awaitTermination()
        durations = [p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"] > 0][1:]
        results.setdefault(form, []).append(sum(durations) / len(durations))
    spark.stop()
    plain = min(results["plain"])
    print(
        json.dumps(
            {
                "rows_per_batch": rows,
                "partitions": partitions,
                "conf": confs,
                "ms_per_batch": {k: [round(x) for x in v] for k, v in results.items()},
                "x_plain_best": {k: round(min(v) / plain, 2) for k, v in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
