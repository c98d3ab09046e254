"""Independent readers for the benchmarks (DuckDB with the PyPI extension files)."""

from __future__ import annotations

import glob
import os
from pathlib import Path


def duckdb_connection():  # type: ignore[no-untyped-def]
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoload_known_extensions": False, "autoinstall_known_extensions": False})
    for module in (duckdb_extension_avro, duckdb_extension_iceberg):  # avro first
        path = glob.glob(os.path.join(os.path.dirname(module.__file__), "extensions", "**", "*.duckdb_extension"), recursive=True)[0]
        con.execute(f"LOAD '{path}'")
    return con


def lakesink_metadata(warehouse: Path, identifier: str) -> str:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    return catalog.load_table(identifier).metadata_location
