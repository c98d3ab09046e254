"""Timeouts for a REST catalog's requests, under Iceberg Java's property names.

pyiceberg's REST client sends its requests with no timeout: a catalog (or a load balancer
in front of it) that accepts a commit and never answers would hold the stream forever.
lakesink gives every request of a REST catalog it loads the timeouts Iceberg Java's
HTTPClient takes, `rest.client.connection-timeout-ms` and `rest.client.socket-timeout-ms`
(catalog properties, so `catalog.rest.client.socket-timeout-ms` as a lakesink option). A
request that times out is a lost answer: a commit is then settled by reading the table
(commit/committer.py), never taken for refused.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.catalog import Catalog

CONNECTION_TIMEOUT_MS = "rest.client.connection-timeout-ms"
SOCKET_TIMEOUT_MS = "rest.client.socket-timeout-ms"
# Iceberg Java's defaults leave reads to wait up to three minutes; connecting to a catalog
# that is up takes milliseconds, and one that is away is waited out by the outage budget.
DEFAULT_CONNECTION_TIMEOUT_MS = 10_000
DEFAULT_SOCKET_TIMEOUT_MS = 180_000


def timeouts_of(properties: dict[str, str]) -> tuple[float, float]:
    """(connect, read) in seconds, from the catalog's properties (ValueError names a bad one)."""
    out = []
    for key, default in ((CONNECTION_TIMEOUT_MS, DEFAULT_CONNECTION_TIMEOUT_MS), (SOCKET_TIMEOUT_MS, DEFAULT_SOCKET_TIMEOUT_MS)):
        raw = properties.get(key)
        try:
            ms = default if raw is None else int(raw)
        except ValueError:
            ms = -1
        if ms <= 0:
            raise ValueError(f"catalog property {key} must be a positive number of milliseconds, got {raw!r}")
        out.append(ms / 1000)
    return out[0], out[1]


def apply_timeouts(catalog: Catalog, properties: dict[str, str]) -> None:
    """Give every request of `catalog`'s HTTP session the timeouts its properties name (a
    catalog that is not a REST one is left alone)."""
    session = getattr(catalog, "_session", None)
    if session is None or not hasattr(session, "request"):
        return
    timeouts = timeouts_of(properties)
    send = session.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = timeouts
        return send(method, url, *args, **kwargs)

    session.request = request
