"""Several tables' commits applied together, or none of them: one micro-batch of a write
routed to many tables (`table_column`), on a catalog that can.

Each table's commit runs as it always does (its own thread, its own retries and lost-answer
rules, commit/committer.py) up to its compare-and-swap, where it hands its swap to the
transaction and waits. Once every table still in the batch has handed one in, they go to
the catalog in one request: a SQL catalog's rows change in one database transaction
(`sql_commit.swap_together`); a REST catalog gets `POST /v1/{prefix}/transactions/commit`.
Every waiting table then gets the one outcome: all landed, all refused (each rebuilds on the
table as it now is and hands in again: the next round), or the answer lost (each reads its
table again, as after any lost answer: all landed or none). A table whose commit ends
without a swap (the batch already there, nothing to commit) leaves the transaction; one
that fails before handing in aborts it, and the swaps waiting are refused, none sent.

A catalog without the endpoint (a REST catalog answering 404, 405 or 501 to it, which
applies nothing) is found on the first round: from then on each table swaps on its own,
one after another, and `atomic` says so.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import CommitTableRequest, CommitTableResponse, Table, TableIdentifier
from pyiceberg.table.update import TableRequirement, TableUpdate

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.faults import fault_point


class TransactionAborted(LakesinkError, RuntimeError):
    """Another table of the batch failed before its swap: this table's swap was not sent."""


@dataclass
class _Swap:
    table: Table
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]
    prepared: sql_commit.PreparedSwap | None = None
    outcome: CommitTableResponse | BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class TableTransaction:
    """A barrier of `parties` table commits; see the module's docstring."""

    def __init__(self, catalog: Catalog, parties: int) -> None:
        self._catalog = catalog
        self._active = parties
        self._waiting: list[_Swap] = []
        self._lock = threading.Condition()
        self._aborted: BaseException | None = None
        self.atomic = supports_transactions(catalog)
        self.rounds = 0  # requests sent (for the progress line and tests)

    def swap(self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        """This table's swap, sent with the others': returns its response, or raises what the
        round raised (CommitFailedException, a lost answer) or TransactionAborted."""
        if not self.atomic:
            return sql_commit.commit(table, requirements, updates)
        swap = _Swap(table, requirements, updates)
        if sql_commit.supports_swaps_together(self._catalog):
            # The metadata file is written here, in this table's thread, beside the others'.
            swap.prepared = sql_commit.prepare_swap(table, requirements, updates)
        with self._lock:
            if self._aborted is not None:
                raise TransactionAborted(f"not sent: another table of the batch failed ({self._aborted})")
            self._waiting.append(swap)
            ready = self._take_round()
        if ready is not None:
            self._send(ready)
        swap.done.wait()
        if isinstance(swap.outcome, BaseException):
            raise swap.outcome
        assert swap.outcome is not None
        return swap.outcome

    def leave(self, failure: BaseException | None = None) -> None:
        """This table's commit is over without (another) swap; `failure`: it failed, so no
        swap of the batch may be sent any more."""
        with self._lock:
            self._active -= 1
            if failure is not None and self._aborted is None:
                self._aborted = failure
                for waiting in self._waiting:
                    waiting.outcome = TransactionAborted(f"not sent: another table of the batch failed ({failure})")
                    _discard(waiting)
                    waiting.done.set()
                self._waiting = []
                return
            ready = self._take_round()
        if ready is not None:
            self._send(ready)

    def _take_round(self) -> list[_Swap] | None:
        """The round to send once every active table has handed in its swap (under the lock)."""
        if self._aborted is not None or not self._waiting or len(self._waiting) < self._active:
            return None
        ready, self._waiting = self._waiting, []
        self.rounds += 1
        return ready

    def _send(self, swaps: list[_Swap]) -> None:
        try:
            if sql_commit.supports_swaps_together(self._catalog):
                responses = sql_commit.swap_together([s.prepared for s in swaps if s.prepared is not None])
            else:
                responses = _commit_rest(self._catalog, swaps)
        except _Unsupported:
            # Nothing was applied: each goes on its own now.
            self.atomic = False
            for swap in swaps:
                try:
                    swap.outcome = sql_commit.commit(swap.table, swap.requirements, swap.updates)
                except BaseException as exc:  # noqa: BLE001 - raised again in the table's own thread
                    swap.outcome = exc
                swap.done.set()
            return
        except BaseException as exc:  # noqa: BLE001 - raised again in every table's own thread
            for swap in swaps:
                swap.outcome = exc
                swap.done.set()
            return
        for swap, response in zip(swaps, responses):
            swap.outcome = response
            swap.done.set()


def supports_transactions(catalog: Catalog) -> bool:
    """Whether lakesink can try to commit several of `catalog`'s tables together (a REST
    catalog may still turn out not to offer the endpoint: see the module's docstring)."""
    return sql_commit.supports_swaps_together(catalog) or _is_rest(catalog)


def _is_rest(catalog: Catalog) -> bool:
    # A RestCatalog exists only once pyiceberg's module is imported (requests with it).
    rest = sys.modules.get("pyiceberg.catalog.rest")
    return rest is not None and isinstance(catalog, rest.RestCatalog)


class _Unsupported(Exception):
    """The catalog does not offer multi-table commits (and applied nothing)."""


def _discard(swap: _Swap) -> None:
    if swap.prepared is not None:
        try:
            swap.table.io.delete(swap.prepared.location)
        except OSError:
            pass  # an orphan metadata file; nothing references it


def _commit_rest(catalog: Catalog, swaps: list[_Swap]) -> list[CommitTableResponse]:
    assert _is_rest(catalog)
    changes = [
        CommitTableRequest(
            identifier=TableIdentifier(namespace=list(s.table.name()[:-1]), name=s.table.name()[-1]),
            requirements=s.requirements, updates=s.updates,
        )
        for s in swaps
    ]
    body = '{"table-changes": [' + ", ".join(c.model_dump_json() for c in changes) + "]}"
    rest: Any = catalog
    response = rest._session.post(rest.url("transactions/commit", prefixed=True), data=body.encode())
    code = response.status_code
    if code in (404, 405, 501):
        raise _Unsupported(f"{code} {response.text[:200]}")
    if code == 409:
        raise CommitFailedException(f"the catalog refused the batch's tables' commit: {response.text[:500]}")
    if code >= 500:
        raise CommitStateUnknownException(f"{code} from the catalog's transaction commit: {response.text[:500]}")
    response.raise_for_status()
    fault_point("catalog_updated")  # tests: the transaction landed, its answer is lost
    # The endpoint answers with no body: each table as it now is.
    return [_loaded(catalog, s.table) for s in swaps]


def _loaded(catalog: Catalog, table: Table) -> CommitTableResponse:
    fresh = catalog.load_table(table.name())
    return CommitTableResponse(metadata=fresh.metadata, metadata_location=fresh.metadata_location)

