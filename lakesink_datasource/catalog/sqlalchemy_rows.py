"""A SQL catalog's rows through SQLAlchemy (pyiceberg's `SqlCatalog`: PostgreSQL, or SQLite
named as a catalog of its own): where a table's metadata is, and the swap of its location.
The embedded catalog does the same with sqlite3 (catalog/embedded.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session


def _where(catalog: SqlCatalog, identifier: str) -> tuple[ColumnElement[bool], ...]:
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    return (IcebergTables.catalog_name == catalog.name, IcebergTables.table_namespace == namespace, IcebergTables.table_name == name)


def swaps_atomically(catalog: Catalog) -> bool:
    """A SqlCatalog whose driver says how many rows an UPDATE changed (the swap's check)."""
    return isinstance(catalog, SqlCatalog) and bool(catalog.engine.dialect.supports_sane_rowcount)


def metadata_location(catalog: SqlCatalog, identifier: str) -> str | None:
    with Session(catalog.engine) as session:
        return session.execute(select(IcebergTables.metadata_location).where(*_where(catalog, identifier))).scalar()


def swap(catalog: SqlCatalog, rows: Sequence[tuple[str, str, str]]) -> str | None:
    """EmbeddedCatalog.swap's contract: (identifier, base location, new location) each, all or
    none; the identifier whose row moved, else None."""
    with Session(catalog.engine) as session:
        for identifier, base, new in rows:
            changed = session.execute(
                update(IcebergTables)
                .where(*_where(catalog, identifier), IcebergTables.metadata_location == base)
                .values(metadata_location=new, previous_metadata_location=base)
            )
            if changed.rowcount < 1:  # type: ignore[attr-defined]  # a CursorResult for UPDATE
                session.rollback()
                return identifier
        session.commit()
    return None
