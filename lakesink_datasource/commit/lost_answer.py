"""One compare-and-swap whose answer may be lost, settled by reading the table again.

A catalog can apply a commit and then fail to say so: a REST catalog's 503 or 504 from a
load balancer that timed out, a gateway restarted, a connection dropped after the UPDATE.
Iceberg Java calls that CommitStateUnknownException and never deletes the files of such a
commit, since the table may reference them. Here the table is read again (on the retry
clock of the operation: iceberg/retry.py) until it says what happened:

- it holds the commit: it landed, and the table read is the state after it;
- its branch moved on without it: the commit asserted the old head and can never land now,
  so it was refused and its files can go;
- neither (the branch is where the commit expects it): it did not land yet, and the same
  commit is sent again; a copy of it still in flight then either lands first (the resend is
  refused and the next read finds it) or is refused itself.

If the operation's outage budget is spent first the outcome is unknown: CommitOutcomeUnknown,
and the caller keeps every file (orphan removal collects them if the commit never landed).
"""

from __future__ import annotations

import logging

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.catalog.commit_loop import CommitLoop
from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.iceberg.history import branch_head
from lakesink_datasource.iceberg.retry import Exhausted, Failure, RetryClock, Spent

log = logging.getLogger("lakesink")

# A swap's failures the loop below waits for; a race without a lost answer is the caller's.
_SETTLED = frozenset({Failure.LOCKED, Failure.ANSWER_LOST})


class CommitOutcomeUnknown(CatalogUnavailable):
    """A commit's answer was lost and the catalog did not come back to say whether it landed:
    its files must stay."""


def holds(metadata: TableMetadata, prepared: PreparedCommit) -> bool:
    """Whether `metadata` holds `prepared`: its snapshot, or (a commit that only expires
    snapshots) none of the snapshots it expires."""
    ids = {s.snapshot_id for s in metadata.snapshots}
    if prepared.snapshot is not None:
        return prepared.snapshot.snapshot_id in ids
    return bool(prepared.expired) and not ids.intersection(prepared.expired)


def _head_id(metadata: TableMetadata, branch: str | None) -> int | None:
    head = branch_head(metadata, branch)
    return head.snapshot_id if head is not None else None


def can_still_land(metadata: TableMetadata, prepared: PreparedCommit) -> bool:
    """Whether `prepared`, which `metadata` does not hold, could still land: its branch is
    where the commit expects it (once it moved on, the compare-and-swap can never apply)."""
    return _head_id(metadata, prepared.branch) == _head_id(prepared.base, prepared.branch)


def outcome_unknown(what: str) -> Exhausted:
    def build(spent: Spent) -> CommitOutcomeUnknown:
        return CommitOutcomeUnknown(
            f"{what}: the catalog's answer was lost and it did not come back in time to say whether the commit landed "
            f"({spent.describe()}); its files are kept (orphan removal collects them if it did not)",
            spent.last, spent.failures,
        )

    return build


def swap_settled(table: Table, prepared: PreparedCommit, *, what: str, clock: RetryClock) -> Table:
    """`swap_in(table, prepared)`, its answer settled when lost: returns a table state that
    holds the commit; CommitFailedException when it was (or can now only be) refused;
    CommitOutcomeUnknown when the operation's budget for a catalog that is away is spent
    first. After any other error the table is read: a commit it holds landed (that table
    is returned); else the error goes up as it is (the caller keeps the commit's files
    unless `not_applied` says the catalog refused it)."""
    identifier = ".".join(table.name())
    expected_head = _head_id(prepared.base, prepared.branch)
    lost: list[bool] = []

    def send(table: Table, prepared: PreparedCommit) -> Table:
        return swap_in(table, prepared)

    def unknown(prepared: PreparedCommit) -> None:
        if not lost:
            log.warning("lakesink: %s: the catalog's answer was lost; reading the table to see whether it landed", what)
        lost.append(True)

    def landed(table: Table) -> Table | None:
        if not holds(table.metadata, prepared):
            return None
        log.warning("lakesink: %s landed although its answer was lost", what)
        return table

    def decide(table: Table) -> Table | None:
        if _head_id(table.metadata, prepared.branch) != expected_head:
            raise CommitFailedException(f"{what}: another commit landed first; this one did not land")
        return None  # not landed (yet): the same commit again, on the same head

    loop: CommitLoop[PreparedCommit, Table] = CommitLoop(
        clock, what, table.catalog, identifier, lambda _table: prepared, send, landed, decide=decide, unknown=unknown,
        retry_on=_SETTLED, exhausted=outcome_unknown(what),
    )
    return loop.run(table)
