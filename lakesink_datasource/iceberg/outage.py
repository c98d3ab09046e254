"""Riding out an object store (or catalog) that is briefly away: restarting, overloaded, cut off.

A stream must not stop because S3 or its REST catalog restarted for a minute. Every file
lakesink reads or writes goes through its FileIO (iceberg/file_io.py), which retries the
operation when it fails for a reason that passes by itself (connection refused or reset, a
timeout, a 5xx, throttling), with waits doubling from half a second up to ten, until the
outage budget is spent: the table property `lakesink.outage-timeout-ms` (default five
minutes, the order of a store's restart; Iceberg's own commit retries default to thirty).
The same budget bounds the catalog's retries (catalog/transient.py) and the commit's.

The budget is per process: the driver sets it from the table's settings when it plans and
commits, a task when it starts. While waiting, a line on stderr says what on and for how long
(the driver's console, or the executor's log).
"""

from __future__ import annotations

import random
import re
import sys
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

OUTAGE_TIMEOUT_MS = "lakesink.outage-timeout-ms"
DEFAULT_OUTAGE_MS = 300_000
_MIN_WAIT_S = 0.5
_MAX_WAIT_S = 10.0

_budget_ms = DEFAULT_OUTAGE_MS


def set_budget(ms: int) -> None:
    """The outage budget of this process from now on (the table's setting)."""
    global _budget_ms
    _budget_ms = ms


def budget_ms() -> int:
    return _budget_ms


# Fragments of the messages object stores' clients give for errors that pass by themselves
# (pyarrow's S3 client: "AWS Error NETWORK_CONNECTION ... curlCode: 7, Couldn't connect to server").
_TRANSIENT = (
    "connection refused",
    "couldn't connect",
    "could not connect",
    "failed to connect",
    "connection reset",
    "connection was closed",
    "broken pipe",
    "network_connection",
    "curlcode",
    "timed out",
    "timeout",
    "slowdown",
    "slow down",
    "throttl",
    "service unavailable",
    "serviceunavailable",
    "internalerror",
    "internal error",
    "503",
    "500 internal",
    "502",
    "504",
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


class StoreUnavailable(OSError):
    """The object store kept failing past the outage budget."""


def is_transient_io(exc: BaseException) -> bool:
    """Whether an I/O error says the store is briefly unavailable (worth waiting for). A
    missing object, refused credentials or a bad request are not."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    if not isinstance(exc, OSError) or isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    by_code = aws_error_transient(str(exc))
    if by_code is not None:
        return by_code
    message = str(exc).lower()
    if "nosuchkey" in message or "not found" in message or "access denied" in message or "forbidden" in message:
        return False
    return any(fragment in message for fragment in _TRANSIENT)


def wait_seconds(attempt: int) -> float:
    """The pause after failed attempt `attempt` (0-based), with jitter."""
    return min(_MAX_WAIT_S, _MIN_WAIT_S * 2**attempt) * (0.75 + random.random() / 2)


def say_waiting(what: str, exc: BaseException, waited: float, wait: float, budget_s: float) -> None:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    print(
        f"lakesink: {what} failed ({first[:200]}); waiting for it to come back: retry in {wait:.1f} s, "
        f"{waited:.0f} s of the {budget_s:.0f} s outage budget (table property {OUTAGE_TIMEOUT_MS}) spent",
        file=sys.stderr, flush=True,
    )


def with_retries(call: Callable[[], T], what: str) -> T:
    """`call()`, retried while it fails with transient I/O errors and the outage budget lasts;
    past it, StoreUnavailable naming what failed and the budget."""
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient_io(exc):
                raise
            waited = time.monotonic() - started
            budget_s = _budget_ms / 1000
            if waited >= budget_s:
                raise StoreUnavailable(
                    f"{what} kept failing for {waited:.0f} s ({type(exc).__name__}: {str(exc).strip()[:300]}): the object "
                    f"store did not come back within the outage budget of {budget_s:.0f} s. Check that it is up and "
                    f"reachable; to wait longer, raise table property {OUTAGE_TIMEOUT_MS}"
                ) from exc
            wait = min(wait_seconds(attempt), max(0.1, budget_s - waited))
            say_waiting(what, exc, waited, wait, budget_s)
            time.sleep(wait)
            attempt += 1
