"""The errors of the catalog layer."""

from __future__ import annotations

from lakesink_datasource.errors import LakesinkError


class CatalogError(LakesinkError, RuntimeError):
    """The catalog a write names cannot be configured, reached, or trusted."""


class CatalogUnavailable(CatalogError):
    """A catalog call kept failing with transient errors until the retry budget was spent."""

    def __init__(self, message: str, last: BaseException, attempts: int):
        super().__init__(message)
        self.last = last
        self.attempts = attempts
