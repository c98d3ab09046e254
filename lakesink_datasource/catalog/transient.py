"""Catalog calls through the retry policy (iceberg/retry.py), and the end of its budget as a
`CatalogUnavailable` that names the catalog and what to do.

A catalog call that fails for a reason that goes away by itself is waited for on the clock
of the operation it belongs to: a lock (SQLite's "database is locked" once its own 5 s busy
wait ran out) with the table's `commit.retry.*` budget, a catalog that is away (a
PostgreSQL connection reset or refused, a REST catalog's 5xx or timeout) for its
`lakesink.outage-timeout-ms`. Anything else (a missing table, a refused compare-and-swap,
bad credentials) is raised at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.iceberg.retry import Exhausted, Failure, RetryClock, Spent, first_line

__all__ = ["catalog_call", "catalog_unavailable", "first_line", "read_back"]

log = logging.getLogger("lakesink")

T = TypeVar("T")

_WAITS = frozenset({Failure.LOCKED, Failure.AWAY})


def catalog_unavailable(catalog: str, prefix: str = "") -> Exhausted:
    """The error once a catalog call's budget is spent (`prefix`: what the caller was doing)."""

    def build(spent: Spent) -> CatalogUnavailable:
        return CatalogUnavailable(
            f"{prefix}{catalog}: {spent.describe()}. Check that the catalog service is up and reachable (for the "
            "embedded SQLite catalog: that no other process holds catalog.db locked)",
            spent.last, spent.failures,
        )

    return build


def catalog_call(
    clock: RetryClock, call: Callable[[], T], *, what: str, catalog: str, retry_on: Collection[Failure] = _WAITS
) -> T:
    """`call()` to `catalog` (`what` it does: "loading table db.t"), retried within the
    operation's budgets."""
    return clock.run(call, doing=what, retry_on=retry_on, exhausted=catalog_unavailable(catalog))


def read_back(catalog: Catalog, identifier: str, *, what: str, clock: RetryClock) -> Table | None:
    """The table read after a commit that failed in a way that does not say whether it
    applied (on the operation's clock: a budget already spent leaves one read); None when it
    cannot be read, and the outcome stays unknown (the caller keeps the commit's files)."""
    try:
        return clock.run(lambda: sql_commit.load_table(catalog, identifier), doing=f"{what}, reading the table back")
    except Exception as exc:  # noqa: BLE001 - unknown it stays
        log.warning("lakesink: %s: the table could not be read to see whether the commit landed (%s)", what, first_line(exc))
        return None
