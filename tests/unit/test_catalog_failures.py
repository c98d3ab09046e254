"""Each catalog kind's errors, by type and status (catalog/failures.py), and what proves a
commit did not apply (issue 60).

The errors are the clients' own types, as they raise them: requests and urllib3 on an
answer cut off, http.client, psycopg2's error classes (each stands for one SQLSTATE), a
real SQLite lock, pyiceberg's REST errors, and pyarrow's wording of S3 errors.
"""

from __future__ import annotations

import errno
import http.client
import json
import sqlite3

import psycopg2
import psycopg2.errors
import pytest
import requests
import requests.exceptions
import sqlalchemy.exc
import urllib3.exceptions
from lakesink_testing import sqlite_busy
from pyiceberg.exceptions import BadRequestError, CommitFailedException, CommitStateUnknownException, ServerError

from lakesink_datasource.catalog import failures  # noqa: F401  (registers the catalogs' rules)
from lakesink_datasource.catalog.table_transaction import TransactionAborted
from lakesink_datasource.iceberg.retry import Failure, classify, not_applied

CUT = http.client.IncompleteRead(b'{"metadata-location": "s3://', 2048)
CHUNKED = requests.exceptions.ChunkedEncodingError(urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead", CUT))
TRUNCATED_JSON = json.JSONDecodeError("Unterminated string starting at", '{"metadata-location": "s3://', 22)


def _http_error(status: int) -> requests.exceptions.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.exceptions.HTTPError(f"{status}", response=response)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # SQLite
        (sqlalchemy.exc.OperationalError("UPDATE", {}, sqlite_busy()), Failure.LOCKED),
        (sqlalchemy.exc.OperationalError("UPDATE", {}, sqlite3.OperationalError("disk I/O error")), Failure.FINAL),
        # PostgreSQL: no SQLSTATE (the server never answered), or the SQLSTATE of the class
        (sqlalchemy.exc.OperationalError("COMMIT", {}, psycopg2.OperationalError("SSL SYSCALL error: EOF detected")), Failure.AWAY),
        (psycopg2.errors.AdminShutdown("terminating connection due to administrator command"), Failure.AWAY),
        (psycopg2.errors.SerializationFailure("could not serialize access"), Failure.LOCKED),
        (psycopg2.errors.UndefinedTable('relation "iceberg_tables" does not exist'), Failure.FINAL),
        (sqlalchemy.exc.DisconnectionError("invalidated"), Failure.AWAY),
        # REST
        (CHUNKED, Failure.AWAY),
        (CUT, Failure.AWAY),
        (urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(errno.ECONNRESET, "reset")), Failure.AWAY),
        (http.client.RemoteDisconnected("Remote end closed connection without response"), Failure.AWAY),
        (requests.exceptions.ConnectTimeout("timed out"), Failure.AWAY),
        (_http_error(503), Failure.AWAY),
        (_http_error(404), Failure.FINAL),
        (ServerError("502 Bad Gateway"), Failure.AWAY),
        (TRUNCATED_JSON, Failure.FINAL),  # not a client's type: no rule claims it
        # The object store: by AWS error code or HTTP status, never a number in a name
        (OSError("AWS Error UNKNOWN (HTTP status 503) during GetObject operation"), Failure.AWAY),
        (OSError("When reading s3://w/t/metadata/00503-0f1e.metadata.json: AWS Error NO_SUCH_KEY during GetObject"), Failure.FINAL),
        (OSError("Cannot parse s3://w/t/metadata/00503-0f1e.metadata.json"), Failure.FINAL),
        (OSError("Unexpected end of s3://w/t/metadata/00502-ab.metadata.json (00504 bytes)"), Failure.FINAL),
        (OSError(errno.EIO, "Input/output error"), Failure.FINAL),
        (OSError(errno.ECONNRESET, "Connection reset by peer"), Failure.AWAY),
    ],
)
def test_each_clients_error_is_one_kind(error: BaseException, kind: Failure) -> None:
    assert classify(error) is kind
    # On a commit, an error that passes by itself may have landed: the table is read again.
    assert classify(error, changes_table=True) is (Failure.ANSWER_LOST if kind is Failure.AWAY else kind)


@pytest.mark.parametrize(
    "error",
    [
        CommitFailedException("Requirement failed: branch main has changed"),
        BadRequestError("Malformed request"),
        TransactionAborted("not sent: another table of the batch failed"),
    ],
)
def test_only_a_refusal_proves_a_commit_did_not_apply(error: BaseException) -> None:
    assert not_applied(error)


class UnlistedError(Exception):
    pass


@pytest.mark.parametrize(
    "error",
    [
        CHUNKED, CUT, TRUNCATED_JSON, CommitStateUnknownException("504"), ServerError("502 Bad Gateway"),
        sqlalchemy.exc.OperationalError("COMMIT", {}, psycopg2.OperationalError("SSL SYSCALL error: EOF detected")),
        sqlite3.DatabaseError("database disk image is malformed"), OSError(errno.EIO, "Input/output error"),
        UnlistedError("nobody's"), ValueError("a bug"),
    ],
)
def test_any_other_error_leaves_the_outcome_unknown(error: BaseException) -> None:
    assert not not_applied(error)
