"""The errors of the catalog layer."""

from __future__ import annotations

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.retry import RetriesSpent


class CatalogError(LakesinkError, RuntimeError):
    """The catalog a write names cannot be configured, reached, or trusted."""


class CatalogUnavailable(CatalogError, RetriesSpent):
    """A catalog call kept failing with transient errors until the retry budget was spent
    (no layer above waits for it again)."""

    def __init__(self, message: str, last: BaseException, attempts: int):
        super().__init__(message)
        self.last = last
        self.attempts = attempts
