"""The two floors of a Python streaming sink, beside which `stream-append` times lakesink.

- `null_stream`: receives every micro-batch's Arrow batches and drops them. Nothing a Python
  sink can do is cheaper: what it costs is Spark's (planning, scheduling, the JVM's
  conversion of rows to Arrow, the transfer to a Python worker, the commit's round trip).
- `pyarrow_stream`: writes each task's batches to one zstd Parquet file with pyarrow, as the
  batch floor sink does (`bare_sink.write_parquet`), and nothing else (no table, no metadata,
  no commit).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from benchmarks.bare_sink import write_parquet


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
        write_parquet(self.path, iterator)
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

