"""One compare-and-swap whose answer may be lost, settled by reading the table again.

A catalog can apply a commit and then fail to say so: a REST catalog's 503 or 504 from a
load balancer that timed out, a gateway restarted, a connection dropped after the UPDATE.
Iceberg Java calls that CommitStateUnknownException and never deletes the files of such a
commit, since the table may reference them. Here the table is read again (within the outage
budget) until it says what happened:

- it holds the commit: it landed, and the table read is the state after it;
- its branch moved on without it: the commit asserted the old head and can never land now,
  so it was refused and its files can go;
- neither (the branch is where the commit expects it): it did not land yet, and the same
  commit is sent again; a copy of it still in flight then either lands first (the resend is
  refused and the next read finds it) or is refused itself.

If the catalog stays away past the budget the outcome is unknown: CommitOutcomeUnknown, and
the caller keeps every file (orphan removal collects them if the commit never landed).
"""

from __future__ import annotations

import logging
import time

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.catalog.transient import first_line, is_answer_lost, is_transient
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.iceberg import outage
from lakesink_datasource.iceberg.history import branch_head

log = logging.getLogger("lakesink")


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


def swap_settled(table: Table, prepared: PreparedCommit, *, what: str) -> Table:
    """`swap_in(table, prepared)`, its answer settled when lost: returns a table state that
    holds the commit; CommitFailedException when it was (or can now only be) refused;
    CommitOutcomeUnknown when the catalog stays away past the outage budget. Any other error
    goes up as it is (the outcome of such a commit is unknown too: keep its files)."""
    identifier = ".".join(table.name())
    expected_head = _head_id(prepared.base, prepared.branch)
    lost: BaseException | None = None
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return swap_in(table, prepared)
        except CommitFailedException:
            if lost is None:
                raise
            # Refused: by a change of someone else's, or by the copy whose answer was lost
            # having landed first. The table says which.
        except Exception as exc:
            if not is_answer_lost(exc):
                raise
            lost = exc
            log.warning("lakesink: %s: the catalog's answer was lost (%s); reading the table to see whether it landed",
                        what, first_line(exc))
        assert lost is not None
        while True:
            waited = time.monotonic() - started
            if waited * 1000 >= outage.budget_ms():
                raise CommitOutcomeUnknown(
                    f"{what}: the catalog's answer was lost ({type(lost).__name__}: {first_line(lost)}) and it did not come "
                    f"back within the outage budget of {outage.budget_ms() / 1000:.0f} s to say whether the commit landed; "
                    f"its files are kept (orphan removal collects them if it did not). To wait longer, raise table property "
                    f"{outage.OUTAGE_TIMEOUT_MS}", lost, attempt + 1,
                ) from lost
            wait = outage.wait_seconds(attempt)
            attempt += 1
            try:
                reloaded = sql_commit.load_table(table.catalog, identifier)
                break
            except Exception as exc:
                if not is_transient(exc):
                    raise
                lost = exc
                outage.say_waiting(f"{what}, reading the table back,", exc, waited, wait, outage.budget_ms() / 1000)
                time.sleep(wait)
        if holds(reloaded.metadata, prepared):
            log.warning("lakesink: %s landed although its answer was lost", what)
            return reloaded
        if _head_id(reloaded.metadata, prepared.branch) != expected_head:
            raise CommitFailedException(f"{what}: another commit landed first; this one did not land")
        # Not landed (yet): the same commit again, on the same head, after the pause a
        # catalog that is failing its commits gets between tries.
        table = reloaded
        time.sleep(wait)
