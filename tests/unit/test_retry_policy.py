"""The one retry policy (iceberg/retry.py): what each failure is, each kind's budget from the
table's own settings, one clock per operation shared by every layer, one per thread.

Waits run on a virtual clock (`VirtualTime`: a pause moves it on at once), so the budgets
are checked exactly, with no real waiting and no timing threshold. The failures are the
real exception types lakesink meets (SQLAlchemy's wrapping sqlite3's lock, pyiceberg's
commit exceptions, a refused connection, S3 errors as pyarrow words them).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy.exc
from lakesink_testing import sqlite_busy
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, ServerError

import lakesink_datasource
from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.outage import OUTAGE_TIMEOUT_MS
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import (
    ANY,
    Busy,
    Failure,
    RetryPolicy,
    StoreUnavailable,
    classify,
    current,
    store_unavailable,
)


def _sqlite_lock() -> sqlalchemy.exc.OperationalError:
    """SQLite's own "database is locked", as SQLAlchemy wraps it."""
    return sqlalchemy.exc.OperationalError("UPDATE iceberg_tables", {}, sqlite_busy())


LOCKED = _sqlite_lock()
REFUSED = ConnectionRefusedError("[Errno 111] Connection refused")
STORE_AWAY = OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Couldn't connect to server")


class VirtualTime:
    """A monotonic clock that pauses move on at once (and calls may take time: `spend`)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def spend(self, seconds: float) -> None:
        self.now += seconds


def policy(time: VirtualTime, **props: str) -> RetryPolicy:
    return RetryPolicy.of(TableSettings.of(props), time)


def failing(*errors: BaseException, then: object = "done") -> tuple[Callable[[], object], list[int]]:
    """A call that raises `errors` one by one, then returns `then`; and its attempt count."""
    calls: list[int] = []
    pending = list(errors)

    def call() -> object:
        calls.append(1)
        if pending:
            raise pending.pop(0)
        return then

    return call, calls


# ----------------------------------------------------------------------------- what a failure is


@pytest.mark.parametrize(
    ("error", "changes_table", "kind"),
    [
        (CommitFailedException("Requirement failed: branch main has changed"), True, Failure.RACE),
        (LOCKED, False, Failure.LOCKED),
        (LOCKED, True, Failure.LOCKED),
        (Busy("being created"), False, Failure.LOCKED),
        (REFUSED, False, Failure.AWAY),
        (REFUSED, True, Failure.ANSWER_LOST),  # a commit that may have landed
        (ServerError("503 Service Unavailable"), True, Failure.ANSWER_LOST),
        (CommitStateUnknownException("504 Gateway Timeout"), True, Failure.ANSWER_LOST),
        (STORE_AWAY, False, Failure.AWAY),
        (OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate"), False, Failure.AWAY),
        (StoreUnavailable("writing s3://b/x kept failing"), False, Failure.FINAL),  # a budget already spent
        (CatalogUnavailable("catalog kept failing", REFUSED, 3), False, Failure.FINAL),
        (FileNotFoundError("s3://plain/missing.parquet"), False, Failure.FINAL),
        (OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied"), False, Failure.FINAL),
        (ValueError("not a service's failure"), True, Failure.FINAL),
    ],
)
def test_each_failure_is_one_kind(error: BaseException, changes_table: bool, kind: Failure) -> None:
    assert classify(error, changes_table=changes_table) is kind


def test_the_budgets_come_from_the_tables_settings() -> None:
    own = RetryPolicy.of(TableSettings.of({
        "commit.retry.num-retries": "7", "commit.retry.min-wait-ms": "200", "commit.retry.max-wait-ms": "3000",
        "commit.retry.total-timeout-ms": "60000", OUTAGE_TIMEOUT_MS: "42000",
    }))
    assert (own.race.retries, own.race.min_wait_s, own.race.max_wait_s, own.race.within_s) == (7, 0.2, 3.0, 60.0)
    assert (own.locked.retries, own.locked.min_wait_s) == (7, 0.5)  # a lock: at least half a second
    assert (own.away.within_s, own.away.failing_time) == (42.0, True)
    # Raw properties (a FileIO's): a value planning would refuse falls back to the default.
    assert RetryPolicy.from_properties({OUTAGE_TIMEOUT_MS: "soon", "commit.retry.num-retries": "2"}).race.retries == 2


# ----------------------------------------------------------------------------- each kind's budget


def test_a_race_is_tried_again_num_retries_times_with_waits_doubling() -> None:
    time = VirtualTime()
    clock = policy(time, **{"commit.retry.num-retries": "3", "commit.retry.min-wait-ms": "100"}).start("committing")
    call, calls = failing(*[CommitFailedException("moved")] * 10)
    with pytest.raises(CommitFailedException):
        clock.run(call, doing="committing to db.t", retry_on=ANY)
    assert len(calls) == 4  # the first attempt and num-retries more
    assert len(time.pauses) == 3
    for n, pause in enumerate(time.pauses):
        assert 0.1 * 2**n * 0.75 <= pause <= 0.1 * 2**n * 1.25  # one formula, a quarter of jitter


def test_a_lock_waits_at_least_half_a_second_and_ends_with_the_catalogs_error() -> None:
    time = VirtualTime()
    clock = policy(time, **{"commit.retry.num-retries": "2", "commit.retry.min-wait-ms": "10"}).start("planning")
    call, calls = failing(*[LOCKED] * 5)
    with pytest.raises(CatalogUnavailable, match=r"catalog 'c': loading table db\.t kept failing .*database is locked.*"
                                                 r"commit\.retry\.num-retries and commit\.retry\.min-wait-ms") as failed:
        catalog_call(clock, call, what="loading table db.t", catalog="catalog 'c'")
    assert len(calls) == 3 and failed.value.attempts == 3
    assert min(time.pauses) >= 0.5 * 0.75


def test_a_service_that_comes_back_within_the_outage_budget_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    time = VirtualTime()
    clock = policy(time).start("a task")
    call, calls = failing(STORE_AWAY, STORE_AWAY, then="read")
    assert clock.run(call, doing="opening s3://plain/a.json", exhausted=store_unavailable) == "read"
    assert len(calls) == 3
    assert "opening s3://plain/a.json failed" in capsys.readouterr().err  # it said what it waits for


def test_an_outage_ends_at_the_budget_counting_the_failing_attempts_too() -> None:
    time = VirtualTime()
    clock = policy(time, **{OUTAGE_TIMEOUT_MS: "20000"}).start("a task")

    def slow_failure() -> None:
        time.spend(3.0)  # each attempt takes 3 s to fail (a connection timing out)
        raise STORE_AWAY

    with pytest.raises(StoreUnavailable, match=rf"opening s3://b/x kept failing .*outage budget of 20 s.*{OUTAGE_TIMEOUT_MS}") as spent:
        clock.run(slow_failure, doing="opening s3://b/x", exhausted=store_unavailable)
    # lakesink's own error (Spark shows it without lakesink's frames), and still an OSError to FileIO's callers.
    assert isinstance(spent.value, LakesinkError) and isinstance(spent.value, OSError)
    # Attempts and pauses together: the budget, and never a pause past it.
    assert clock.failing_seconds == pytest.approx(20.0, abs=3.0) and clock.failing_seconds >= 20.0
    assert time.now - 1000.0 == pytest.approx(clock.failing_seconds)


def test_a_final_error_is_raised_at_once() -> None:
    time = VirtualTime()
    clock = policy(time).start("planning")
    call, calls = failing(PermissionError("s3://b/t/metadata: Access Denied"))
    with pytest.raises(PermissionError):
        clock.run(call, doing="loading table db.t", retry_on=ANY)
    assert calls == [1] and time.pauses == []


def test_a_commit_whose_answer_was_lost_is_not_sent_again_by_run() -> None:
    """`run` retries locks and services away; a commit that may have landed goes back to its
    caller, who reads the table (commit/lost_answer.py), never sent blindly."""
    time = VirtualTime()
    clock = policy(time).start("committing")
    attempt = clock.begin()
    assert clock.failed(CommitStateUnknownException("504"), attempt, doing="committing", changes_table=True) is Failure.ANSWER_LOST
    with pytest.raises(CommitStateUnknownException):
        clock.failed(CommitStateUnknownException("504"), clock.begin(), doing="committing", changes_table=True,
                     retry_on=[Failure.LOCKED, Failure.AWAY])


# ----------------------------------------------------------------------------- one clock per operation


def test_nested_calls_stop_at_the_one_budget_of_the_operation() -> None:
    """Three layers (as storing tombstones nests: its retry, the lost answer's reads, the
    FileIO's), each retrying a service that stays away: together they wait the operation's
    outage budget once, not once each, and the layers above do not wait again."""
    time = VirtualTime()
    clock = policy(time, **{OUTAGE_TIMEOUT_MS: "60000"}).start("storing the tombstones of db.t")
    inner_calls: list[int] = []

    def file_read() -> None:
        inner_calls.append(1)
        time.spend(0.2)
        raise STORE_AWAY

    def settle() -> None:
        clock.run(file_read, doing="reading s3://b/t/tombstones.parquet", exhausted=store_unavailable)

    def store() -> None:
        clock.run(settle, doing="appending to db.t__lakesink_tombstones", retry_on=ANY)

    with pytest.raises(StoreUnavailable):
        clock.run(store, doing="storing the tombstones of db.t", retry_on=ANY)
    assert 60.0 - 1e-9 <= time.now - 1000.0 <= 60.0 + 0.2 + 1e-9  # the one budget, and one failing attempt at most past it
    assert len(inner_calls) == len(time.pauses) + 1  # only the innermost layer waited


def test_a_scope_counts_its_own_races_and_shares_the_operations_time() -> None:
    time = VirtualTime()
    batch = policy(time, **{"commit.retry.num-retries": "1", OUTAGE_TIMEOUT_MS: "10000"}).start("committing batch 3")
    tombstones, commit = batch.scoped("storing tombstones"), batch.scoped("committing")
    tombstones.failed(CommitFailedException("moved"), tombstones.begin(), doing="storing tombstones")
    commit.failed(CommitFailedException("moved"), commit.begin(), doing="committing")  # its own first race
    away = tombstones.begin()
    time.spend(9.0)
    tombstones.failed(REFUSED, away, doing="storing tombstones")  # 9 s of 10 failing, and a pause
    assert 9.0 < batch.failing_seconds < 10.0
    again = commit.begin()
    time.spend(1.0)
    with pytest.raises(ConnectionRefusedError):  # the operation's outage budget is spent, whichever scope asks
        commit.failed(REFUSED, again, doing="committing")


def test_each_thread_sees_the_clock_of_its_own_operation() -> None:
    """A routed commit's tables commit in threads of their own: each table's FileIO calls
    wait on its own table's clock, not on a process-wide budget the other thread set."""
    budgets: dict[str, float] = {}
    ready = threading.Barrier(2)

    def commit(table: str, outage_ms: str) -> None:
        clock = RetryPolicy.of(TableSettings.of({OUTAGE_TIMEOUT_MS: outage_ms})).start(f"committing to {table}")
        with clock.active():
            ready.wait()  # both operations are active at once
            budgets[table] = current({}, "a file call").policy.away.within_s

    threads = [threading.Thread(target=commit, args=args) for args in (("db.a", "1000"), ("db.b", "600000"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budgets == {"db.a": 1.0, "db.b": 600.0}
    # Outside any operation: a clock of its own from the properties given (a table's FileIO's).
    assert current({OUTAGE_TIMEOUT_MS: "7000"}, "a file call").policy.away.within_s == 7.0


# ----------------------------------------------------------------------------- no other retry loop

# Modules that may pause, and why (none of them to retry a failure).
ALLOWED = {
    "iceberg/retry.py": "the policy: every retry's pause",
}


def test_no_module_but_the_policy_sleeps_or_backs_off() -> None:
    root = Path(lakesink_datasource.__file__).parent
    pattern = re.compile(r"\bsleep\(|\brandom\(\)|\*\*\s*\w*attempt|\b_ATTEMPTS\s*=|\bfor \w+ in range\(\w*attempts")
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "a wait or backoff outside iceberg/retry.py (use the retry policy):\n" + "\n".join(found)
