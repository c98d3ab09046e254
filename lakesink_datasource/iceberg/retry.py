"""One retry policy for every wait lakesink makes: what a failure is, how long it is waited
for, and when waiting stops.

Modelled on Iceberg Java's `Tasks` (every commit there retries through one builder whose
numbers come from the table's `commit.retry.*`, with one deadline per operation) and on
`SnapshotProducer.commit` (a commit whose state is unknown is never sent again blindly).
A failure is one of:

- `RACE`: another writer committed first (`CommitFailedException`). The caller rebuilds on
  the new state (its own work: the commit loop reloads and produces again) and tries again.
- `LOCKED`: another client holds what the call needs: SQLite's SQLITE_BUSY after its own
  5 s wait, or (`Busy`) a table another writer is creating right now.
- `AWAY`: a store or catalog that does not answer: connection refused, reset or cut off
  mid-answer, a timeout, a 5xx, throttling. Told apart by type and status, never by the
  words of a message: each catalog kind's client errors by catalog/failures.py (registered
  here: this layer imports no catalog client), the object store's by `outage.is_transient_io`.
- `ANSWER_LOST`: a call that changes the table failed the `AWAY` way, or with Iceberg's
  `CommitStateUnknownException`: it may have landed. It is never sent again before the
  table, read again, says what happened (the caller's reads: `commit/lost_answer.py`,
  the commit loop, staging).
- `FINAL`: anything else, and an error raised once a budget was spent (`RetriesSpent`):
  raised at once, through every layer.

Not retrying is not knowing: once a commit request was sent, only `not_applied` (a 409, a
refusal the catalog answered before applying) proves the commit did not apply. Every other
outcome, FINAL included, is unknown: the commit's files stay until the table, read again,
says whether it landed (catalog/commit_loop.py, the one loop every commit runs in).

Each kind's budget comes from the table's own settings (`RetryPolicy.of(TableSettings)`):

- `RACE` and `LOCKED`: Iceberg's `commit.retry.*`: `num-retries` more attempts (counted per
  kind), within `total-timeout-ms` of the operation's start, waits doubling from
  `min-wait-ms` (a lock: at least 0.5 s, what a database takes to let go) up to
  `max-wait-ms`;
- `AWAY` and `ANSWER_LOST`: `lakesink.outage-timeout-ms` of time spent failing (the failed
  attempts and the waits after them), waits doubling from 0.5 s up to 10 s.
Every wait is that one formula (`Backoff.wait`), with a quarter of jitter either way.

One clock per operation (`RetryClock`, from `RetryPolicy.start`): a task, a write's
planning, a batch's commit with all it does (its tombstones, the compaction it lands, its
maintenance), an abort, a maintenance command. Every layer of the operation retries on that
one clock, so a nested retry spends the same budget, and once it is spent the error goes up
through every layer without another wait. The clock is passed explicitly. Only the FileIO,
which pyiceberg calls with no room for it, takes the operation's clock from a context
variable (`RetryClock.active`): each thread sets its own (a routed commit's tables commit in
threads of their own, each with its table's budget); a file call outside any operation gets
a clock of its own from its table's properties (`current`).

All waiting happens here: no other module of the package sleeps to retry (a test reads the
package for it).
"""

from __future__ import annotations

import contextvars
import enum
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.outage import DEFAULT_OUTAGE_MS, OUTAGE_TIMEOUT_MS, is_transient_io
from lakesink_datasource.iceberg.properties import (
    COMMIT_MAX_RETRY_WAIT_MS,
    COMMIT_MIN_RETRY_WAIT_MS,
    COMMIT_NUM_RETRIES,
    COMMIT_TOTAL_RETRY_TIME_MS,
    PropertyError,
    TableSettings,
)

__all__ = [
    "ANY", "Backoff", "Busy", "Failure", "RetriesSpent", "RetryClock", "RetryPolicy", "Spent", "StoreUnavailable",
    "active", "classify", "current", "first_line", "not_applied", "register",
]

log = logging.getLogger("lakesink")

T = TypeVar("T")


class Failure(enum.Enum):
    RACE = "race"
    LOCKED = "locked"
    AWAY = "away"
    ANSWER_LOST = "answer lost"
    FINAL = "final"


ANY = frozenset({Failure.RACE, Failure.LOCKED, Failure.AWAY, Failure.ANSWER_LOST})
_WAITS = frozenset({Failure.LOCKED, Failure.AWAY})  # what `run` retries unless told otherwise


class RetriesSpent(Exception):
    """Raised once a retry budget was spent: no layer above waits for it again."""


class StoreUnavailable(LakesinkError, OSError, RetriesSpent):
    """The object store kept failing past the outage budget. A LakesinkError (its message
    names the budget's property) and still an OSError, as pyiceberg's FileIO callers expect."""


