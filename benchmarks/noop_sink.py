"""Spark's floor for any Python sink: a data source that receives Spark's Arrow batches and
does nothing with them (no file, no table, no commit work).

Registered as format `noop_python` by the benchmarks. Timed beside lakesink on the same
cached input, it shows how much of a write is Spark's own (planning, scheduling, the
JVM's conversion of rows to Arrow, the Python workers' round trips) and so how much is
left for a sink: the keyed scenarios report lakesink's time above it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType


class NoopPythonSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noop_python"

    def writer(self, schema: StructType, overwrite: bool) -> NoopPythonWriter:
        return NoopPythonWriter()


class NoopPythonWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:  # every batch is transferred, as to a real sink
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass
