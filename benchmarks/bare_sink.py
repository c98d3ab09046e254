"""The floor for a Python sink: a data source that writes Spark's Arrow batches to Parquet with
pyarrow and does nothing else (no table, no metadata, no commit).

Registered as format `bare_parquet` by the benchmarks. Each task gathers batches into row
groups of about ROW_GROUP_ROWS rows and writes one zstd Parquet file under the `path` option,
so it measures what Spark's transfer to a Python worker plus Parquet encoding cost, which is
the limit any Python sink (lakesink included) runs against.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

ROW_GROUP_ROWS = 1_000_000


class BareParquetSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bare_parquet"

    def writer(self, schema: StructType, overwrite: bool) -> BareParquetWriter:
        return BareParquetWriter(self.options["path"])


class BareParquetWriter(DataSourceArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        write_parquet(self.path, iterator)
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


def write_parquet(folder: str, batches: Iterator[pa.RecordBatch]) -> None:
    """One task's batches into one zstd Parquet file under `folder`, in row groups of about
    ROW_GROUP_ROWS rows (shared with the streaming pyarrow sink, benchmarks/stream_sinks.py)."""
    os.makedirs(folder, exist_ok=True)
    writer: pq.ParquetWriter | None = None
    pending: list[pa.RecordBatch] = []
    rows = 0
    location = os.path.join(folder, f"{uuid.uuid4().hex}.parquet")

    def flush() -> None:
        nonlocal writer, pending, rows
        table = pa.Table.from_batches(pending)
        if writer is None:
            writer = pq.ParquetWriter(location, table.schema, compression="zstd")
        writer.write_table(table, row_group_size=table.num_rows)
        pending, rows = [], 0

    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        if rows >= ROW_GROUP_ROWS:
            flush()
    if pending:
        flush()
    if writer is not None:
        writer.close()