class Busy(Exception):
    """What a call needs is held by another writer right now (a table being created): waited
    for as a lock."""


# --------------------------------------------------------------------------- classification

# What a catalog's client raised, by type and status (catalog/failures.py registers each
# catalog kind's rules: this layer imports no catalog client); None: not a client's error.
Classifier = Callable[[BaseException], Failure | None]
# Whether an error a commit request raised is the catalog's answer that it applied nothing.
Refusal = Callable[[BaseException], bool]
_CLASSIFIERS: list[Classifier] = []
_REFUSALS: list[Refusal] = []


def register(classifier: Classifier, refusal: Refusal | None = None) -> None:
    """Teach the policy a catalog kind's errors (catalog/failures.py, once per process)."""
    if classifier not in _CLASSIFIERS:
        _CLASSIFIERS.append(classifier)
    if refusal is not None and refusal not in _REFUSALS:
        _REFUSALS.append(refusal)


def _kind(exc: BaseException) -> Failure:
    """What `exc` is when no rule of a commit's own decides: a catalog client's error as its
    catalog kind says, else a connection that failed, a store that is away, or FINAL."""
    for classifier in _CLASSIFIERS:
        found = classifier(exc)
        if found is not None:
            return found
    if isinstance(exc, (ConnectionError, TimeoutError)) or is_transient_io(exc):
        return Failure.AWAY
    return Failure.FINAL


def classify(exc: BaseException, *, changes_table: bool = False) -> Failure:
    """What `exc` is, raised by a call that changes the table (a commit) or not."""
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    if isinstance(exc, RetriesSpent):
        return Failure.FINAL
    if isinstance(exc, CommitFailedException):
        return Failure.RACE
    if isinstance(exc, Busy):
        return Failure.LOCKED
    if isinstance(exc, CommitStateUnknownException):
        return Failure.ANSWER_LOST if changes_table else Failure.AWAY
    kind = _kind(exc)
    return Failure.ANSWER_LOST if kind is Failure.AWAY and changes_table else kind


def not_applied(exc: BaseException) -> bool:
    """Whether `exc`, raised once a commit request was sent, proves the commit did not apply:
    a 409 (`CommitFailedException`), or a refusal its catalog kind knows (a 4xx a REST catalog
    answered before applying, a routed swap never sent). Nothing else does, whatever its type
    (Iceberg Java's rule: anything else is `CommitStateUnknownException`): the commit's files
    stay until the table, read again, says whether it landed."""
    from pyiceberg.exceptions import CommitFailedException

    if isinstance(exc, CommitFailedException):
        return True
    return any(refusal(exc) for refusal in _REFUSALS)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (drivers and pydantic add many)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- the policy


class TimeSource(Protocol):
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class _RealTime:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


REAL_TIME: TimeSource = _RealTime()
_MIN_LOCK_WAIT_S = 0.5  # a database (or another writer's catalog call) takes seconds, not milliseconds
_MIN_AWAY_WAIT_S = 0.5
_MAX_AWAY_WAIT_S = 10.0


@dataclass(frozen=True)
class Backoff:
    """How one kind of failure is waited for."""

    retries: int | None  # more attempts after failures of this kind (None: as many as time allows)
    min_wait_s: float
    max_wait_s: float
    within_s: float  # how long in all
    failing_time: bool  # `within_s` counts the time spent failing (else: since the operation started)
    setting: str  # the table property that sets the budget, for the error that ends it

    def wait(self, failures: int) -> float:
        """The pause after the `failures`-th failure of this kind (1-based): doubling from
        `min_wait_s`, a quarter of jitter either way (writers that failed together do not
        come back together), never past `max_wait_s`."""
        return min(self.max_wait_s, self.min_wait_s * 2 ** max(0, failures - 1) * (0.75 + random.random() / 2))


