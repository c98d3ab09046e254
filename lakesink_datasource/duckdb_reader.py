"""DuckDB as an independent reader of lakesink tables (demo, tests, benchmarks).

DuckDB shares no code with lakesink and applies Iceberg v3 deletion vectors. Its iceberg and
avro extensions come from the PyPI packages `duckdb-extension-iceberg` and
`duckdb-extension-avro` (installed with `lakesink-datasource[test]`), loaded from their files
with autoloading off, so nothing is fetched at run time.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import duckdb


def _extension_file(module: Any) -> str:
    pattern = os.path.join(os.path.dirname(module.__file__), "extensions", "**", "*.duckdb_extension")
    found = glob.glob(pattern, recursive=True)
    if not found:
        raise FileNotFoundError(f"no DuckDB extension file in the {module.__name__} package")
    return found[0]


def connect(s3: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the avro and iceberg extensions loaded (avro first). `s3`:
    pyiceberg's S3 properties (`s3.endpoint`, `s3.access-key-id`, ...) of tables on an
    S3-compatible store: the httpfs extension is loaded (`duckdb-extension-httpfs`) and
    they become DuckDB's S3 secret."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect(config={"autoload_known_extensions": False, "autoinstall_known_extensions": False})
    modules = [duckdb_extension_avro, duckdb_extension_iceberg]
    if s3 is not None:
        import duckdb_extension_httpfs

        modules.insert(1, duckdb_extension_httpfs)
    for module in modules:
        con.execute(f"LOAD '{_extension_file(module)}'")
    if s3 is not None:
        endpoint = s3.get("s3.endpoint", "")
        con.execute(
            "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, ENDPOINT ?, URL_STYLE ?, USE_SSL ?, REGION ?)",
            [s3.get("s3.access-key-id", ""), s3.get("s3.secret-access-key", ""), endpoint.split("://", 1)[-1],
             "path" if s3.get("s3.path-style-access", "false").lower() == "true" else "vhost",
             not endpoint.startswith("http://"), s3.get("s3.region", "us-east-1")],
        )
    # DuckDB 1.5.5 misreads a deletion vector when a large Puffin blob is followed by a small
    # one near the end of the file: its external file cache widens the read and the Puffin
    # scan then parses from the cached block's start, applying a neighbour's DV (Iceberg
    # Java's files trigger it too; docs/readers.md). Without the cache it reads correctly.
    con.execute("SET enable_external_file_cache = false")
    return con
