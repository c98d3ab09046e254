"""The driver's commit of a write routed to many tables: each table it touched, once.

Where the catalog can (a SQL catalog, a REST catalog offering `transactions/commit`), the
batch's tables land together: each table's commit runs in a thread of its own, as a
single-table commit does (its replay check, retries, lost answers), and their swaps go to
the catalog as one transaction (catalog/table_transaction.py): all of the batch's tables
change, or none. Elsewhere, and past MAX_TOGETHER tables, tables commit one after another in
name order, each as the single-table write it is; a batch Spark runs again after the driver
died between two tables skips the tables already holding it (their snapshots name the query
and batch) and commits the rest. When a table's commit fails there, the tables after it are
not tried and their files are deleted (they never landed); Spark then fails or retries the
batch. The progress line says which way the batch went.
"""

from __future__ import annotations

import logging
import pickle
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import msgspec
from pyspark.sql.datasource import WriterCommitMessage

from lakesink_datasource.catalog import loader
from lakesink_datasource.catalog.table_transaction import TableTransaction, TransactionAborted, supports_transactions
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.debezium.decode import UNWRITTEN_TRUNCATES
from lakesink_datasource.debezium.naming import check_batch_sources
from lakesink_datasource.messages import LakeSinkCommitMessage, RoutedTablesMessage
from lakesink_datasource.table.plan import WritePlan, retry_clock

log = logging.getLogger("lakesink")


# Every table of a transaction waits in a thread of its own until all have their swap ready.
MAX_TOGETHER = 512

TableCommit = Callable[[WritePlan, list[WriterCommitMessage | None], int | None, TableTransaction | None], None]
TableAbort = Callable[[WritePlan, list[WriterCommitMessage | None], int | None], None]
Tables = dict[str, tuple[WritePlan, list[WriterCommitMessage | None]]]


def by_table(messages: list[WriterCommitMessage | None]) -> Tables:
    """Each table's plan (the first task's: every task's names the same write) and messages.
    A truncate one task met before the table existed applies to the table another task of
    the batch created (cdc_format=debezium): it goes into that table's plan."""
    tables: Tables = {}
    for message in messages:
        if not isinstance(message, RoutedTablesMessage):
            continue
        for identifier, plan, payload in message.tables:
            if identifier not in tables:
                decoded = pickle.loads(plan)  # a task's own plan (route_task.py): trusted as Spark's messages are
                # One progress line for the batch (commit_routed), not one per table.
                quiet = msgspec.structs.replace(decoded, options=msgspec.structs.replace(decoded.options, progress=False))
                tables[identifier] = (quiet, [])
            tables[identifier][1].append(LakeSinkCommitMessage(payload))
    for identifier, position in _unwritten_truncates(messages).items():
        if identifier in tables:
            table_plan, table_messages = tables[identifier]
            newest = max(position, table_plan.truncated_at or position)
            every = tuple(sorted({*table_plan.truncates, position}))
            tables[identifier] = (msgspec.structs.replace(table_plan, truncated_at=newest, truncates=every), table_messages)
    return tables


def _unwritten_truncates(messages: list[WriterCommitMessage | None]) -> dict[str, bytes]:
    truncates: dict[str, bytes] = {}
    for message in messages:
        if isinstance(message, RoutedTablesMessage):
            for identifier, position in message.truncates.items():
                truncates[identifier] = max(position, truncates.get(identifier, position))
    return truncates


