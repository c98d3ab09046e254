"""Where a table's current metadata file is: what DuckDB's `iceberg_scan` (and other
catalog-less readers) need.

    python -m lakesink_datasource.locate db.t [--warehouse DIR | --catalog NAME --catalog-prop K=V ...]

prints the location on one line, so a shell can pass it on:

    duckdb -c "SELECT count(*) FROM iceberg_scan('$(python -m lakesink_datasource.locate db.t)')"

From Python: `metadata_location("db.t", warehouse=...)` with the sink's own options.
"""

from __future__ import annotations

import argparse
import sys

from lakesink_datasource.catalog.table_args import (
    add_table_arguments,
    check_table_arguments,
    load_existing_table,
    open_table_or_report,
)


def metadata_location(table: str, **options: str) -> str:
    """The current metadata file of `table`, opened with the same options as a write
    (`warehouse=`, `catalog=`, `**{"catalog.uri": ...}`)."""
    return str(load_existing_table({"table": table, **options}).metadata_location)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakesink_datasource.locate", description=__doc__.split("\n\n")[0])
    add_table_arguments(parser)
    args = parser.parse_args(argv)
    check_table_arguments(parser, args)
    table = open_table_or_report(args)
    if table is None:
        return 1
    print(table.metadata_location)
    return 0


if __name__ == "__main__":
    sys.exit(main())
