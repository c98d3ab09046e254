"""Register a table whose catalog lost it back into a catalog, from its newest metadata file.

What an operator runs after lakesink refused to create a table over an old one's files
(`table/location_guard.py`), or to start an empty embedded catalog over a warehouse that
holds tables (`catalog/loader.py`). A keyed table's companion table of tombstones is
registered with it when its metadata is there too.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import load_file_io

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.table.location_guard import metadata_files, table_uuid_of
from lakesink_datasource.table.tombstone_table import SUFFIX, companion_identifier


class RegisterError(LakesinkError, RuntimeError):
    """A table cannot be registered: say why and what to give instead."""


@dataclass(frozen=True)
class Registered:
    identifier: str
    metadata_location: str


def default_location(catalog: Catalog, identifier: str) -> str:
    """Where `catalog` puts table `identifier` by default."""
    if not isinstance(catalog, MetastoreCatalog):
        raise RegisterError(f"catalog {catalog.name!r} chooses table locations itself: give the table's location (--location)")
    namespace, name = identifier.rsplit(".", 1)
    try:
        return catalog._resolve_table_location(None, namespace, name)
    except NoSuchNamespaceError:
        # The namespace is gone with the catalog: its default location is the warehouse's.
        warehouse = catalog.properties.get("warehouse", "").rstrip("/")
        if not warehouse:
            raise RegisterError(f"catalog {catalog.name!r} has no warehouse: give the table's location (--location)") from None
        return f"{warehouse}/{namespace}/{name}"


def newest_metadata(catalog: Catalog, location: str) -> str | None:
    """The newest metadata file under `location/metadata` (by its version number), if any."""
    io = load_file_io(catalog.properties, location)
    files = metadata_files(io, f"{location.rstrip('/')}/metadata")
    if not files:
        return None
    uuids = {table_uuid_of(io, f) for f in files}
    if len(uuids) > 1:
        raise RegisterError(
            f"{location} holds the metadata of {len(uuids)} different tables ({', '.join(sorted(str(u) for u in uuids))}): "
            "give the metadata file to register (--metadata)"
        )
    return files[-1]


def register(catalog: Catalog, identifier: str, *, location: str | None = None, metadata: str | None = None) -> list[Registered]:
    """Register `identifier` (and its companion of tombstones, if found) from its metadata."""
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except Exception:  # noqa: BLE001 - it exists (each catalog says so with its own error)
        pass
    location = (location or default_location(catalog, identifier)).rstrip("/")
    chosen = metadata or newest_metadata(catalog, location)
    if chosen is None:
        raise RegisterError(f"no table metadata under {location}/metadata: give the table's location (--location) or file (--metadata)")
    done = [_register_one(catalog, identifier, chosen)]
    if metadata is None:
        companion = f"{location}{SUFFIX}"  # where a companion of a table at `location` lives
        found = newest_metadata(catalog, companion)
        if found is not None:
            done.append(_register_one(catalog, companion_identifier(identifier), found))
    return done


def _register_one(catalog: Catalog, identifier: str, metadata_location: str) -> Registered:
    try:
        catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    else:
        raise RegisterError(f"table {identifier} is in catalog {catalog.name!r} already; nothing was registered")
    try:
        catalog.register_table(identifier, metadata_location)
    except TableAlreadyExistsError:
        raise RegisterError(f"table {identifier} is in catalog {catalog.name!r} already; nothing was registered") from None
    return Registered(identifier, metadata_location)