def commit_routed(
    messages: list[WriterCommitMessage | None], batch_id: int | None, commit: TableCommit, abort: TableAbort,
    *, progress: bool, together: bool = True,
) -> str:
    """Commit every table the batch touched; returns how (for the progress line and tests)."""
    tables = by_table(messages)
    if not tables:
        return "no table"
    # Two tasks may each have read one of two source tables of one name (their own topics).
    check_batch_sources(m.sources for m in messages if isinstance(m, RoutedTablesMessage))
    names = sorted(tables)
    first = tables[names[0]][0]
    # Each table's commit waits on its own clock (its own budgets, in its own thread); the
    # batch's one catalog handle is opened on the first table's.
    catalog = catalog_call(
        retry_clock(first, f"committing batch {batch_id}"), lambda: loader.load(first.catalog), what="opening the catalog",
        catalog=loader.describe(first.catalog),
    )
    if together and 1 < len(names) <= MAX_TOGETHER and supports_transactions(catalog):
        transaction = TableTransaction(catalog, len(names))
        _commit_together(tables, names, batch_id, commit, abort, transaction)
        how = (
            f"committed together in one catalog transaction ({loader.describe(tables[names[0]][0].catalog)})" if transaction.atomic
            else "committed one after another (the catalog offers no multi-table commit)"
        )
    else:
        _commit_in_turn(tables, names, batch_id, commit, abort)
        how = "committed one after another" + (f" (more than {MAX_TOGETHER} tables)" if len(names) > MAX_TOGETHER else "")
    if progress:
        where = f"batch {batch_id}" if batch_id is not None else "the write"
        results = [m.result() for _, table_messages in tables.values() for m in table_messages if isinstance(m, LakeSinkCommitMessage)]
        rows_in = sum(r.stats.rows_in for r in results)
        written = sum(r.stats.rows_written for r in results)
        print(
            f"lakesink: {where} routed to {len(names)} table(s), {rows_in:,} rows in, {written:,} written, {how}{_notes(messages, tables)}",
            file=sys.stderr, flush=True,
        )
    return how


def _notes(messages: list[WriterCommitMessage | None], tables: Tables) -> str:
    """What a Debezium batch read besides rows: records skipped, change logs, truncates."""
    skipped: dict[str, int] = {}
    logs: set[str] = set()
    for m in messages:
        if isinstance(m, RoutedTablesMessage):
            for kind, count in m.skipped.items():
                skipped[kind] = skipped.get(kind, 0) + count
            logs.update(m.change_logs)
    truncated = sorted(
        name for name, (plan, table_messages) in tables.items()
        if plan.truncated_at is not None
        or any(isinstance(m, LakeSinkCommitMessage) and m.result().truncated_at is not None for m in table_messages)
    )
    unwritten = sorted(set(_unwritten_truncates(messages)) - set(tables))
    if unwritten:
        skipped[UNWRITTEN_TRUNCATES] = len(unwritten)
    notes = []
    if skipped:
        notes.append("skipped " + ", ".join(f"{count:,} {kind}" for kind, count in sorted(skipped.items())))
    if logs:
        notes.append(f"kept as change logs (no key at the source): {', '.join(sorted(logs))}")
    if truncated:
        notes.append(f"truncated at the source: {', '.join(truncated)}")
    return "".join(f"; {n}" for n in notes)


def _commit_together(
    tables: Tables, names: list[str], batch_id: int | None, commit: TableCommit, abort: TableAbort, transaction: TableTransaction
) -> None:
    def party(identifier: str) -> None:
        plan, table_messages = tables[identifier]
        try:
            commit(plan, table_messages, batch_id, transaction)
        except BaseException as exc:
            transaction.leave(exc)
            raise
        transaction.leave()

    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="lakesink-table-commit") as pool:
        futures = dict(zip(names, (pool.submit(party, identifier) for identifier in names)))
    failed = {name: exc for name, f in futures.items() if (exc := f.exception()) is not None}
    if not failed:
        return
    for name in failed:
        # As Spark's abort of a failed write: its files go unless the table says it landed.
        try:
            abort(*tables[name], batch_id)
        except Exception:  # best effort: their files are orphans for orphan removal
            log.warning("could not abort the routed write to %s", name, exc_info=True)
    # The first cause, not a TransactionAborted another table's failure made.
    causes = [exc for exc in failed.values() if not isinstance(exc, TransactionAborted)] or list(failed.values())
    raise causes[0]


def _commit_in_turn(tables: Tables, names: list[str], batch_id: int | None, commit: TableCommit, abort: TableAbort) -> None:
    for i, identifier in enumerate(names):
        plan, table_messages = tables[identifier]
        try:
            commit(plan, table_messages, batch_id, None)
        except BaseException:
            for later in names[i + 1 :]:
                try:
                    abort(*tables[later], batch_id)
                except Exception:  # best effort: their files are orphans for orphan removal
                    log.warning("could not abort the routed write to %s", later, exc_info=True)
            raise


def abort_routed(messages: list[WriterCommitMessage | None], batch_id: int | None, abort: TableAbort) -> None:
    for plan, table_messages in by_table(messages).values():
        abort(plan, table_messages, batch_id)
