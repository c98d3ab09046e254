"""Resolve the Iceberg catalog a write goes to, cached once per process.

With no catalog option lakesink embeds one: pyiceberg's SQL catalog on SQLite at
`<warehouse>/catalog.db` (the same table layout as Iceberg's JDBC catalog, so Java
engines can open it too). Otherwise `catalog` names a catalog configured the usual
pyiceberg way, and every `catalog.<key>` option is passed as a catalog property.
"""

from __future__ import annotations

import os
import threading

import msgspec
from pyiceberg.catalog import Catalog, load_catalog

from lakesink_datasource.options import TableTarget

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
    return CatalogConfig(options.catalog or "default", dict(options.catalog_properties))


_cache: dict[tuple[str, tuple[tuple[str, str], ...]], Catalog] = {}
_lock = threading.Lock()


def load(config: CatalogConfig) -> Catalog:
    """Return the process-wide catalog for this config (connections are reused)."""
    key = (config.name, tuple(sorted(config.properties.items())))
    with _lock:
        catalog: Catalog | None = _cache.get(key)
        if catalog is None:
            if config.name == EMBEDDED_CATALOG_NAME and config.properties.get("type") == "sql":
                warehouse = config.properties["warehouse"].removeprefix("file://")
                os.makedirs(warehouse, exist_ok=True)
            try:
                catalog = load_catalog(config.name, **config.properties)
            except ValueError as exc:
                raise CatalogError(f"{describe(config)} is not configured: {_hint(config)} (pyiceberg said: {exc})") from exc
            except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors
                raise CatalogError(unreachable(config, exc)) from exc
            _cache[key] = catalog
        return catalog


class CatalogError(RuntimeError):
    """The catalog a write names cannot be configured or reached."""


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
