"""Snapshot expiry as its own commit, for `maintain expire` (streams expire in every commit).

Which snapshots go follows `history.expire.max-snapshot-age-ms` and
`history.expire.min-snapshots-to-keep` (`iceberg/expiry.py`); the files only they referenced
are deleted after the commit landed, never before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.commit.cleanup import delete_files, dropped_metadata_files
from lakesink_datasource.commit.lost_answer import swap_settled
from lakesink_datasource.commit.swap import PreparedCommit
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.expiry import snapshots_to_expire, unreachable_files
from lakesink_datasource.iceberg.gc import refuse_deleting
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import Exhausted, RetryClock, RetryPolicy, Spent
from lakesink_datasource.table.tombstone_table import SUFFIX, unstored_tombstone_snapshots


@dataclass(frozen=True)
class ExpiryResult:
    expired_snapshots: int
    files_deleted: int  # data, delete (Puffin), manifest and manifest-list files
    retained_snapshots: int

    def describe(self, dry_run: bool) -> str:
        verb = "would expire" if dry_run else "expired"
        files = "would delete" if dry_run else "deleted"
        return f"{verb} {self.expired_snapshots} snapshot(s), {files} {self.files_deleted} file(s); {self.retained_snapshots} kept"


def expire_snapshots(
    table: Table, *, max_age_ms: int | None = None, dry_run: bool = False, now_ms: int | None = None,
    clock: RetryClock | None = None,
) -> ExpiryResult:
    """Expire what the table's retention (or `max_age_ms`, when given) allows. (A keyed
    table's tombstones are stored in its companion table before: `maintain` does that.)
    Refused (GcDisabled) on a table with gc.enabled=false, as Iceberg Java refuses it.
    `clock`: the operation's it is part of (iceberg/retry.py), else its own."""
    identifier = ".".join(table.name())
    refuse_deleting(table.metadata.properties, identifier, "expire snapshots")
    what = f"expiring snapshots of {identifier}"
    clock = clock.scoped(what) if clock is not None else RetryPolicy.of(TableSettings.of_table(table.metadata)).start(what)
    with clock.active():
        return _expire(table, identifier, max_age_ms, dry_run, now_ms, clock)


def _expire(table: Table, identifier: str, max_age_ms: int | None, dry_run: bool, now_ms: int | None, clock: RetryClock) -> ExpiryResult:
    what = f"expiring snapshots of {identifier}"
    catalog = table.catalog
    while True:
        metadata = table.metadata
        settings = TableSettings.of_table(metadata)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        age = settings.max_snapshot_age_ms if max_age_ms is None else max_age_ms
        expired = snapshots_to_expire(metadata, now, age, settings.min_snapshots_to_keep)
        if not identifier.endswith(SUFFIX):
            # A snapshot naming tombstones its companion does not hold yet is their only copy.
            kept_back = unstored_tombstone_snapshots(table, identifier, expired)
            expired = [s for s in expired if s not in kept_back]
        gone = unreachable_files(table.io, metadata, expired)
        kept = len(metadata.snapshots) - len(expired)
        if dry_run or not expired:
            return ExpiryResult(len(expired), len(gone), kept)
        attempt = clock.begin()
        try:
            committed = swap_settled(table, PreparedCommit(metadata, None, expired=expired), what=what, clock=clock)
        except CommitFailedException as exc:
            # Someone committed first: decide again on the new state, within the race budget.
            clock.failed(exc, attempt, doing=what, exhausted=_raced(identifier))
            table = clock.run(lambda: sql_commit.load_table(catalog, identifier), doing=f"{what}, reading the table")
            continue
        deleted = delete_files(table.io, gone.all())
        delete_files(table.io, dropped_metadata_files(metadata, table.metadata_location, committed.metadata))
        return ExpiryResult(len(expired), deleted, kept)


def _raced(identifier: str) -> Exhausted:
    def build(spent: Spent) -> ExpiryRaced:
        return ExpiryRaced(f"could not expire snapshots of {identifier}: other writers kept committing first ({spent.describe()})")

    return build


class ExpiryRaced(LakesinkError, RuntimeError):
    """Other writers kept committing before the expiry could."""
