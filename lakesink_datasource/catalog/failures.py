"""What each catalog's clients raise, told apart by type, status and error code (never by
the words of a message), for the retry policy (iceberg/retry.py, which imports no catalog
client and learns these rules from `register`).

- SQLite (the embedded catalog, through SQLAlchemy): SQLITE_BUSY and SQLITE_LOCKED are
  another client holding the database (`LOCKED`); any other error is `FINAL`.
- PostgreSQL (psycopg2, or psycopg 3): an OperationalError without a SQLSTATE never got an
  answer from the server (refused, reset, "SSL SYSCALL error: EOF detected"): `AWAY`; so
  are the SQLSTATEs of a connection lost or a server shutting down or starting (class 08,
  57P01-57P03, 53300); a serialization failure, deadlock or lock not available is `LOCKED`.
  SQLAlchemy's own disconnect and pool timeout are `AWAY`.
- REST (requests, urllib3, http.client, pyiceberg's REST errors): a connection refused,
  reset, cut off mid-answer (`ChunkedEncodingError`, `IncompleteRead`, `ProtocolError`) or
  timed out, and a 408, 429 or 5xx, are `AWAY`.
- The object store's own errors stay with the FileIO (iceberg/outage.py).

`refused` says when an error raised by a commit request proves that the commit did not
apply: a 409 (`CommitFailedException`, the retry policy's own), a 400, 401, 403 or 404 the
REST catalog answered before applying anything (Iceberg Java's `CleanableFailure`), a swap
of a routed write that was never sent. Nothing else does (see iceberg/retry.py's
`not_applied`): whatever else a commit raises, its outcome is read from the table.
"""

from __future__ import annotations

import functools
import importlib
import sqlite3

from lakesink_datasource.iceberg.retry import Failure, register

__all__ = ["classify_client_error", "refused"]

# SQLite's primary result codes (https://sqlite.org/rescode.html).
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
# PostgreSQL SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_PG_AWAY_CLASSES = ("08",)  # connection exception
_PG_AWAY = frozenset({"57P01", "57P02", "57P03", "53300"})  # admin/crash shutdown, cannot connect now, too many connections
_PG_LOCKED = frozenset({"40001", "40P01", "55P03"})  # serialization failure, deadlock, lock not available
_PG_KNOWN = _PG_AWAY | _PG_LOCKED | frozenset({"08000", "08001", "08003", "08004", "08006", "08007", "08P01"})
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def _sqlite(exc: BaseException) -> Failure | None:
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return Failure.LOCKED
    return Failure.FINAL


def _postgres(exc: BaseException) -> Failure | None:
    for module in ("psycopg2", "psycopg"):
        driver = _module(module)
        if driver is None or not isinstance(exc, driver.Error):
            continue
        state = getattr(exc, "pgcode", None) or getattr(exc, "sqlstate", None) or _state_of_class(module, exc)
        if state is None:
            # No SQLSTATE: the server never answered (the connection failed or broke).
            return Failure.AWAY if isinstance(exc, (driver.OperationalError, driver.InterfaceError)) else Failure.FINAL
        if state[:2] in _PG_AWAY_CLASSES or state in _PG_AWAY:
            return Failure.AWAY
        return Failure.LOCKED if state in _PG_LOCKED else Failure.FINAL
    return None


def _state_of_class(module: str, exc: BaseException) -> str | None:
    """The SQLSTATE the driver's error class stands for (psycopg2.errors.AdminShutdown:
    57P01), when the error does not carry one itself."""
    errors = _module(f"{module}.errors")
    if errors is None:
        return None
    for state in sorted(_PG_KNOWN):
        try:
            kind = errors.lookup(state)
        except KeyError:
            continue
        if isinstance(exc, kind):
            return state
    return None


def _sqlalchemy(exc: BaseException) -> Failure | None:
    sa = _module("sqlalchemy.exc")
    if sa is None:
        return None
    if isinstance(exc, (sa.DisconnectionError, sa.TimeoutError)):
        return Failure.AWAY
    if not isinstance(exc, sa.DBAPIError):
        return None
    if exc.connection_invalidated:
        return Failure.AWAY
    orig = exc.orig
    if orig is None:
        return Failure.FINAL
    return _sqlite(orig) or _postgres(orig) or (Failure.AWAY if isinstance(orig, (ConnectionError, TimeoutError)) else Failure.FINAL)


def _rest(exc: BaseException) -> Failure | None:
    from pyiceberg.exceptions import ServerError, ServiceUnavailableError, TooManyRequestsError

    if isinstance(exc, (ServerError, ServiceUnavailableError, TooManyRequestsError)):
        return Failure.AWAY
    requests = _module("requests.exceptions")
    if requests is not None:
        if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.ChunkedEncodingError)):
            return Failure.AWAY
        if isinstance(exc, requests.HTTPError):
            status = exc.response.status_code if exc.response is not None else None
            return Failure.AWAY if status in _TRANSIENT_STATUS else Failure.FINAL
    urllib3 = _module("urllib3.exceptions")
    if urllib3 is not None and isinstance(
        exc, (urllib3.ProtocolError, urllib3.TimeoutError, urllib3.NewConnectionError, urllib3.MaxRetryError)
    ):
        return Failure.AWAY
    import http.client

    if isinstance(exc, (http.client.IncompleteRead, http.client.RemoteDisconnected, http.client.BadStatusLine)):
        return Failure.AWAY
    return None


def classify_client_error(exc: BaseException) -> Failure | None:
    """What a catalog client's error is (None: no catalog client's; the policy goes on)."""
    return _sqlalchemy(exc) or _sqlite(exc) or _postgres(exc) or _rest(exc)


def refused(exc: BaseException) -> bool:
    """Whether `exc`, raised by a commit request, is the catalog's answer that it applied
    nothing (beyond the 409 the policy knows itself)."""
    from pyiceberg.exceptions import BadRequestError, ForbiddenError, NoSuchNamespaceError, NoSuchTableError, UnauthorizedError

    from lakesink_datasource.catalog.table_transaction import TransactionAborted

    return isinstance(exc, (BadRequestError, UnauthorizedError, ForbiddenError, NoSuchTableError, NoSuchNamespaceError, TransactionAborted))


@functools.cache
def _module(name: str):  # type: ignore[no-untyped-def]  # an optional client's module, or None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


register(classify_client_error, refused)
