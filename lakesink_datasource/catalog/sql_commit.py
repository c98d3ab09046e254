"""Loads and commits whose cost does not grow with the table's history, for SQL catalogs.

pyiceberg's `SqlCatalog.commit_table` re-reads and re-parses the current metadata file, deep-
copies it and compares it before its compare-and-swap, and `load_table` parses it again on
every call: together tens of milliseconds per commit once a stream retains a hundred or so
snapshots, and the main reason a long stream's commits slowed down while its history filled.

For a SQL catalog (the embedded SQLite one and PostgreSQL) lakesink does the same commit on
the table it already holds: the base it built the commit on *is* the current state exactly
when the catalog row still points at the base's metadata file, which is what the UPDATE's
WHERE clause checks, atomically, as pyiceberg's does. Loads ask the catalog row for the
metadata location and reuse the table parsed last time when it has not moved. Any other
catalog goes through pyiceberg's own commit.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.serializers import ToOutputFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate

from lakesink_datasource.catalog.embedded import EmbeddedCatalog
from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg.compat import apply_updates, v3_metadata_writes
from lakesink_datasource.iceberg.s3_region import settle_s3_region

_tables: dict[tuple[int, str], Table] = {}  # (catalog object, table name) -> last loaded/committed
_lock = threading.Lock()


def _fast(catalog: Catalog) -> bool:
    if isinstance(catalog, EmbeddedCatalog):
        return True
    # A SqlCatalog exists only once pyiceberg's module is imported (SQLAlchemy with it).
    if "pyiceberg.catalog.sql" not in sys.modules:
        return False
    from lakesink_datasource.catalog import sqlalchemy_rows

    return sqlalchemy_rows.swaps_atomically(catalog)


def _location(catalog: Catalog, identifier: str) -> str | None:
    if isinstance(catalog, EmbeddedCatalog):
        return catalog.metadata_location(identifier)
    from lakesink_datasource.catalog import sqlalchemy_rows

    return sqlalchemy_rows.metadata_location(catalog, identifier)  # type: ignore[arg-type]


def _swap(catalog: Catalog, rows: Sequence[tuple[str, str, str]]) -> str | None:
    if isinstance(catalog, EmbeddedCatalog):
        return catalog.swap(rows)
    from lakesink_datasource.catalog import sqlalchemy_rows

    return sqlalchemy_rows.swap(catalog, rows)  # type: ignore[arg-type]


def _key(catalog: Catalog, identifier: str) -> tuple[int, str]:
    return id(catalog), ".".join(Catalog.identifier_to_tuple(identifier))


def load_table(catalog: Catalog, identifier: str) -> Table:
    """`catalog.load_table(identifier)`, reusing the last parsed table while the catalog still
    points at its metadata file (NoSuchTableError if there is no such table)."""
    fault_point("catalog_call", table=".".join(Catalog.identifier_to_tuple(identifier)))  # tests: a catalog that is away
    if not _fast(catalog):
        return _settled(catalog.load_table(identifier))
    location = _location(catalog, identifier)
    if location is None:
        raise NoSuchTableError(f"Table does not exist: {identifier}")
    key = _key(catalog, identifier)
    with _lock:
        cached = _tables.get(key)
    if cached is not None and cached.metadata_location == location:
        return cached
    table = _settled(catalog.load_table(identifier))
    _remember(catalog, table)
    return table


def _settled(table: Table) -> Table:
    # Before the FileIO opens its first file: a REST catalog may vend an endpoint without a region.
    settle_s3_region(table.io.properties)
    return table


def _remember(catalog: Catalog, table: Table) -> None:
    with _lock:
        _tables[_key(catalog, ".".join(table.name()))] = table


def commit(table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
    """`table.catalog.commit_table(...)`: CommitFailedException when another commit landed
    since `table` was loaded, or a requirement does not hold."""
    catalog = table.catalog
    if not _fast(catalog):
        fault_point("catalog_call", table=".".join(table.name()))
        with v3_metadata_writes():
            response = catalog.commit_table(table, requirements, updates)
        fault_point("catalog_updated", table=".".join(table.name()))  # tests: the commit applied, its answer is lost
        return response
    (response,) = swap_together([prepare_swap(table, requirements, updates)])
    return response


@dataclass(frozen=True)
class PreparedSwap:
    """One table's compare-and-swap on a SQL catalog, its new metadata file written."""

    table: Table
    metadata: TableMetadata
    location: str


def supports_swaps_together(catalog: Catalog) -> bool:
    """Whether `swap_together` can change several of `catalog`'s tables at once."""
    return _fast(catalog)


def prepare_swap(table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]) -> PreparedSwap:
    """Check `requirements` against `table` and write the metadata file `updates` make."""
    base = table.metadata
    for requirement in requirements:
        requirement.validate(base)
    new = apply_updates(base, updates, table.metadata_location)
    version = metadata_version(table.metadata_location) + 1
    location = load_location_provider(new.location, new.properties).new_table_metadata_file_location(version)
    with v3_metadata_writes():
        # A new name (a fresh uuid in it) is never taken: overwrite, so no existence check
        # costs a request on an object store.
        ToOutputFile.table_metadata(new, table.io.new_output(location), overwrite=True)
    return PreparedSwap(table, new, location)


def swap_together(swaps: list[PreparedSwap]) -> list[CommitTableResponse]:
    """Point each table's catalog row at its new metadata file, in one database transaction:
    all of them or, when any row moved since its table was loaded, none
    (CommitFailedException naming it; the new metadata files are deleted)."""
    catalog = swaps[0].table.catalog
    assert _fast(catalog) and all(s.table.catalog is catalog for s in swaps)
    for swap in swaps:
        fault_point("catalog_call", table=".".join(swap.table.name()))  # tests: a catalog that is away
    moved = _swap(catalog, [(".".join(s.table.name()), s.table.metadata_location, s.location) for s in swaps])
    if moved is not None:
        for refused in swaps:
            refused.table.io.delete(refused.location)  # nothing references them
        raise CommitFailedException(f"Table has been updated by another process: {moved}")
    fault_point("catalog_updated")  # tests: the UPDATE landed, its answer is lost
    responses = []
    for swap in swaps:
        responses.append(CommitTableResponse(metadata=swap.metadata, metadata_location=swap.location))
        _remember(catalog, Table(swap.table.name(), metadata=swap.metadata, metadata_location=swap.location, io=swap.table.io, catalog=catalog))
    return responses


def metadata_version(metadata_location: str) -> int:
    """The version a metadata file's name carries: `00011-<uuid>.metadata.json` (catalogs'
    names) or `v11.metadata.json` (Hadoop tables' and some Java tools'); -1 for any other
    name. pyiceberg reads only the first form, so after another engine's `v11` its next file
    would be `00000-...`, and a tool ordering metadata files by name would pick the wrong one."""
    name = metadata_location.rsplit("/", 1)[-1]
    found = re.match(r"v?(\d+)(?:-[^.]*)?\.(?:gz\.)?metadata\.json$", name)
    return int(found.group(1)) if found is not None else -1
