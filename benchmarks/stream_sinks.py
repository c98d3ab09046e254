"""The two floors of a Python streaming sink, beside which `stream-append` times lakesink.

- `null_stream`: receives every micro-batch's Arrow batches and drops them. Nothing a Python
  sink can do is cheaper: what it costs is Spark's (planning, scheduling, the JVM's
  conversion of rows to Arrow, the transfer to a Python worker, the commit's round trip).
- `pyarrow_stream`: writes each task's batches to one zstd Parquet file with pyarrow, in row
  groups of about ROW_GROUP_ROWS rows, and nothing else (no table, no metadata, no commit).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

ROW_GROUP_ROWS = 1_000_000


class NullStreamSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "null_stream"

    def streamWriter(self, schema: StructType, overwrite: bool) -> NullStreamWriter:
        return NullStreamWriter()


class NullStreamWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:  # every batch is transferred, as to a real sink
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class PyarrowStreamSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pyarrow_stream"

    def streamWriter(self, schema: StructType, overwrite: bool) -> PyarrowStreamWriter:
        return PyarrowStreamWriter(self.options["path"])


class PyarrowStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        os.makedirs(self.path, exist_ok=True)
        writer: pq.ParquetWriter | None = None
        pending: list[pa.RecordBatch] = []
        rows = 0
        location = os.path.join(self.path, f"{uuid.uuid4().hex}.parquet")
        for batch in iterator:
            pending.append(batch)
            rows += batch.num_rows
            if rows >= ROW_GROUP_ROWS:
                writer = _flush(writer, location, pending)
                pending, rows = [], 0
        if pending:
            writer = _flush(writer, location, pending)
        if writer is not None:
            writer.close()
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


def _flush(writer: pq.ParquetWriter | None, location: str, pending: list[pa.RecordBatch]) -> pq.ParquetWriter:
    table = pa.Table.from_batches(pending)
    if writer is None:
        writer = pq.ParquetWriter(location, table.schema, compression="zstd")
    writer.write_table(table, row_group_size=table.num_rows)
    return writer
