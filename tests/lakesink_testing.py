"""Shared helpers for the tests: independent readers (DuckDB, pyiceberg) and table access."""

from __future__ import annotations

import importlib.metadata
import os
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

import lakesink_datasource  # noqa: F401  (v3 metadata support for pyiceberg)
from lakesink_datasource import duckdb_reader


def _installed_pyspark_minor() -> tuple[int, int]:
    """The installed PySpark's minor, from its package metadata: what a test expects of a
    minor comes from here, never from lakesink's own reading of what Spark offers."""
    major, minor = importlib.metadata.version("pyspark").split(".")[:2]
    return int(major), int(minor)


PYSPARK_MINOR = _installed_pyspark_minor()


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """DuckDB with the iceberg + avro extensions loaded from the PyPI packages, no autoload."""
    return duckdb_reader.connect()


def embedded_catalog(warehouse: str) -> SqlCatalog:
    return SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")


def load(warehouse: str, identifier: str) -> Table:
    return embedded_catalog(str(warehouse)).load_table(identifier)


def table_exists(warehouse: str, identifier: str) -> bool:
    """Whether the embedded catalog under `warehouse` holds `identifier` (no catalog: no table)."""
    if not os.path.exists(os.path.join(str(warehouse), "catalog.db")):
        return False
    try:
        load(warehouse, identifier)
    except NoSuchTableError:
        return False
    return True


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _normalise(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def rows(table: pa.Table, columns: Sequence[str]) -> Counter:
    """A multiset of row tuples, so comparisons ignore order but not duplicates."""
    data = table.select(list(columns)).to_pylist()
    return Counter(tuple(_normalise(r[c]) for c in columns) for r in data)


def duckdb_rows(metadata_location: str, columns: Sequence[str]) -> Counter:
    con = duckdb_connection()
    cols = ", ".join(f'"{c}"' for c in columns)
    result = con.execute(f"SELECT {cols} FROM iceberg_scan('{metadata_location}')").to_arrow_table()
    return rows(result, columns)


def pyiceberg_rows(table: Table, columns: Sequence[str]) -> Counter:
    return rows(table.scan().to_arrow(), columns)


def expected_rows(records: Iterable[dict], columns: Sequence[str]) -> Counter:
    return rows(pa.Table.from_pylist(list(records)), columns) if records else Counter()


def assert_readers_see(warehouse: str, identifier: str, expected: Counter, columns: Sequence[str]) -> None:
    """DuckDB and pyiceberg (two readers sharing no code with lakesink) see exactly `expected`."""
    table = load(warehouse, identifier)
    assert pyiceberg_rows(table, columns) == expected, "pyiceberg disagrees with the expected rows"
    assert duckdb_rows(table.metadata_location, columns) == expected, "DuckDB disagrees with the expected rows"


def current_snapshot_id(warehouse: str, identifier: str) -> int | None:
    try:
        snap = load(warehouse, identifier).metadata.current_snapshot()
    except Exception:  # noqa: BLE001 - no readable table: no snapshot
        return None
    return snap.snapshot_id if snap else None


def keys_in_shard_index(path: str | os.PathLike, keys: Iterable[int]) -> set[int]:
    """Which of these bigint keys an index of one key shard (at `path`) holds."""
    from lakesink_datasource.index.key_encoding import encode_keys
    from lakesink_datasource.index.sharded_index import open_sharded

    wanted = list(keys)
    found = open_sharded(str(path), 1).lookup(encode_keys([pa.array(wanted, type=pa.int64())]))
    return {k for k, location in zip(wanted, found) if location is not None}


def sqlite_busy() -> sqlite3.OperationalError:
    """SQLite's own SQLITE_BUSY ("database is locked": its error code says so, which is what
    lakesink reads): another connection holds the write lock."""
    with tempfile.TemporaryDirectory() as folder:
        holder = sqlite3.connect(f"{folder}/catalog.db", isolation_level=None)
        other = sqlite3.connect(f"{folder}/catalog.db", timeout=0)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            other.execute("CREATE TABLE t (x)")
        except sqlite3.OperationalError as exc:
            return exc
        finally:
            other.close()
            holder.close()
    raise AssertionError("SQLite did not refuse the second writer")


def numbered_parquet_source(directory: Path, parts: Sequence[Sequence[dict]], schema: pa.Schema) -> Path:
    """Write one Parquet file per part, named 000.parquet, 001.parquet, ... with mtimes ten
    seconds apart: a file stream with maxFilesPerTrigger=1 reads them in order, one per
    micro-batch, whatever the file system's mtime resolution."""
    directory.mkdir()
    for b, part in enumerate(parts):
        path = directory / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(list(part), schema=schema), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
    return directory


def stream_files_into_lakesink(spark: Any, source: Path, spark_schema: str, options: dict[str, str], checkpoint: Path) -> list[int]:
    """Stream a numbered Parquet source into lakesink, one file per micro-batch, until it is
    drained (availableNow); raise if the stream stopped on an error. Returns the batch ids
    Spark's commit log holds."""
    query = (
        spark.readStream.schema(spark_schema).option("maxFilesPerTrigger", 1).parquet(str(source))
        .writeStream.format("lakesink").options(**options)
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )
    query.awaitTermination()  # raises if the stream stopped
    assert query.exception() is None
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
