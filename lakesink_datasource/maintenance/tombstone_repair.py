"""Repair a keyed table's companion table of tombstones that cannot be read.

When the companion (`table/tombstone_table.py`) is damaged (its metadata or a data file
lost), sequenced batches stop committing and key indexes rebuilt without it refuse late
changes they cannot decide. The repair gathers every tombstone that can still be read:
the companion's readable files (from its newest readable metadata), plus the tombstone
files named by the main table's retained snapshots. If nothing is lost it replaces the
companion with one holding those rows; if some rows cannot be read, it says so and only
goes on when the operator accepts that those deletes are forgotten (`accept_loss`).
The new companion gets a location of its own; the damaged one's files are deleted once the
new one is in place.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.commit.append_rows import append_rows
from lakesink_datasource.commit.cleanup import delete_files
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.history import ancestors
from lakesink_datasource.iceberg.listing import list_files
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import DEFAULT_POLICY, RetryClock, RetryPolicy
from lakesink_datasource.iceberg.summary_keys import TOMBSTONES
from lakesink_datasource.table.location_guard import metadata_files
from lakesink_datasource.table.tombstone_table import STORED_THROUGH, SUFFIX, companion_identifier, load_companion

log = logging.getLogger("lakesink")


class RepairRefused(LakesinkError, RuntimeError):
    """Some tombstones cannot be read: the repair waits for the operator to accept the loss."""


@dataclass
class RepairReport:
    rows: int = 0  # tombstones in the repaired companion
    from_companion: int = 0
    from_snapshots: int = 0
    unreadable: list[str] = field(default_factory=list)  # files whose tombstones are lost
    replaced: bool = False  # False: the companion could be read, nothing was done

    def describe(self) -> str:
        if not self.replaced:
            return "the tombstone table can be read: nothing to repair"
        lost = f"; {len(self.unreadable)} unreadable file(s) forgotten: {', '.join(self.unreadable)}" if self.unreadable else ""
        return (
            f"rebuilt the tombstone table with {self.rows} tombstone(s) ({self.from_companion} from its readable files, "
            f"{self.from_snapshots} from the table's retained snapshots){lost}"
        )


def _readable_companion(catalog: Catalog, identifier: str) -> pa.Table | None:
    """The companion's rows when it can be read whole, else None."""
    try:
        companion = load_companion(catalog, identifier)
        return pa.table({}) if companion is None or companion.metadata.current_snapshot() is None else companion.scan().to_arrow()
    except Exception:  # noqa: BLE001 - any failure means: needs repair
        return None


def _newest_readable_metadata(io: FileIO, location: str) -> TableMetadata | None:
    for path in reversed(metadata_files(io, f"{location}/metadata")):
        try:
            return FromInputFile.table_metadata(io.new_input(path))
        except Exception:  # noqa: BLE001 - damaged: try the one before
            continue
    return None


def _salvage(io: FileIO, location: str, report: RepairReport) -> list[pa.Table]:
    metadata = _newest_readable_metadata(io, location)
    if metadata is None:
        report.unreadable.append(f"{location}/metadata (no readable metadata file)")
        return []
    parts = []
    try:
        entries = live_data_files(io, metadata.current_snapshot())
    except Exception:  # noqa: BLE001 - its manifests are gone too
        report.unreadable.append(f"{location} (the manifests of its newest readable metadata)")
        return []
    for entry in entries:
        try:
            with io.new_input(entry.data_file.file_path).open() as stream:
                parts.append(pq.read_table(stream))
        except Exception:  # noqa: BLE001 - a lost or damaged file
            report.unreadable.append(entry.data_file.file_path)
    return parts


def repair_tombstones(catalog: Catalog, identifier: str, *, accept_loss: bool = False) -> RepairReport:
    report = RepairReport()
    table = catalog_call(DEFAULT_POLICY.start(f"repairing {companion_identifier(identifier)}"), lambda: catalog.load_table(identifier),
                         what=f"loading table {identifier}", catalog=f"catalog {catalog.name!r}")
    # One operation, with the table's budgets (iceberg/retry.py).
    clock = RetryPolicy.of(TableSettings.of_table(table.metadata)).start(f"repairing {companion_identifier(identifier)}")
    with clock.active():
        return _repair(catalog, identifier, table, accept_loss, report, clock)


def _repair(catalog: Catalog, identifier: str, table: Table, accept_loss: bool, report: RepairReport, clock: RetryClock) -> RepairReport:
    if _readable_companion(catalog, identifier) is not None:
        return report
    location = f"{table.metadata.location.rstrip('/')}{SUFFIX}"
    io = load_file_io(catalog.properties, location)
    parts = _salvage(io, location, report)
    report.from_companion = sum(p.num_rows for p in parts)
    for snapshot in ancestors(table.metadata):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        for path in filter(None, props.get(TOMBSTONES, "").split(",")):
            try:
                with table.io.new_input(path).open() as stream:
                    part = pq.read_table(stream)
            except Exception:  # noqa: BLE001 - expired or lost
                continue
            parts.append(part)
            report.from_snapshots += part.num_rows
    if report.unreadable and not accept_loss:
        raise RepairRefused(
            f"{len(report.unreadable)} part(s) of {companion_identifier(identifier)} cannot be read: "
            f"{', '.join(report.unreadable)}. The deletes recorded only there are lost; a late change older than one of "
            "them would bring its key back. Restore those files if you can; else run again with --accept-loss to rebuild "
            f"the tombstone table from what can be read ({report.from_companion} + {report.from_snapshots} tombstone(s))"
        )
    rows = pa.concat_tables(parts, promote_options="permissive") if parts else None
    _replace(catalog, identifier, table, rows, location, clock)
    report.rows = rows.num_rows if rows is not None else 0
    report.replaced = True
    return report


def _replace(catalog: Catalog, identifier: str, table: Table, rows: pa.Table | None, old_location: str, clock: RetryClock) -> None:
    name = companion_identifier(identifier)
    try:
        catalog.drop_table(name)
    except Exception:  # noqa: BLE001 - not registered (lost with its metadata)
        pass
    newest = table.metadata.current_snapshot()
    through = str(newest.sequence_number if newest is not None and newest.sequence_number is not None else -1)
    if rows is not None and rows.num_rows:
        location = f"{old_location}-{uuid.uuid4().hex[:8]}"
        fresh = catalog_call(
            clock,
            lambda: catalog.create_table(
                name, schema=rows.schema, location=location,
                properties={"format-version": "2", "write.metadata.delete-after-commit.enabled": "true",
                            "write.metadata.previous-versions-max": "10"},
            ),
            what=f"creating table {name}", catalog=f"catalog {catalog.name!r}",
        )
        append_rows(fresh, rows, properties={STORED_THROUGH: through}, clock=clock)
    # The damaged companion's files: nothing refers to them any more.
    old_io = load_file_io(catalog.properties, old_location)
    delete_files(old_io, [f.path for f in list_files(old_io, old_location)])
    log.info("lakesink: replaced %s (%d tombstones)", name, rows.num_rows if rows is not None else 0)
