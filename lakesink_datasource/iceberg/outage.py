"""What counts as an object store (or catalog) that is briefly away: restarting, overloaded,
cut off.

A stream must not stop because S3 or its REST catalog restarted for a minute. Every file
lakesink reads or writes goes through its FileIO (iceberg/file_io.py), which retries the
operation when it fails for a reason that passes by itself (connection refused or reset, a
timeout, a 5xx, throttling); this module says which errors those are. How long they are
waited for is the retry policy's (iceberg/retry.py): the table property
`lakesink.outage-timeout-ms` (default five minutes, the order of a store's restart;
Iceberg's own commit retries default to thirty), of each operation's time spent failing.
"""

from __future__ import annotations

import errno
import re

OUTAGE_TIMEOUT_MS = "lakesink.outage-timeout-ms"
DEFAULT_OUTAGE_MS = 300_000


# What an I/O error's errno says: the connection failed, broke or timed out.
_TRANSIENT_ERRNO = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ENETDOWN, errno.EAGAIN,
})
# pyarrow's S3 client words its own failures (no AWS error code in them) so: whole phrases
# of its curl and socket errors, never a bare number (`00503-<uuid>.metadata.json` names a
# file, not a status).
_TRANSIENT_PHRASES = (
    "connection refused",
    "couldn't connect",
    "could not connect",
    "failed to connect",
    "connection reset",
    "connection was closed",
    "broken pipe",
    "timed out",
    "temporarily unavailable",
    "unable to connect",
)


# pyarrow's S3 client names the AWS SDK's error type in its messages ("AWS Error SLOW_DOWN
# during PutObject operation: Please reduce your request rate."; an UNKNOWN one with its
# HTTP status): classified by that code, not by the wording around it.
_AWS_ERROR = re.compile(r"AWS Error ([A-Z_]+)")
_HTTP_STATUS = re.compile(r"HTTP (?:status|response)(?: code)?:? ?(\d{3})", re.IGNORECASE)
TRANSIENT_AWS_ERRORS = frozenset({
    "SLOW_DOWN", "SERVICE_UNAVAILABLE", "THROTTLING", "THROTTLING_EXCEPTION", "REQUEST_LIMIT_EXCEEDED",
    "PROVISIONED_THROUGHPUT_EXCEEDED", "TOO_MANY_REQUESTS", "REQUEST_TIMEOUT", "INTERNAL_FAILURE", "INTERNAL_ERROR",
    "NETWORK_CONNECTION", "REQUEST_TIME_TOO_SKEWED",
})
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def aws_error_transient(message: str) -> bool | None:
    """Whether the AWS error `message` names passes by itself; None if it names none."""
    found = _AWS_ERROR.search(message)
    if found is None:
        return None
    code = found.group(1)
    if code in TRANSIENT_AWS_ERRORS:
        return True
    status = _HTTP_STATUS.search(message)
    return status is not None and int(status.group(1)) in _TRANSIENT_STATUS


def is_transient_io(exc: BaseException) -> bool:
    """Whether an I/O error says the store is briefly unavailable (worth waiting for). A
    missing object, refused credentials or a bad request are not."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if not isinstance(exc, OSError) or isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if exc.errno is not None:
        return exc.errno in _TRANSIENT_ERRNO
    by_code = aws_error_transient(str(exc))
    if by_code is not None:
        return by_code
    status = _HTTP_STATUS.search(str(exc))
    if status is not None:
        return int(status.group(1)) in _TRANSIENT_STATUS
    message = str(exc).lower()
    return any(phrase in message for phrase in _TRANSIENT_PHRASES)
