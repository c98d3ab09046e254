"""Snapshot expiry as its own commit, for `maintain expire` (streams expire in every commit).

Which snapshots go follows `history.expire.max-snapshot-age-ms` and
`history.expire.min-snapshots-to-keep` (`iceberg/expiry.py`); the files only they referenced
are deleted after the commit landed, never before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyiceberg.table import Table

from lakesink_datasource.catalog.commit_loop import CommitLoop, Done
from lakesink_datasource.commit.cleanup import delete_files, dropped_metadata_files
from lakesink_datasource.commit.lost_answer import holds, outcome_unknown
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.expiry import Unreachable, snapshots_to_expire, unreachable_files
from lakesink_datasource.iceberg.gc import refuse_deleting
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import Exhausted, Failure, RetryClock, RetryPolicy, Spent
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


@dataclass(frozen=True)
class _Attempt:
    prepared: PreparedCommit
    base_location: str  # the metadata file the expiry was decided on
    gone: Unreachable  # the files only the expired snapshots referenced
    kept: int


def _expire(table: Table, identifier: str, max_age_ms: int | None, dry_run: bool, now_ms: int | None, clock: RetryClock) -> ExpiryResult:
    what = f"expiring snapshots of {identifier}"
    sent: list[_Attempt] = []  # the attempt last sent

    def build(table: Table) -> _Attempt | Done[ExpiryResult | _Landed]:
        # Decided on the table as it is (again after a race: someone committed first).
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
            return Done(ExpiryResult(len(expired), len(gone), kept))
        sent[:] = [_Attempt(PreparedCommit(metadata, None, expired=expired), table.metadata_location, gone, kept)]
        return sent[0]

    def send(table: Table, attempt: _Attempt) -> ExpiryResult | _Landed:
        return _Landed(swap_in(table, attempt.prepared), attempt)

    def landed(table: Table) -> ExpiryResult | _Landed | None:
        return _Landed(table, sent[0]) if holds(table.metadata, sent[0].prepared) else None

    loop: CommitLoop[_Attempt, ExpiryResult | _Landed] = CommitLoop(
        clock, what, table.catalog, identifier, build, send, landed, exhausted=_spent(identifier, what),
    )
    outcome = loop.run(table)
    if isinstance(outcome, ExpiryResult):
        return outcome
    # Landed: what only the expired snapshots referenced goes now, never before.
    attempt = outcome.attempt
    deleted = delete_files(table.io, attempt.gone.all())
    delete_files(table.io, dropped_metadata_files(attempt.prepared.base, attempt.base_location, outcome.committed.metadata))
    return ExpiryResult(len(attempt.prepared.expired), deleted, attempt.kept)


@dataclass(frozen=True)
class _Landed:
    committed: Table  # a table state that holds the expiry
    attempt: _Attempt


def _spent(identifier: str, what: str) -> Exhausted:
    raced, unknown = _raced(identifier), outcome_unknown(what)
    return lambda spent: raced(spent) if spent.kind is Failure.RACE else unknown(spent)


def _raced(identifier: str) -> Exhausted:
    def build(spent: Spent) -> ExpiryRaced:
        return ExpiryRaced(f"could not expire snapshots of {identifier}: other writers kept committing first ({spent.describe()})")

    return build


class ExpiryRaced(LakesinkError, RuntimeError):
    """Other writers kept committing before the expiry could."""
