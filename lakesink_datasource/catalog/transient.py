"""Waiting out a catalog that is briefly unavailable: locked, restarting, overloaded.

A catalog call that fails for a reason that goes away by itself (SQLite's "database is
locked" once its own 5 s busy wait ran out, a PostgreSQL connection reset or refused, a
REST catalog's 5xx or timeout) is retried with the table's `commit.retry.*` budget:
`num-retries` more attempts, waits doubling from `min-wait-ms` (at least half a second:
the services these errors come from take seconds, not milliseconds, to come back) up to
`max-wait-ms`, all within `total-timeout-ms`. With Iceberg's defaults that rides out a
SQLite lock of about 30 s. Anything else (a missing table, a refused compare-and-swap,
bad credentials) is not transient and is raised at once, as are errors once the budget is
spent, then as a `CatalogError` naming the catalog and what to do.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.iceberg import outage
from lakesink_datasource.iceberg.properties import TableSettings

log = logging.getLogger("lakesink")

T = TypeVar("T")

# Fragments of the messages of errors that pass by themselves (SQLAlchemy's OperationalError
# wraps the driver's: sqlite3's, psycopg2's).
_TRANSIENT_MESSAGES = (
    "database is locked",
    "database is busy",
    "database table is locked",
    "could not connect",
    "connection refused",
    "connection reset",
    "server closed the connection",
    "terminating connection",
    "the database system is starting up",
    "the database system is shutting down",
    "timeout expired",
    "timed out",
)
_MIN_TRANSIENT_WAIT_MS = 500
# Of those, the ones that say another client holds the database (not that it is away).
_LOCKED_MESSAGES = ("database is locked", "database is busy", "database table is locked")


@dataclass(frozen=True)
class RetryBudget:
    """How long to keep retrying: Iceberg's `commit.retry.*` table properties."""

    retries: int
    min_wait_ms: int
    max_wait_ms: int
    total_ms: int

    @classmethod
    def of(cls, settings: TableSettings) -> RetryBudget:
        return cls(
            settings.commit_num_retries, settings.commit_min_retry_wait_ms, settings.commit_max_retry_wait_ms,
            settings.commit_total_retry_time_ms,
        )

    def wait_seconds(self, attempt: int) -> float:
        """The pause after failed attempt `attempt` (0-based), with jitter."""
        wait_ms = min(self.max_wait_ms, max(self.min_wait_ms, _MIN_TRANSIENT_WAIT_MS) * 2**attempt)
        return wait_ms / 1000 * (0.75 + random.random() / 2)


DEFAULT_BUDGET = RetryBudget.of(TableSettings.of({}))


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` says the catalog is briefly unavailable (worth waiting for)."""
    from pyiceberg.exceptions import ServerError, ServiceUnavailableError
    from requests.exceptions import ConnectionError as RequestsConnectionError
    from requests.exceptions import Timeout
    from sqlalchemy.exc import DBAPIError, DisconnectionError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, (ServerError, ServiceUnavailableError, RequestsConnectionError, Timeout, DisconnectionError, PoolTimeout)):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        message = str(exc.orig if exc.orig is not None else exc).lower()
        return any(fragment in message for fragment in _TRANSIENT_MESSAGES)
    if isinstance(exc, (ConnectionResetError, ConnectionRefusedError, ConnectionAbortedError, TimeoutError)):
        return True
    # A catalog whose metadata lives on an object store that is away (a SQL catalog reading
    # the table's metadata file from S3).
    # (Not one whose own outage budget is spent already.)
    return outage.is_transient_io(exc) and not isinstance(exc, outage.StoreUnavailable)


def is_answer_lost(exc: BaseException) -> bool:
    """Whether a commit that failed with `exc` may have landed all the same: the catalog may
    have applied it before its answer was lost (a 5xx, a timeout, a reset or dropped
    connection) or said it does not know (Iceberg's CommitStateUnknownException). Only the
    table, read again, can tell; until then none of the commit's files may be deleted."""
    from pyiceberg.exceptions import CommitStateUnknownException

    return isinstance(exc, CommitStateUnknownException) or is_transient(exc)


def is_locked(exc: BaseException) -> bool:
    """A transient error that says another client holds the catalog's database (a lock), as
    opposed to the catalog being away (restarting, unreachable)."""
    message = str(getattr(exc, "orig", None) or exc).lower()
    return any(fragment in message for fragment in _LOCKED_MESSAGES)


def spent(exc: BaseException, attempt: int, elapsed_ms: float, budget: RetryBudget) -> bool:
    """Whether retrying after failed attempt `attempt` (0-based) is over: a lock is waited for
    with Iceberg's `commit.retry.*` budget; a catalog that is away, for the outage budget
    (`lakesink.outage-timeout-ms`, iceberg/outage.py), long enough for a restart."""
    if is_locked(exc):
        return attempt >= budget.retries or elapsed_ms >= budget.total_ms
    return elapsed_ms >= outage.budget_ms()


def retrying(call: Callable[[], T], *, what: str, catalog: str, budget: RetryBudget = DEFAULT_BUDGET) -> T:
    """`call()`, retried while it fails with transient errors and the budget lasts.
    `what` says what was being done ("loading table db.t"), `catalog` which catalog."""
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            elapsed_ms = (time.monotonic() - started) * 1000
            if spent(exc, attempt, elapsed_ms, budget):
                raise CatalogUnavailable(
                    f"{catalog} kept failing while {what}: {type(exc).__name__}: {first_line(exc)} "
                    f"({attempt + 1} attempt(s) over {elapsed_ms / 1000:.0f} s). Check that the catalog service is up and "
                    "reachable (for the embedded SQLite catalog: that no other process holds catalog.db locked); to wait "
                    "longer, raise table properties commit.retry.num-retries and commit.retry.min-wait-ms (a lock) or "
                    f"{outage.OUTAGE_TIMEOUT_MS} (a catalog that is away)",
                    exc, attempt + 1,
                ) from exc
            if is_locked(exc):
                wait = budget.wait_seconds(attempt)
                log.warning("lakesink: %s is unavailable while %s (%s); retrying in %.1f s", catalog, what, first_line(exc), wait)
            else:
                wait = outage.wait_seconds(attempt)
                outage.say_waiting(f"{catalog}, {what},", exc, elapsed_ms / 1000, wait, outage.budget_ms() / 1000)
            time.sleep(wait)
            attempt += 1


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (drivers and pydantic add many)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
