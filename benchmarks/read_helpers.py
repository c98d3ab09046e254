"""Independent readers for the benchmarks (DuckDB with the PyPI extension files)."""

from __future__ import annotations

from pathlib import Path


def duckdb_connection():  # type: ignore[no-untyped-def]
    from lakesink_datasource.duckdb_reader import connect

    return connect()


def lakesink_metadata(warehouse: Path, identifier: str) -> str:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    return catalog.load_table(identifier).metadata_location
