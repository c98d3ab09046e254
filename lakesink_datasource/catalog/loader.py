"""Resolve the Iceberg catalog a write goes to, cached once per process.

With no catalog option lakesink embeds one: pyiceberg's SQL catalog tables on SQLite at
`<warehouse>/catalog.db` (the same table layout as Iceberg's JDBC catalog, so Java
engines can open it too), its write path through sqlite3 (catalog/embedded.py).
Otherwise `catalog` names a catalog configured the usual pyiceberg way, and every
`catalog.<key>` option is passed as a catalog property.
"""

from __future__ import annotations

import os
import threading

import msgspec
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NotInstalledError

from lakesink_datasource.catalog.embedded import EmbeddedCatalog
from lakesink_datasource.catalog.errors import CatalogError
from lakesink_datasource.catalog.rest_timeouts import apply_timeouts
from lakesink_datasource.iceberg.file_io import FILE_IO_IMPL
from lakesink_datasource.iceberg.file_io import IMPL as FILE_IO
from lakesink_datasource.iceberg.s3_region import settle_s3_region
from lakesink_datasource.options import TableTarget

__all__ = ["EMBEDDED_CATALOG_NAME", "CatalogConfig", "CatalogError", "catalog_config", "describe", "load", "unreachable"]

EMBEDDED_CATALOG_NAME = "lakesink"


class CatalogConfig(msgspec.Struct, frozen=True):
    """Picklable recipe for a catalog: name plus explicit properties."""

    name: str
    properties: dict[str, str]


def catalog_config(options: TableTarget) -> CatalogConfig:
    if options.uses_embedded_catalog:
        warehouse = options.warehouse
        return CatalogConfig(
            EMBEDDED_CATALOG_NAME,
            {
                "type": "sql",
                "uri": f"sqlite:///{os.path.join(warehouse, 'catalog.db')}",
                "warehouse": f"file://{warehouse}",
            },
        )
    properties = dict(options.catalog_properties)
    settle_s3_region(properties)
    properties.setdefault(FILE_IO_IMPL, FILE_IO)  # fewer S3 requests per file (iceberg/file_io.py)
    return CatalogConfig(options.catalog or "default", properties)


_cache: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[Catalog, int | None]] = {}
_lock = threading.Lock()


def _load_catalog(config: CatalogConfig) -> Catalog:
    if _embedded_file(config) is not None:
        return EmbeddedCatalog(config.name, **config.properties)
    try:
        return load_catalog(config.name, **config.properties)
    except Exception as exc:
        # Two processes opening a new SQL catalog at once both create its tables; the one that
        # comes second is told they exist (sqlite: "table iceberg_tables already exists").
        # Opened again, it finds them.
        if "already exists" not in str(exc) or type(exc).__module__.split(".")[0] != "sqlalchemy":
            raise
        return load_catalog(config.name, **config.properties)


def load(config: CatalogConfig) -> Catalog:
    """Return the process-wide catalog for this config (connections are reused).

    The embedded catalog is never created over a warehouse that already holds tables: a
    `catalog.db` that vanished (a volume that came back empty, a changed path, a file moved
    away while a stream runs) would otherwise be replaced by an empty one, and the next
    write would create a new table over the old one's files."""
    key = (config.name, tuple(sorted(config.properties.items())))
    embedded = _embedded_file(config)
    with _lock:
        cached = _cache.get(key)
        inode = _inode(embedded) if embedded is not None else None
        if cached is not None and embedded is not None and cached[1] != inode:
            # catalog.db was replaced or removed under this process: its pooled connections
            # still reach the old file. Start over with what is there now.
            _dispose(cached[0])
            del _cache[key]
            cached = None
        if cached is not None:
            return cached[0]
        if embedded is not None:
            warehouse = os.path.dirname(embedded)
            if inode is None:
                tables = tables_in_warehouse(warehouse)
                if tables:
                    raise CatalogError(
                        f"the embedded catalog {embedded} is missing, but warehouse {warehouse} holds Iceberg tables "
                        f"({', '.join(tables[:5])}{', ...' if len(tables) > 5 else ''}): lakesink does not start an empty "
                        "catalog over them (a new table would be created over an old one). Restore catalog.db, or "
                        "register each table into a new catalog: python -m lakesink_datasource.maintain register "
                        f"--warehouse {warehouse} NAMESPACE.TABLE"
                    )
            os.makedirs(warehouse, exist_ok=True)
        try:
            catalog = _load_catalog(config)
        except (ImportError, NotInstalledError) as exc:
            raise CatalogError(_missing_driver(config, exc)) from exc
        except ValueError as exc:
            raise CatalogError(f"{describe(config)} is not configured: {_hint(config)} (pyiceberg said: {exc})") from exc
        except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors
            raise CatalogError(unreachable(config, exc)) from exc
        if config.properties.get("type") == "rest":
            try:
                apply_timeouts(catalog, config.properties)
            except ValueError as exc:
                raise CatalogError(f"{describe(config)}: {exc} (a lakesink option 'catalog.<property>')") from exc
        _cache[key] = (catalog, _inode(embedded) if embedded is not None else None)
        return catalog


