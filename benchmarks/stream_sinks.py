"""The two floors of a Python streaming sink, beside which `stream-append` times lakesink.

- `null_stream`: receives every micro-batch's Arrow batches and drops them. Nothing a Python
  sink can do is cheaper: what it costs is Spark's (planning, scheduling, the JVM's
  conversion of rows to Arrow, the transfer to a Python worker, the commit's round trip).
- `pyarrow_stream`: writes each task's batches to one zstd Parquet file with pyarrow, as the
  batch floor sink does (`bare_sink.write_parquet`), and nothing else (no table, no metadata,
  no commit).
- `drop_rows_stream`: a `DataSourceStreamWriter` (Rows, not Arrow) that drops every Row: the
  floor of a row-based Python stream sink, the only kind PySpark 4.0 has (`minors` times
  lakesink on 4.0 beside it).

PySpark 4.0 has no `DataSourceStreamArrowWriter`: there the two Arrow sinks would be handed
Rows, so `STREAM_ARROW` says whether they are what their names say (`minors` leaves them out
on 4.0); this module still imports, for the row sink.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from benchmarks.bare_sink import write_parquet

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter

    STREAM_ARROW = True
except ImportError:  # PySpark 4.0: stream sinks get Rows (see the module's docstring)
    from pyspark.sql.datasource import DataSourceStreamWriter as DataSourceStreamArrowWriter  # type: ignore[assignment]

    STREAM_ARROW = False


class _NothingToCommit:
    """A floor sink's commit and abort: nothing (the driver's round trip is what they cost)."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class NullStreamSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "null_stream"

    def streamWriter(self, schema: StructType, overwrite: bool) -> NullStreamWriter:
        return NullStreamWriter()


class NullStreamWriter(_NothingToCommit, DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:  # every batch is transferred, as to a real sink
            pass
        return WriterCommitMessage()


class PyarrowStreamSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pyarrow_stream"

    def streamWriter(self, schema: StructType, overwrite: bool) -> PyarrowStreamWriter:
        return PyarrowStreamWriter(self.options["path"])


class PyarrowStreamWriter(_NothingToCommit, DataSourceStreamArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        write_parquet(self.path, iterator)
        return WriterCommitMessage()


class DropRowsStreamSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "drop_rows_stream"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DropRowsStreamWriter:
        return DropRowsStreamWriter()


class DropRowsStreamWriter(_NothingToCommit, DataSourceStreamWriter):
    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        for _ in iterator:  # every Row is built and handed over, as to a real row sink
            pass
        return WriterCommitMessage()
