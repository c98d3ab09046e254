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

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.iceberg.history import branch_head
from lakesink_datasource.iceberg.retry import Exhausted, Failure, RetryClock, Spent, first_line

log = logging.getLogger("lakesink")

# A swap's failures the loop below waits for; a race without a lost answer is the caller's.
_SETTLED = frozenset({Failure.LOCKED, Failure.ANSWER_LOST})
_READS = frozenset({Failure.LOCKED, Failure.AWAY})


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
    first. Any other error goes up as it is (the outcome of such a commit is unknown too:
    keep its files)."""
    identifier = ".".join(table.name())
    catalog = table.catalog
    expected_head = _head_id(prepared.base, prepared.branch)
    lost = False
    unknown = outcome_unknown(what)
    while True:
        attempt = clock.begin()
        try:
            return swap_in(table, prepared)
        except CommitFailedException:
            if not lost:
                raise
            # Refused: by a change of someone else's, or by the copy whose answer was lost
            # having landed first. The table says which.
        except Exception as exc:  # noqa: BLE001 - the policy raises what it does not retry
            # A lost answer (or a lock: read back too, it costs one load) waits as the policy
            # says; then the table is read.
            clock.failed(exc, attempt, doing=what, changes_table=True, retry_on=_SETTLED, exhausted=unknown)
            if not lost:
                log.warning("lakesink: %s: the catalog's answer was lost (%s); reading the table to see whether it landed",
                            what, first_line(exc))
            lost = True
        reloaded = clock.run(
            lambda: sql_commit.load_table(catalog, identifier), doing=f"{what}, reading the table back",
            retry_on=_READS, exhausted=unknown,
        )
        if holds(reloaded.metadata, prepared):
            log.warning("lakesink: %s landed although its answer was lost", what)
            return reloaded
        if _head_id(reloaded.metadata, prepared.branch) != expected_head:
            raise CommitFailedException(f"{what}: another commit landed first; this one did not land")
        # Not landed (yet): the same commit again, on the same head (the policy paused
        # after the failure already).
        table = reloaded