# Modules a catalog may need that lakesink does not install by default, and the extra that does.
_EXTRAS = {"psycopg2": "postgres", "psycopg": "postgres"}
_WHAT = {"postgres": "the PostgreSQL driver psycopg2"}


def _missing_driver(config: CatalogConfig, exc: BaseException) -> str:
    """What to install when a catalog's driver is missing (pyiceberg says NotInstalledError,
    SQLAlchemy an ImportError of the database module)."""
    module = None
    cause: BaseException | None = exc
    while cause is not None and module is None:  # pyiceberg wraps the ImportError of the driver
        module = getattr(cause, "name", None) if isinstance(cause, ImportError) else None
        cause = cause.__cause__ or cause.__context__
    if module is None and str(config.properties.get("uri", "")).startswith("postgresql"):
        module = "psycopg2"  # SQLAlchemy's default PostgreSQL driver
    extra = _EXTRAS.get((module or "").split(".")[0])
    if extra is not None:
        return (
            f"{describe(config)} needs {_WHAT[extra]}, which is not installed: "
            f"pip install 'lakesink-datasource[{extra}]' (on a cluster, in the environment the driver and executors run)"
        )
    return f"{describe(config)} needs a module that is not installed ({type(exc).__name__}: {exc}); install it where Spark's Python runs"


def _embedded_file(config: CatalogConfig) -> str | None:
    """The SQLite file of the embedded catalog (None for any other catalog)."""
    if config.name != EMBEDDED_CATALOG_NAME or config.properties.get("type") != "sql":
        return None
    return os.path.join(config.properties["warehouse"].removeprefix("file://"), "catalog.db")


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _dispose(catalog: Catalog) -> None:
    if isinstance(catalog, EmbeddedCatalog):
        catalog.dispose()
        return
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()


def tables_in_warehouse(warehouse: str, depth: int = 4) -> list[str]:
    """Directories under `warehouse` (at most `depth` levels down) holding Iceberg table
    metadata (`metadata/*.metadata.json`), as paths relative to it."""
    found: list[str] = []
    root = os.path.abspath(warehouse)
    for folder, subfolders, _files in os.walk(root):
        level = folder[len(root) :].count(os.sep)
        if level >= depth:
            subfolders[:] = []
        if "metadata" in subfolders:
            names = os.listdir(os.path.join(folder, "metadata"))
            if any(n.endswith(".metadata.json") for n in names):
                found.append(os.path.relpath(folder, root))
                subfolders[:] = [d for d in subfolders if d not in ("metadata", "data")]
    return sorted(found)


def describe(config: CatalogConfig) -> str:
    uri = config.properties.get("uri")
    return f"catalog {config.name!r}" + (f" at {uri}" if uri else "")


def _hint(config: CatalogConfig) -> str:
    if config.name == EMBEDDED_CATALOG_NAME:
        return "check option 'warehouse'"
    return (
        "give lakesink options 'catalog.uri' (and 'catalog.type', e.g. rest or sql, plus credentials as "
        f"catalog.<property>), or configure catalog {config.name!r} in ~/.pyiceberg.yaml or "
        f"PYICEBERG_CATALOG__{config.name.upper()}__URI"
    )


def unreachable(config: CatalogConfig, exc: BaseException) -> str:
    return (
        f"cannot reach {describe(config)}: {type(exc).__name__}: {exc}; check option 'catalog.uri' and that the "
        "catalog service is up and reachable from the Spark driver and executors"
    )