def _lenient_int(props: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(str(props[name]).strip()) if name in props else default
    except ValueError:
        return default


@dataclass(frozen=True)
class RetryPolicy:
    """The budgets of each kind of failure, from one table's settings."""

    race: Backoff
    locked: Backoff
    away: Backoff
    time: TimeSource = REAL_TIME

    @classmethod
    def of(cls, settings: TableSettings, time: TimeSource = REAL_TIME) -> RetryPolicy:
        return cls._make(
            settings.commit_num_retries, settings.commit_min_retry_wait_ms, settings.commit_max_retry_wait_ms,
            settings.commit_total_retry_time_ms, settings.outage_timeout_ms, time,
        )

    @classmethod
    def from_properties(cls, props: Mapping[str, str], time: TimeSource = REAL_TIME) -> RetryPolicy:
        """From raw table properties (a FileIO's, a plan's options): the settings lakesink
        retries by, each that cannot be parsed at its default (planning refuses them)."""
        try:
            return cls.of(TableSettings.of(props), time)
        except PropertyError:
            pass
        defaults = TableSettings.of({})
        return cls._make(
            _lenient_int(props, COMMIT_NUM_RETRIES, defaults.commit_num_retries),
            _lenient_int(props, COMMIT_MIN_RETRY_WAIT_MS, defaults.commit_min_retry_wait_ms),
            _lenient_int(props, COMMIT_MAX_RETRY_WAIT_MS, defaults.commit_max_retry_wait_ms),
            _lenient_int(props, COMMIT_TOTAL_RETRY_TIME_MS, defaults.commit_total_retry_time_ms),
            _lenient_int(props, OUTAGE_TIMEOUT_MS, DEFAULT_OUTAGE_MS), time,
        )

    @classmethod
    def _make(cls, retries: int, min_ms: int, max_ms: int, total_ms: int, outage_ms: int, time: TimeSource) -> RetryPolicy:
        commit = "commit.retry.num-retries and commit.retry.total-timeout-ms"
        return cls(
            race=Backoff(retries, min_ms / 1000, max(min_ms, max_ms) / 1000, total_ms / 1000, False, commit),
            locked=Backoff(
                retries, max(min_ms / 1000, _MIN_LOCK_WAIT_S), max(max_ms / 1000, _MIN_LOCK_WAIT_S), total_ms / 1000, False,
                "commit.retry.num-retries and commit.retry.min-wait-ms",
            ),
            away=Backoff(None, _MIN_AWAY_WAIT_S, _MAX_AWAY_WAIT_S, outage_ms / 1000, True, OUTAGE_TIMEOUT_MS),
            time=time,
        )

    def backoff(self, kind: Failure) -> Backoff:
        if kind is Failure.RACE:
            return self.race
        if kind is Failure.LOCKED:
            return self.locked
        return self.away

    def start(self, what: str) -> RetryClock:
        """The clock of one operation (`what` it does, for messages)."""
        return RetryClock(self, what)


DEFAULT_POLICY = RetryPolicy.of(TableSettings.of({}))


@dataclass(frozen=True)
class Attempt:
    """When an attempt started, and how much failing time the clock had counted then."""

    at: float
    failing_s: float


@dataclass(frozen=True)
class Spent:
    """A budget that ran out: what for, and what to tell the user."""

    kind: Failure
    last: BaseException
    doing: str
    failures: int  # of this kind, in the operation
    seconds: float  # the operation's time, or its time spent failing (AWAY, ANSWER_LOST)
    backoff: Backoff

    def describe(self) -> str:
        """`doing` kept failing ..., and which setting waits longer."""
        how = f"{self.failures} time(s)" + (f" over {self.seconds:.0f} s" if self.seconds >= 1 else "")
        return (
            f"{self.doing} kept failing ({type(self.last).__name__}: {first_line(self.last)[:300]}; {how}); "
            f"to wait longer, raise table property {self.backoff.setting} (now {self.budget_text()})"
        )

    def budget_text(self) -> str:
        if self.backoff.failing_time:
            return f"{self.backoff.within_s * 1000:.0f} ms"
        return f"{self.backoff.retries} retries within {self.backoff.within_s * 1000:.0f} ms"


# Builds the error raised once a budget is spent (None: the failure itself is raised).
Exhausted = Callable[[Spent], BaseException]


class _Elapsed:
    """An operation's time: when it started, how long it spent failing (every scope's)."""

    def __init__(self, started: float):
        self.started = started
        self.failing_s = 0.0
        self.lock = threading.Lock()


class RetryClock:
    """One operation's retries: its start and time spent failing, shared by every layer of
    the operation, and the failures of each kind of this scope of it (see the module's
    docstring and `scoped`)."""

    def __init__(self, policy: RetryPolicy, what: str, elapsed: _Elapsed | None = None):
        self.policy = policy
        self.what = what
        self._time = policy.time
        self._elapsed = elapsed if elapsed is not None else _Elapsed(self._time.monotonic())
        self._failures: Counter[Failure] = Counter()

    def scoped(self, what: str | None = None) -> RetryClock:
        """A step of this operation with counts of its own: its races and locks are counted
        against `num-retries` apart from the other steps' (each commit gets its own
        attempts, as each commit does in Iceberg Java), while the operation's time budgets
        (its start, its time spent failing) stay the operation's."""
        return RetryClock(self.policy, what or self.what, self._elapsed)

    def adopt(self, policy: RetryPolicy) -> None:
        """Go on with `policy`'s budgets (the table's, once it is loaded), keeping what the
        operation spent so far."""
        self.policy = RetryPolicy(policy.race, policy.locked, policy.away, self._time)

    def failures(self, kind: Failure) -> int:
        return self._failures[kind]

    @property
    def failing_seconds(self) -> float:
        """The time the operation spent failing: failed attempts and the waits after them."""
        return self._elapsed.failing_s

    def begin(self) -> Attempt:
        return Attempt(self._time.monotonic(), self._elapsed.failing_s)

    def failed(
        self, exc: BaseException, attempt: Attempt, *, doing: str, changes_table: bool = False,
        retry_on: Collection[Failure] = ANY, exhausted: Exhausted | None = None,
    ) -> Failure:
        """After `attempt` failed with `exc`: its kind, once the pause before the next attempt
        is over. Raises `exc` when it is not to be retried (FINAL, or a kind not in
        `retry_on`), and `exhausted(...)` (else `exc`) once its budget is spent."""
        kind = classify(exc, changes_table=changes_table)
        if kind is Failure.FINAL or kind not in retry_on:
            raise exc
        backoff = self.policy.backoff(kind)
        elapsed = self._elapsed
        with elapsed.lock:
            now = self._time.monotonic()
            self._failures[kind] += 1
            failures = self._failures[kind]
            if backoff.failing_time:
                # The attempt's own time, less what retries nested inside it counted already.
                nested = elapsed.failing_s - attempt.failing_s
                elapsed.failing_s += max(0.0, now - attempt.at - nested)
                used = elapsed.failing_s
            else:
                used = now - elapsed.started
            over = used >= backoff.within_s or (backoff.retries is not None and failures > backoff.retries)
        if over:
            if exhausted is None:
                raise exc
            raise exhausted(Spent(kind, exc, doing, failures, used, backoff)) from exc
        wait = min(backoff.wait(failures), max(0.0, backoff.within_s - used))
        self._say(kind, doing, exc, used, wait, backoff)
        self._time.sleep(wait)
        if backoff.failing_time:
            with elapsed.lock:
                elapsed.failing_s += wait
        return kind

    def run(
        self, call: Callable[[], T], *, doing: str, retry_on: Collection[Failure] = _WAITS, exhausted: Exhausted | None = None,
    ) -> T:
        """`call()`, again after each failure the policy waits for (`retry_on`: locks and
        services away, unless told otherwise), within the operation's budgets."""
        while True:
            attempt = self.begin()
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - `failed` raises what it does not retry
                self.failed(exc, attempt, doing=doing, retry_on=retry_on, exhausted=exhausted)

    def _say(self, kind: Failure, doing: str, exc: BaseException, used: float, wait: float, backoff: Backoff) -> None:
        if kind in (Failure.AWAY, Failure.ANSWER_LOST):
            # On the driver's console (or the executor's log): a stream that waits says why.
            print(
                f"lakesink: {doing} failed ({first_line(exc)[:200]}); waiting for it to come back: retry in {wait:.1f} s, "
                f"{used:.0f} s of the {backoff.within_s:.0f} s outage budget (table property {OUTAGE_TIMEOUT_MS}) spent",
                file=sys.stderr, flush=True,
            )
        elif kind is Failure.LOCKED:
            log.warning("lakesink: %s: %s; retrying in %.1f s", doing, first_line(exc), wait)
        else:
            log.info("lakesink: %s lost a race (%s); trying again in %.2f s", doing, first_line(exc), wait)

    @contextmanager
    def active(self) -> Iterator[RetryClock]:
        """This clock for the FileIO's calls in this thread (and what it runs) meanwhile."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


_ACTIVE: contextvars.ContextVar[RetryClock | None] = contextvars.ContextVar("lakesink_retry_clock", default=None)


def active() -> RetryClock | None:
    """The clock of the operation this thread runs (`RetryClock.active`), if any."""
    return _ACTIVE.get()


def current(properties: Mapping[str, str], what: str) -> RetryClock:
    """The clock of the operation this thread runs, else (a call outside any operation) one
    of its own with the budgets of `properties` (a table's, as its FileIO holds them)."""
    clock = _ACTIVE.get()
    return clock if clock is not None else RetryPolicy.from_properties(properties).start(what)


def store_unavailable(spent: Spent) -> StoreUnavailable:
    return StoreUnavailable(
        f"{spent.doing} kept failing for {spent.seconds:.0f} s ({type(spent.last).__name__}: {str(spent.last).strip()[:300]}): "
        f"the object store did not come back within the outage budget of {spent.backoff.within_s:.0f} s. Check that it "
        f"is up and reachable; to wait longer, raise table property {OUTAGE_TIMEOUT_MS}"
    )
