"""The driver's commit of a write routed to many tables: each table it touched, once.

Tables commit one after another, in name order, each as the single-table write it is (its
own snapshot, its replay check by query and batch, its maintenance). A batch Spark runs
again after the driver died between two tables skips the tables already holding it and
commits the rest. When a table's commit fails, the tables after it are not tried and their
files are deleted (they never landed); Spark then fails or retries the batch.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import msgspec
from pyspark.sql.datasource import WriterCommitMessage

from lakesink_datasource.messages import LakeSinkCommitMessage, RoutedTablesMessage
from lakesink_datasource.table.plan import WritePlan

log = logging.getLogger("lakesink")

_plan_decoder = msgspec.msgpack.Decoder(WritePlan)

TableCommit = Callable[[WritePlan, list[WriterCommitMessage | None], int | None], None]


def by_table(messages: list[WriterCommitMessage | None]) -> dict[str, tuple[WritePlan, list[WriterCommitMessage | None]]]:
    """Each table's plan (the first task's: every task's names the same write) and messages."""
    tables: dict[str, tuple[WritePlan, list[WriterCommitMessage | None]]] = {}
    for message in messages:
        if not isinstance(message, RoutedTablesMessage):
            continue
        for identifier, plan, payload in message.tables:
            if identifier not in tables:
                tables[identifier] = (_plan_decoder.decode(plan), [])
            tables[identifier][1].append(LakeSinkCommitMessage(payload))
    return tables


def commit_routed(messages: list[WriterCommitMessage | None], batch_id: int | None, commit: TableCommit, abort: TableCommit, progress: bool) -> None:
    tables = by_table(messages)
    names = sorted(tables)
    for i, identifier in enumerate(names):
        plan, table_messages = tables[identifier]
        try:
            commit(plan, table_messages, batch_id)
        except BaseException:
            for later in names[i + 1 :]:
                try:
                    abort(*tables[later], batch_id)
                except Exception:  # best effort: their files are orphans for orphan removal
                    log.warning("could not abort the routed write to %s", later, exc_info=True)
            raise
    if progress and names:
        where = f"batch {batch_id}" if batch_id is not None else "the write"
        print(f"lakesink: {where} routed to {len(names)} table(s), committed one after another", file=sys.stderr, flush=True)


def abort_routed(messages: list[WriterCommitMessage | None], batch_id: int | None, abort: TableCommit) -> None:
    for plan, table_messages in by_table(messages).values():
        abort(plan, table_messages, batch_id)
