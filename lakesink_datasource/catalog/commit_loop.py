"""One commit loop, for every commit lakesink makes: a batch's snapshot, a staged schema or
partition spec, the settling of a lost answer, an expiry, a compaction, a companion append.

In the shape of Iceberg Java's `Tasks.foreach(ops).retry(n).onlyRetryOn(...).run(commit)`
around `SnapshotProducer.commit`, over the retry policy's budgets (iceberg/retry.py):

1. attempt: `build` the commit on the table as it is (an error here sent nothing, and goes
   up as it is), then `send` it;
2. classify: what the failure is (a race, a lock, an answer lost, anything else), and
   whether it proves the commit did not apply (`not_applied`: the catalog's refusal);
3. settle: after any failure that does not prove it, the commit may have landed, so the
   table read next is asked first (`landed`), and `unknown` tells the caller to keep that
   attempt's files;
4. reload: the table read again, on the operation's clock; `decide` may end the loop there
   (the batch committed concurrently, the branch moved past a commit that must not be
   rebuilt);
5. give up: a failure not retried (`retry_on`), or a budget spent (`exhausted`'s error). If
   an attempt may have landed, the table is read back once more before that error goes up:
   a commit it holds is the outcome, and `not_landed` hears what it held otherwise; then
   `gave_up` deletes what the caller knows can go, and the error goes up.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Generic, TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.transient import read_back
from lakesink_datasource.iceberg.retry import ANY, Exhausted, Failure, RetryClock, not_applied

__all__ = ["CommitLoop", "Done"]

P = TypeVar("P")  # an attempt, built
T = TypeVar("T")  # the loop's outcome


@dataclass(frozen=True)
class Done(Generic[T]):
    """What `build` returns when there is nothing to commit: the loop's outcome."""

    value: T


@dataclass(frozen=True)
class CommitLoop(Generic[P, T]):
    """The commit of `identifier` in `catalog` (`doing`: what it does, for messages), retried
    on `clock` for the failures in `retry_on`, ended by `exhausted`'s error once a budget is
    spent (None: the failure itself)."""

    clock: RetryClock
    doing: str
    catalog: Catalog
    identifier: str
    build: Callable[[Table], P | Done[T]]
    send: Callable[[Table, P], T]
    landed: Callable[[Table], T | None]  # the outcome, when the table holds an attempt that may have landed
    decide: Callable[[Table], T | None] | None = None  # after a reload: an outcome that ends the loop
    unknown: Callable[[P], None] | None = None  # this attempt may have landed: its files stay
    not_landed: Callable[[Table], None] | None = None  # read back after giving up, holding none of the attempts
    gave_up: Callable[[], None] | None = None  # the loop gives up (after settling): the caller's files that may go, go
    retry_on: Collection[Failure] = ANY
    exhausted: Exhausted | None = None

    def run(self, table: Table) -> T:
        fresh = True  # `table` is the state the last attempt was built on, or was refused on
        maybe_landed = False  # an attempt was sent that may have landed
        while True:
            if not fresh:
                table = self.clock.run(self._load, doing=f"{self.doing}, reading the table", exhausted=self.exhausted)
                if maybe_landed and (found := self.landed(table)) is not None:
                    return found
                if self.decide is not None and (decided := self.decide(table)) is not None:
                    return decided
            built = self.build(table)
            if isinstance(built, Done):
                return built.value
            attempt = self.clock.begin()
            try:
                return self.send(table, built)
            except Exception as exc:  # noqa: BLE001 - classified below; what is not retried goes up
                if not not_applied(exc):
                    maybe_landed = True
                    if self.unknown is not None:
                        self.unknown(built)
                elif maybe_landed and isinstance(exc, CommitFailedException) and Failure.RACE not in self.retry_on:
                    # Refused after an attempt that may have landed: perhaps by that very
                    # attempt, landed first. Not a race of this loop's: the table says.
                    fresh = False
                    continue
                try:
                    self.clock.failed(
                        exc, attempt, doing=self.doing, changes_table=True, retry_on=self.retry_on, exhausted=self.exhausted,
                    )
                except Exception:  # given up: whether an attempt landed is the table's to say
                    if maybe_landed and (settled := self._settle()) is not None:
                        return settled
                    if self.gave_up is not None:
                        self.gave_up()
                    raise
            fresh = False

    def _load(self) -> Table:
        return sql_commit.load_table(self.catalog, self.identifier)

    def _settle(self) -> T | None:
        reread = read_back(self.catalog, self.identifier, what=self.doing, clock=self.clock)
        if reread is None:
            return None
        found = self.landed(reread)
        if found is None and self.not_landed is not None:
            self.not_landed(reread)
        return found
