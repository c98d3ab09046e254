"""Command-line arguments naming a table, shared by the `check` and `maintain` tools.

They go through the same option parsing and catalog resolution as a write, so a tool opens
exactly the table a write with the same settings would.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

from lakesink_datasource.catalog import loader
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.iceberg.retry import DEFAULT_POLICY
from lakesink_datasource.options import parse_options


def add_table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("table", help="the table as namespace.table")
    parser.add_argument("--warehouse", help="lakesink's embedded catalog at <DIR>/catalog.db (the default catalog)")
    parser.add_argument("--catalog", help="a pyiceberg catalog name (configured in .pyiceberg.yaml or by --catalog-prop)")
    parser.add_argument(
        "--catalog-prop", action="append", default=[], metavar="KEY=VALUE", help="a catalog property (repeatable)"
    )


def check_table_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.warehouse and (args.catalog or args.catalog_prop):
        parser.error("use either --warehouse or --catalog/--catalog-prop, not both")
    for prop in args.catalog_prop:
        if "=" not in prop or not prop.split("=", 1)[0]:
            parser.error(f"--catalog-prop needs KEY=VALUE, got {prop!r}")


def _raw_options(args: argparse.Namespace) -> dict[str, str]:
    raw = {"table": args.table}
    if args.warehouse:
        raw["warehouse"] = args.warehouse
    if args.catalog:
        raw["catalog"] = args.catalog
    for prop in args.catalog_prop:
        key, value = prop.split("=", 1)
        raw[f"catalog.{key}"] = value
    return raw


def catalog_config_from_arguments(args: argparse.Namespace) -> loader.CatalogConfig:
    return loader.catalog_config(parse_options(_raw_options(args)))


def load_table_from_arguments(args: argparse.Namespace) -> Table:
    return load_existing_table(_raw_options(args))


def load_existing_table(raw: dict[str, str]) -> Table:
    """The table that write options `raw` name; never creates a catalog or a table."""
    options = parse_options(raw)
    config = loader.catalog_config(options)
    if options.uses_embedded_catalog and not os.path.exists(os.path.join(options.warehouse, "catalog.db")):
        # Opening the SQL catalog would create an empty one: a tool must not write one.
        raise FileNotFoundError(f"no lakesink catalog at {os.path.join(options.warehouse, 'catalog.db')}")
    catalog = load_catalog(config.name, **config.properties)
    # A command line waits through a locked or restarting catalog as a write does (iceberg/retry.py).
    return catalog_call(
        DEFAULT_POLICY.start(f"opening {options.table}"), lambda: catalog.load_table(options.table),
        what=f"loading table {options.table}", catalog=loader.describe(config),
    )


def open_table_or_report(args: argparse.Namespace) -> Table | None:
    """The table the arguments name, or None after printing why it cannot be opened (a
    command line reports, it does not dump a traceback)."""
    try:
        return load_table_from_arguments(args)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        print(f"cannot load table {args.table}: {exc}", file=sys.stderr)
        return None
