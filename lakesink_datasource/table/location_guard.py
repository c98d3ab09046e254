"""A table location belongs to one table: never create a table, or remove "orphans", where
another table's metadata lives.

A catalog that lost a table (the embedded catalog's file replaced, a REST catalog restored
from an old backup, a table dropped without purging) leaves the table's files in place.
Creating a table of the same name puts the new one at the same location; its orphan
removal would then delete the old table's files, which nothing else points at any more.
So lakesink looks for `*.metadata.json` files under a location before it creates a table
there (and, for catalogs that choose locations themselves, right after), and orphan
removal refuses a location that holds another table's metadata.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass

from pyiceberg.io import FileIO
from pyiceberg.table import Table

from lakesink_datasource.catalog.errors import CatalogError
from lakesink_datasource.iceberg.listing import list_files
from lakesink_datasource.iceberg.retry import Busy, RetriesSpent, RetryClock, Spent


class LocationInUse(CatalogError):
    """A table's location holds the metadata of another table."""


@dataclass(frozen=True)
class ForeignMetadata:
    path: str
    table_uuid: str | None  # None: the file could not be read as table metadata


def table_uuid_of(io: FileIO, path: str) -> str | None:
    """The `table-uuid` a metadata file records (None when it cannot be read)."""
    try:
        with io.new_input(path).open() as stream:
            raw = stream.read()
        if path.endswith(".gz.metadata.json") or raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        value = json.loads(raw).get("table-uuid")
    except (OSError, ValueError):
        return None
    return str(value) if value is not None else None


def metadata_files(io: FileIO, location: str) -> list[str]:
    """The table metadata files anywhere under `location`, newest name last."""
    return sorted(f.path for f in list_files(io, location) if f.path.endswith(".metadata.json"))


def foreign_metadata(io: FileIO, location: str, own_uuid: str | None, skip: frozenset[str] = frozenset()) -> list[ForeignMetadata]:
    """Metadata files under `location` (except `skip`) of a table other than `own_uuid`
    (any table when `own_uuid` is None); unreadable ones count as foreign."""
    found = []
    for path in metadata_files(io, location):
        if path in skip:
            continue
        owner = table_uuid_of(io, path)
        if own_uuid is None or owner != own_uuid:
            found.append(ForeignMetadata(path, owner))
    return found


def refuse_if_in_use(io: FileIO, location: str, identifier: str, catalog: str, own_uuid: str | None = None) -> None:
    """Raise LocationInUse when `location` holds metadata of a table other than `own_uuid`."""
    foreign = foreign_metadata(io, location, own_uuid)
    if not foreign:
        return
    newest = foreign[-1]
    raise LocationInUse(
        f"table {identifier} is not in {catalog}, but its location {location} holds the metadata of "
        f"{'another' if own_uuid else 'a'} table ({len(foreign)} metadata file(s), newest {newest.path}"
        f"{', table uuid ' + newest.table_uuid if newest.table_uuid else ''}). The catalog may have lost that table: "
        "lakesink does not create a new table over it. Register it back (python -m lakesink_datasource.maintain "
        f"register {identifier} ..., or your catalog's register_table with {newest.path}), write to another table, or, "
        "if that table was dropped on purpose, delete its files first"
    )


def created_meanwhile(load: Callable[[], Table | None], clock: RetryClock) -> Table | None:
    """The table another writer is creating right now (its metadata file is written, its
    catalog entry follows), once the catalog shows it; None when none appears within the
    retry policy's budget for a lock (`commit.retry.*`: with Iceberg's defaults about 8 s
    over five looks), which is what this is: another writer's catalog call is in flight.
    (None: a table the catalog lost; the caller refuses the location.) Several tasks of one
    routed write meet a new table at once and each creates it."""

    def look() -> Table:
        table = load()
        if table is None:
            raise Busy("the table's catalog entry is not there yet: another writer is creating it")
        return table  # the catalog has it now: it is the table of that name, whoever created it

    def gave_up(_spent: Spent) -> _NotCreated:
        return _NotCreated()

    try:
        return clock.scoped().run(look, doing="waiting for another writer's creation of the table", exhausted=gave_up)
    except _NotCreated:
        return None


class _NotCreated(RetriesSpent):
    """No catalog entry appeared for the metadata found at the location."""


def remove_lost_creations(io: FileIO, location: str, before: frozenset[str], winner_uuid: str) -> None:
    """After another writer's create of the same table won: the first metadata files that
    losing creations wrote meanwhile (not there `before`, of another table uuid). Nothing
    can reference them (the name is the winner's), and left there they would make the
    location look shared with a lost table (orphan removal would refuse it)."""
    for path in metadata_files(io, location):
        if path not in before and table_uuid_of(io, path) not in (winner_uuid, None):
            try:
                io.delete(path)
            except OSError:  # another loser removed it, or the store refused: orphan removal reports it
                pass
