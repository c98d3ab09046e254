"""The embedded catalog: pyiceberg's SQL catalog tables in SQLite (`<warehouse>/catalog.db`),
read and swapped through Python's own sqlite3 on the write path.

A micro-batch asks the catalog two things: where a table's metadata is (planning, the
commit's read) and to swap that location (the commit). pyiceberg's `SqlCatalog` answers both
through SQLAlchemy, whose import costs every planner and commit process 0.23-0.27 s. This
catalog answers them with one SQL statement each on the same rows; everything else (creating
namespaces and tables, listing, dropping, renaming, views) goes to a `SqlCatalog` on the
same file, made when first needed. The tables stay those of pyiceberg's SQL catalog and
Iceberg's JDBC catalog: pyiceberg, DuckDB and Java engines read what this one writes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.io import load_file_io
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import CreateTableTransaction
    from pyiceberg.table.update import TableRequirement, TableUpdate
    from pyiceberg.typedef import Identifier, Properties
    from pyiceberg.view import View

SQLITE_URI_PREFIX = "sqlite:///"
# SQLite waits this long for another writer's lock before it says "database is locked" (the
# commit's retry policy then waits on: catalog/failures.py), as pysqlite's default does.
_BUSY_SECONDS = 5.0


def _row(identifier: str | Identifier) -> tuple[str, str]:
    return Catalog.namespace_to_string(Catalog.namespace_from(identifier)), Catalog.table_name_from(identifier)


class EmbeddedCatalog(MetastoreCatalog):
    """pyiceberg's SQL catalog on SQLite, its write path without SQLAlchemy."""

    def __init__(self, name: str, **properties: str) -> None:
        super().__init__(name, **properties)
        uri = properties["uri"]
        if not uri.startswith(SQLITE_URI_PREFIX):
            raise ValueError(f"the embedded catalog is a SQLite file ({SQLITE_URI_PREFIX}...), not {uri}")
        self.path = uri[len(SQLITE_URI_PREFIX) :]  # sqlite:////abs/catalog.db -> /abs/catalog.db
        self._full_catalog: SqlCatalog | None = None
        self._lock = threading.Lock()
        with self._connect() as db:
            columns = [r[1] for r in db.execute("PRAGMA table_info(iceberg_tables)")]
        if not columns:
            self._full()  # a new catalog: pyiceberg creates its tables
            columns = ["iceberg_type"]
        # A catalog made before pyiceberg kept views in it has no iceberg_type column.
        self._tables_only = " AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)" if "iceberg_type" in columns else ""

    def _connect(self) -> sqlite3.Connection:
        # One connection per call: commits of many tables run in threads of their own, and a
        # connection costs tens of microseconds.
        return sqlite3.connect(self.path, timeout=_BUSY_SECONDS, isolation_level=None, check_same_thread=False)

    def _full(self) -> SqlCatalog:
        """pyiceberg's own catalog on this file, for what the write path does not do."""
        with self._lock:
            if self._full_catalog is None:
                from pyiceberg.catalog.sql import SqlCatalog

                try:
                    self._full_catalog = SqlCatalog(self.name, **self.properties)
                except Exception as exc:
                    # Two processes opening a new catalog at once both create its tables; the
                    # second is told they exist. Opened again, it finds them.
                    if "already exists" not in str(exc):
                        raise
                    self._full_catalog = SqlCatalog(self.name, **self.properties)
            return self._full_catalog

    def dispose(self) -> None:
        """Close the pooled connections of the SqlCatalog, if one was made."""
        if self._full_catalog is not None:
            self._full_catalog.engine.dispose()

    # -- the write path ---------------------------------------------------------------------

    def metadata_location(self, identifier: str | Identifier) -> str | None:
        """Where the table's current metadata is (None: no such table)."""
        namespace, name = _row(identifier)
        with self._connect() as db:
            found = db.execute(
                f"SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?{self._tables_only}",
                (self.name, namespace, name),
            ).fetchone()
        return found[0] if found is not None else None

    def swap(self, rows: Sequence[tuple[str, str, str]]) -> str | None:
        """Point each table (identifier, the location its commit read, the new location) at its
        new metadata, in one transaction: all, or none when a table's row moved since (its
        identifier is returned)."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            for identifier, base, new in rows:
                namespace, name = _row(identifier)
                changed = db.execute(
                    "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? "
                    "WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
                    (new, base, self.name, namespace, name, base),
                ).rowcount
                if changed < 1:
                    db.execute("ROLLBACK")
                    return identifier
            db.execute("COMMIT")
            return None
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def load_table(self, identifier: str | Identifier) -> Table:
        location = self.metadata_location(identifier)
        if location is None:
            namespace, name = _row(identifier)
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        metadata = FromInputFile.table_metadata(load_file_io(self.properties, location).new_input(location))
        return Table(
            identifier=Catalog.identifier_to_tuple(identifier), metadata=metadata, metadata_location=location,
            io=self._load_file_io(metadata.properties, location), catalog=self,
        )

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        return self._full().commit_table(table, requirements, updates)

    # -- the rest, through pyiceberg's SqlCatalog (tables it returns are this catalog's) ----

    def create_table(self, identifier: str | Identifier, schema: Any, *args: Any, **kwargs: Any) -> Table:
        self._full().create_table(identifier, schema, *args, **kwargs)
        return self.load_table(identifier)

    def create_table_transaction(self, identifier: str | Identifier, schema: Any, *args: Any, **kwargs: Any) -> CreateTableTransaction:
        return self._full().create_table_transaction(identifier, schema, *args, **kwargs)

    def register_table(self, identifier: str | Identifier, metadata_location: str, overwrite: bool = False) -> Table:
        self._full().register_table(identifier, metadata_location, overwrite)
        return self.load_table(identifier)

    def drop_table(self, identifier: str | Identifier) -> None:
        self._full().drop_table(identifier)

    def purge_table(self, identifier: str | Identifier) -> None:
        self._full().purge_table(identifier)

    def rename_table(self, from_identifier: str | Identifier, to_identifier: str | Identifier) -> Table:
        self._full().rename_table(from_identifier, to_identifier)
        return self.load_table(to_identifier)

    def create_namespace(self, namespace: str | Identifier, properties: Properties | None = None) -> None:
        self._full().create_namespace(namespace, properties or {})

    def drop_namespace(self, namespace: str | Identifier) -> None:
        self._full().drop_namespace(namespace)

    def namespace_exists(self, namespace: str | Identifier) -> bool:
        return self._full().namespace_exists(namespace)

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        return self._full().list_tables(namespace)

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        return self._full().list_namespaces(namespace)

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        return self._full().load_namespace_properties(namespace)

    def update_namespace_properties(self, namespace: str | Identifier, removals: set[str] | None = None, updates: Properties | None = None) -> Any:
        return self._full().update_namespace_properties(namespace, removals, updates or {})

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return self._full().list_views(namespace)

    def view_exists(self, identifier: str | Identifier) -> bool:
        return self._full().view_exists(identifier)

    def load_view(self, identifier: str | Identifier) -> View:
        return self._full().load_view(identifier)

    def register_view(self, identifier: str | Identifier, metadata_location: str) -> View:
        return self._full().register_view(identifier, metadata_location)

    def drop_view(self, identifier: str | Identifier) -> None:
        self._full().drop_view(identifier)

    def create_view(self, *args: Any, **kwargs: Any) -> View:
        return self._full().create_view(*args, **kwargs)
