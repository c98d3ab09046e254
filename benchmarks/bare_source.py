"""The floor for a Python reader: a data source that reads Parquet files with pyarrow and
hands Spark the Arrow batches, nothing else (no table, no deletes, no planning).

Registered as format `bare_parquet_read` by the benchmarks; option `paths` is a
comma-separated list of files, one Spark partition per file. What it costs over Spark's
own Parquet reader is Spark's transfer of a Python source's Arrow batches into the JVM, the
limit lakesink's reader runs against.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType


class BareParquetSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bare_parquet_read"

    def reader(self, schema: StructType) -> BareParquetReader:
        return BareParquetReader(self.options["paths"].split(","), schema)


class BareParquetReader(DataSourceReader):
    def __init__(self, paths: list[str], schema: StructType) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.paths = paths
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(p) for p in self.paths]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for batch in pq.ParquetFile(partition.value).iter_batches(batch_size=131_072):
            yield pa.RecordBatch.from_arrays([batch.column(f.name).cast(f.type) for f in self.arrow_schema], schema=self.arrow_schema)
