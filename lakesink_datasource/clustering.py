"""Cluster a DataFrame's rows by the Iceberg partition they will land in, before a write.

Spark hands each task whatever rows its upstream partitioning gave it, so every task of a
batch writes a small file into every table partition it meets: T tasks x P partitions
files per batch. Shuffling rows by their Iceberg partition first (as the RisingWave and
Iceberg Java sinks do with `write.distribution-mode=hash`) sends each partition to one task,
so a batch writes about one file per partition. The partition is computed exactly as the
writer computes it (same transforms, same code), in a `mapInArrow` step, and only its hash is
kept as the shuffle key.
"""

from __future__ import annotations

import importlib.util
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.options import parse_options
from lakesink_datasource.schema.arrow_align import BatchAligner, table_arrow_schema
from lakesink_datasource.table.setup import write_layout

PARTITION_HASH = "__lakesink_partition_hash"


def cluster_by_partition(df: Any, table: str, num_partitions: int | None = None, **options: str) -> Any:
    """`df` shuffled so that the rows of each Iceberg partition of `table` are in one Spark
    partition. `options` are the write's options (warehouse, catalog, `partition_by` for a
    table not created yet, `op_column`); `num_partitions` defaults to
    `spark.sql.shuffle.partitions`. Unpartitioned tables get `df` back unchanged. Works on
    streaming DataFrames too."""
    from pyspark.sql.types import LongType, StructField, StructType

    if importlib.util.find_spec("pandas") is None:  # PySpark's mapInArrow refuses to run without it
        raise ImportError(
            "cluster_by_partition needs pandas (PySpark's mapInArrow requires it): pip install 'lakesink-datasource[cluster]'"
        )
    schema, spec, sources = write_layout(parse_options({"table": table, **options}), df.schema)
    if spec.is_unpartitioned():
        return df

    def tag(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        splitter = PartitionSplitter(spec, schema)
        aligner = BatchAligner(table_arrow_schema(schema), sources, defaults=[f.write_default for f in schema.fields])
        for batch in batches:
            hashes = np.zeros(batch.num_rows, dtype=np.int64)
            for key, rows in splitter.split_rows(aligner.align(batch)):
                hashes[rows] = zlib.crc32(repr(key).encode())
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(hashes)], names=[*batch.schema.names, PARTITION_HASH])

    tagged = df.mapInArrow(tag, StructType([*df.schema.fields, StructField(PARTITION_HASH, LongType(), False)]))
    shuffled = tagged.repartition(num_partitions, PARTITION_HASH) if num_partitions else tagged.repartition(PARTITION_HASH)
    return shuffled.drop(PARTITION_HASH)
