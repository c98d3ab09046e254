"""`cdc_format=debezium` through the production path without Spark: the driver's check
(plan_routed_write), tasks as Spark's executors run them (write_routed_task, one per group of
Kafka topic-partitions), and the sink's commit (commit_routed with its per-table commit).

Each replica is compared with a plain model (tests/debezium_events.py) and read back by DuckDB
and pyiceberg: snapshot reads, updates, deletes and their tombstones, a truncate in the middle
of a batch and a lagging partition behind it, unchanged TOASTed values (from an earlier batch
and from earlier in the same batch), a MySQL binlog rotation, re-sent events after a connector
restart, a new column, a table without a key, with and without the schema wrapper.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import re
import tempfile
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from debezium_events import (
    ORDER_CASES,
    Column,
    Connector,
    Event,
    OrderCase,
    Replica,
    SourceDatabase,
    SourceTable,
    resent,
    to_arrow,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from lakesink_testing import duckdb_rows, embedded_catalog, load, pyiceberg_rows, table_exists
from pyspark.sql import types as T

from lakesink_datasource import datasource
from lakesink_datasource.check import check_table
from lakesink_datasource.debezium.connect_schema import DebeziumSchemaError
from lakesink_datasource.debezium.envelope import DebeziumInputError
from lakesink_datasource.index import environment
from lakesink_datasource.options import OptionError
from lakesink_datasource.routing.route_commit import commit_routed
from lakesink_datasource.routing.route_plan import plan_routed_write
from lakesink_datasource.routing.route_task import write_routed_task
from lakesink_datasource.schema.spark_types import SchemaError
from lakesink_datasource.write.task import TaskIdentity

KAFKA = T.StructType([
    T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
])
QUERY = "debezium-query"

CUSTOMERS = SourceTable("shop", "public", "customers", (
    Column("id", "int32", optional=False), Column("name", "string"), Column("bio", "string"), Column("balance", "decimal"),
    Column("born", "date"), Column("seen", "micro_timestamp"), Column("updated", "zoned_timestamp"),
), ("id",))
ORDERS = SourceTable("shop", "public", "orders", (
    Column("order_id", "int64", optional=False), Column("customer", "int32"), Column("total", "decimal", scale=3, precision=12),
    Column("notes", "json"),
), ("order_id",))
AUDIT = SourceTable("shop", "public", "audit", (Column("msg", "string"), Column("n", "int64")), ())
PRODUCTS = SourceTable("inventory", None, "products", (
    Column("sku", "string", optional=False), Column("name", "string"), Column("price", "decimal"), Column("weight", "float64"),
), ("sku",))
SQL_ORDERS = SourceTable("testDB", "dbo", "sales", (Column("id", "int32", optional=False), Column("qty", "int32"), Column("note", "string")), ("id",))


def _identifier(t: SourceTable) -> str:
    return f"replica.{t.table}"


class Replicator:
    """A stream of Debezium records written as Spark would: each batch's records split into
    tasks by Kafka topic-partition, each task a routed write, the batch committed together."""

    def __init__(self, warehouse: str, tasks: int = 2, **options: str) -> None:
        self.warehouse = warehouse
        self.tasks = tasks
        self.raw = {
            "cdc_format": "debezium", "namespace": "replica", "warehouse": warehouse, "index_dir": os.path.join(warehouse, "idx"),
            "progress": "false", "maintenance": "off", "checkpointLocation": os.path.join(warehouse, "chk"), **options,
        }
        self.batch = 0

    def run(self, records: Sequence[dict[str, Any]], *, batch_id: int | None = None, schema: T.StructType = KAFKA, arrow: pa.Schema | None = None) -> None:
        batch_id = self.batch if batch_id is None else batch_id
        write = plan_routed_write(self.raw, schema, False)
        by_task: list[list[dict[str, Any]]] = [[] for _ in range(self.tasks)]
        for r in records:
            # Stable across processes (str hashes are not): a failing example replays alike.
            by_task[zlib.crc32(f"{r.get('topic')}/{r.get('partition')}".encode()) % self.tasks].append(r)
        messages = [
            write_routed_task(
                write, iter(to_arrow(rows, arrow).to_batches() if arrow is not None else to_arrow(rows).to_batches()),
                TaskIdentity(partition_id=i, attempt=1000 * batch_id + i, batch_id=batch_id, query_id=QUERY),
            )
            for i, rows in enumerate(by_task)
        ]
        commit_routed(messages, batch_id, datasource._commit, datasource._abort, progress=False)
        self.batch = max(self.batch, batch_id + 1)

    def assert_replica(self, model: Replica, tables: Sequence[SourceTable]) -> None:
        for t in tables:
            name = _identifier(t)
            columns = [c.name for c in t.columns] + ([] if t.key else ["__op"])
            expected = model.rows(name, columns)
            if not table_exists(self.warehouse, name):
                assert expected == Counter(), f"{name} was never written, the model holds {expected}"
                continue
            table = load(self.warehouse, name)
            if table.metadata.current_snapshot() is None:
                assert expected == Counter()
                continue
            for reader, got in (("pyiceberg", pyiceberg_rows(table, columns)), ("DuckDB", duckdb_rows(table.metadata_location, columns))):
                assert got == expected, f"{name}: {reader} disagrees with the model\n  missing: {dict(expected - got)}\n  unexpected: {dict(got - expected)}"
            assert check_table(table) == [], f"{name}: check_table"


def _customer(i: int, **changes: Any) -> dict[str, Any]:
    row = {
        "id": i, "name": f"c{i}", "bio": f"a long biography {i} " * 20, "balance": f"{i * 7 % 1000}.{i % 100:02d}",
        "born": dt.date(1980, 1, 1) + dt.timedelta(days=i), "seen": dt.datetime(2024, 1, 1, 8, 0, 0, 123456) + dt.timedelta(minutes=i),
        "updated": dt.datetime(2024, 2, 1, 9, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))) + dt.timedelta(hours=i),
    }
    return {**row, **changes}


@pytest.mark.parametrize("wrapper", [True, False], ids=["schemas", "no-schemas"])
def test_a_postgresql_stream_is_replicated_exactly(warehouse: str, wrapper: bool) -> None:
    pg = SourceDatabase(Connector("postgresql", "pg", wrapper=wrapper, partitions=2), [CUSTOMERS, ORDERS, AUDIT], toasted=["bio"])
    replica = Replicator(warehouse)
    model = Replica(schemas=wrapper)
    seen = 0

    def flush(extra: Sequence[dict[str, Any]] = ()) -> None:
        nonlocal seen
        records = pg.records[seen:] + list(extra)
        events = pg.events[len(model_events):]
        seen = len(pg.records)
        replica.run(records)
        model.apply(events, _identifier)
        model_events.extend(events)
        tables = [CUSTOMERS, ORDERS, AUDIT] if wrapper else [ORDERS, AUDIT]
        replica.assert_replica(model, tables)

    model_events: list[Event] = []
    # The snapshot, then streaming; heartbeats and transaction markers in between.
    for i in range(6):
        pg.snapshot("customers", _customer(i))
    pg.snapshot("orders", {"order_id": 1, "customer": 1, "total": "10.500", "notes": '{"gift": true}'})
    flush([pg.connector.heartbeat(), pg.connector.transaction("BEGIN")])
    pg.update("customers", (1,), {"name": "renamed"})  # bio unchanged: the placeholder
    pg.update("customers", (1,), {"balance": "5.00"})  # again, in the same batch
    pg.delete("customers", (2,))  # and its tombstone
    pg.insert("audit", {"msg": "login", "n": 1})
    pg.insert("audit", {"msg": "login", "n": 1})  # a table without a key keeps both
    pg.insert("orders", {"order_id": 2, "customer": 3, "total": "-1.250", "notes": None})
    flush([pg.connector.transaction("END")])
    pg.update("customers", (3,), {"name": "later"})  # the placeholder's value is in an earlier batch
    pg.insert("customers", _customer(2))  # a deleted key comes back
    pg.truncate("orders")
    pg.insert("orders", {"order_id": 1, "customer": 9, "total": "3.000", "notes": "[]"})  # after the truncate: stays
    flush()
    pg.update("customers", (4,), {"bio": "rewritten"})
    pg.resend(3)  # the connector restarts: its last events come again
    flush()
    if wrapper:
        # The replica holds the source's rows now: no placeholder left anywhere.
        columns = [c.name for c in CUSTOMERS.columns]
        assert pyiceberg_rows(load(warehouse, "replica.customers"), columns) == pg.live("customers", columns)
        table = load(warehouse, "replica.customers").schema()
        assert str(table.find_field("balance").field_type) == "decimal(10, 2)"
        assert str(table.find_field("born").field_type) == "date"
        assert str(table.find_field("seen").field_type) == "timestamp"
        assert str(table.find_field("updated").field_type) == "timestamptz"
        assert [table.find_column_name(i) for i in table.identifier_field_ids] == ["id"]


def test_mysql_changes_after_a_binlog_rotation_win_over_earlier_files(warehouse: str) -> None:
    mysql = SourceDatabase(Connector("mysql", "my"), [PRODUCTS])
    replica = Replicator(warehouse)
    mysql.insert("products", {"sku": "a", "name": "apple", "price": "1.00", "weight": 0.2})
    for _ in range(30):
        mysql.update("products", ("a",), {"price": "1.50"})  # the position grows within the file
    mysql.connector.rotate()
    mysql.update("products", ("a",), {"name": "apple (new file)", "price": "2.00"})  # a low position in a new file
    replica.run(mysql.records)
    model = Replica()
    model.apply(mysql.events, _identifier)
    replica.assert_replica(model, [PRODUCTS])
    assert pyiceberg_rows(load(warehouse, "replica.products"), ["sku", "name"]) == Counter({("a", "apple (new file)"): 1})
    # The rotation's older events arriving late (a replay from an earlier offset) change nothing.
    mysql.resend(5)
    replica.run(mysql.records[-5:])
    assert pyiceberg_rows(load(warehouse, "replica.products"), ["sku", "name"]) == Counter({("a", "apple (new file)"): 1})


def test_sql_server_snapshot_rows_never_override_streamed_changes(warehouse: str) -> None:
    mssql = SourceDatabase(Connector("sqlserver", "ms", wrapper=False), [SQL_ORDERS])
    replica = Replicator(warehouse)
    mssql.snapshot("sales", {"id": 1, "qty": 1, "note": "snapshot"})
    mssql.update("sales", (1,), {"qty": 2, "note": "streamed"})
    # The snapshot's read of the row is delivered after the streamed change (another task).
    snapshot, streamed = mssql.records
    replica.run([streamed])
    replica.run([snapshot])
    assert pyiceberg_rows(load(warehouse, "replica.sales"), ["id", "qty", "note"]) == Counter({(1, 2, "streamed"): 1})


def test_a_truncate_hides_rows_of_other_tasks_and_of_a_partition_that_lags_behind_it(warehouse: str) -> None:
    pg = SourceDatabase(Connector("postgresql", "pg", partitions=3), [ORDERS])
    replica = Replicator(warehouse, tasks=3)
    for i in range(12):
        pg.insert("orders", {"order_id": i, "customer": i, "total": "1.000", "notes": None})
    replica.run(pg.records)
    before = len(pg.records)
    pg.insert("orders", {"order_id": 100, "customer": 1, "total": "2.000", "notes": None})  # before the truncate
    pg.truncate("orders")
    for i in (101, 102, 103):
        pg.insert("orders", {"order_id": i, "customer": 1, "total": "3.000", "notes": None})  # after it
    batch = pg.records[before:]
    truncate = next(r for r in batch if r["key"] is None)
    lagging = [r for r in batch if r is not truncate and r["partition"] != truncate["partition"]][:1]
    # One partition lags: its first record (ordered before or after the truncate) comes a batch later.
    replica.run([r for r in batch if r not in lagging])
    replica.run(lagging)
    model = Replica()
    model.apply(pg.events, _identifier)
    replica.assert_replica(model, [ORDERS])
    assert {row[0] for row in pyiceberg_rows(load(warehouse, "replica.orders"), ["order_id"])} == {101, 102, 103}


def test_a_truncate_in_the_batch_that_creates_its_table_hides_the_rows_another_task_wrote(warehouse: str) -> None:
    """The first batch of a table: one task writes its rows (creating it), another meets only
    its truncate (no table yet when it looked). The truncate applies to the new table."""
    pg = SourceDatabase(Connector("postgresql", "pg", partitions=2), [ORDERS])
    for i in range(6):
        pg.insert("orders", {"order_id": i, "customer": i, "total": "1.000", "notes": None})
    pg.truncate("orders")
    pg.insert("orders", {"order_id": 50, "customer": 1, "total": "2.000", "notes": None})  # after it
    replica = Replicator(warehouse, tasks=2)
    truncate = next(r for r in pg.records if r["key"] is None)
    alone = [truncate]
    rest = [r for r in pg.records if r is not truncate]
    assert rest, "rows for the other task"
    write = plan_routed_write(replica.raw, KAFKA, False)
    # The truncate's task runs first (tasks run at once on a cluster): no table yet.
    messages = [
        write_routed_task(write, iter(to_arrow(rows).to_batches()), TaskIdentity(partition_id=i, attempt=i, batch_id=0, query_id=QUERY))
        for i, rows in ((1, alone), (0, rest))
    ]
    assert list(messages[0].truncates) == ["replica.orders"] and not messages[0].tables
    commit_routed(messages, 0, datasource._commit, datasource._abort, progress=False)
    model = Replica()
    model.apply(pg.events, _identifier)
    replica.assert_replica(model, [ORDERS])
    assert {row[0] for row in pyiceberg_rows(load(warehouse, "replica.orders"), ["order_id"])} == {50}


def test_a_new_column_of_the_source_is_added_without_merge_schema(warehouse: str) -> None:
    pg = Connector("postgresql", "pg")
    replica = Replicator(warehouse)
    narrow = SourceTable("shop", "public", "people", (Column("id", "int32", optional=False), Column("name", "string")), ("id",))
    wide = SourceTable("shop", "public", "people", (*narrow.columns, Column("email", "string")), ("id",))
    first, _ = pg.change(narrow, "c", {"id": 1, "name": "ann"})
    pg.advance()
    second, _ = pg.change(wide, "c", {"id": 2, "name": "bob", "email": "b@x"})
    replica.run(first + second)
    assert pyiceberg_rows(load(warehouse, "replica.people"), ["id", "name", "email"]) == Counter({(1, "ann", None): 1, (2, "bob", "b@x"): 1})


def test_struct_values_decoded_from_avro_are_read_as_envelopes(warehouse: str) -> None:
    source = pa.struct([("connector", pa.string()), ("db", pa.string()), ("schema", pa.string()), ("table", pa.string()), ("lsn", pa.int64())])
    row = pa.struct([("id", pa.int32()), ("amount", pa.decimal128(9, 2))])
    value = pa.struct([("before", row), ("after", row), ("source", source), ("op", pa.string())])
    arrow = pa.schema([("key", pa.struct([("id", pa.int32())])), ("value", value), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])
    spark = T.StructType([
        T.StructField("key", T.StructType([T.StructField("id", T.IntegerType())])),
        T.StructField("value", T.StructType([T.StructField("before", T.StructType()), T.StructField("op", T.StringType())])),
        T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
    ])

    def record(op: str, i: int, amount: str | None, lsn: int, offset: int) -> dict[str, Any]:
        after = None if op == "d" else {"id": i, "amount": amount}
        return {"key": {"id": i}, "value": {"before": None, "after": after, "op": op,
                "source": {"connector": "postgresql", "db": "d", "schema": "public", "table": "pay", "lsn": lsn}},
                "topic": "pg.public.pay", "partition": 0, "offset": offset}

    Replicator(warehouse).run(
        [record("c", 1, decimal.Decimal("1.50"), 10, 0), record("c", 2, decimal.Decimal("2.00"), 20, 1), record("d", 1, None, 30, 2),
         {"key": {"id": 2}, "value": None, "topic": "pg.public.pay", "partition": 0, "offset": 3}],
        schema=spark, arrow=arrow,
    )
    assert pyiceberg_rows(load(warehouse, "replica.pay"), ["id", "amount"]) == Counter({(2, decimal.Decimal("2.00")): 1})


def test_a_replayed_batch_lands_once(warehouse: str) -> None:
    pg = SourceDatabase(Connector("postgresql", "pg"), [AUDIT, CUSTOMERS], toasted=["bio"])
    replica = Replicator(warehouse)
    pg.insert("audit", {"msg": "x", "n": 1})
    pg.insert("customers", _customer(1))
    replica.run(pg.records, batch_id=0)
    replica.run(pg.records, batch_id=0)  # Spark runs batch 0 again after a crash before its commit was recorded
    assert pyiceberg_rows(load(warehouse, "replica.audit"), ["msg", "n"]) == Counter({("x", 1): 1})
    assert len(load(warehouse, "replica.customers").metadata.snapshots) == 1


# -- bad input -------------------------------------------------------------------------------


def _raw(warehouse: str, **options: str) -> dict[str, str]:
    return {"cdc_format": "debezium", "namespace": "replica", "warehouse": warehouse, "progress": "false", **options}


@pytest.mark.parametrize(("option", "value"), [("primary_key", "id"), ("sequence_column", "lsn"), ("operation", "upsert"), ("table_column", "t")])
def test_options_the_events_decide_are_refused_by_name(warehouse: str, option: str, value: str) -> None:
    with pytest.raises(OptionError, match=f"option '{option}' cannot be given with cdc_format=debezium"):
        plan_routed_write(_raw(warehouse, **{option: value}), KAFKA, False)


def test_a_missing_namespace_and_a_wrong_value_column_are_refused(warehouse: str) -> None:
    with pytest.raises(OptionError, match="needs option 'namespace'"):
        plan_routed_write({"cdc_format": "debezium", "warehouse": warehouse}, KAFKA, False)
    with pytest.raises(OptionError, match="option 'value_column': column 'payload' is not in the DataFrame"):
        plan_routed_write(_raw(warehouse, value_column="payload"), KAFKA, False)
    with pytest.raises(OptionError, match="cdc_format' must be one of debezium"):
        plan_routed_write({**_raw(warehouse), "cdc_format": "maxwell"}, KAFKA, False)


def _good_and(bad: dict[str, Any]) -> list[dict[str, Any]]:
    pg = SourceDatabase(Connector("postgresql", "pg"), [AUDIT])
    pg.insert("audit", {"msg": "fine", "n": 1})
    return [*pg.records, bad]


@pytest.mark.parametrize(("value", "message"), [
    (b'{"hello": "world"}', "is not a Debezium change event: it has no 'op'"),
    (b"[1, 2]", "its value is not a JSON object"),
    (b'{"op": "x", "source": {"connector": "postgresql", "table": "audit"}}', "has op 'x'"),
])
def test_a_record_that_is_not_debeziums_is_named_and_nothing_changes(warehouse: str, value: bytes, message: str) -> None:
    bad = {"key": None, "value": value, "topic": "pg.public.audit", "partition": 3, "offset": 42}
    with pytest.raises(DebeziumInputError, match=message) as raised:
        Replicator(warehouse, tasks=1).run(_good_and(bad))
    assert "topic 'pg.public.audit', partition 3, offset 42" in str(raised.value)
    assert not table_exists(warehouse, "replica.audit")  # the good record's table was not even created


def test_a_decimal_whose_scale_disagrees_with_the_table_is_refused_and_changes_nothing(warehouse: str) -> None:
    pg = Connector("postgresql", "pg")
    replica = Replicator(warehouse)
    cents = SourceTable("shop", "public", "prices", (Column("id", "int32", optional=False), Column("p", "decimal", scale=2)), ("id",))
    mills = SourceTable("shop", "public", "prices", (Column("id", "int32", optional=False), Column("p", "decimal", scale=3)), ("id",))
    first, _ = pg.change(cents, "c", {"id": 1, "p": "1.25"})
    replica.run(first)
    pg.advance()
    second, _ = pg.change(mills, "u", {"id": 1, "p": "1.255"})
    snapshots = len(load(warehouse, "replica.prices").metadata.snapshots)
    with pytest.raises(SchemaError, match=r"'p'.*decimal"):
        replica.run(second)
    assert len(load(warehouse, "replica.prices").metadata.snapshots) == snapshots
    assert pyiceberg_rows(load(warehouse, "replica.prices"), ["id", "p"]) == Counter({(1, decimal.Decimal("1.25")): 1})


# -- the property -----------------------------------------------------------------------------

_step = st.one_of(
    st.tuples(st.just("insert"), st.sampled_from(["customers", "orders", "audit"]), st.integers(0, 6)),
    st.tuples(st.just("update"), st.sampled_from(["customers", "orders"]), st.integers(0, 6)),
    # a transaction that began before the key's last change committed: its change lower in the
    # WAL, its commit later (the key is inserted first when missing)
    st.tuples(st.just("update_in_flight"), st.sampled_from(["customers", "orders"]), st.integers(0, 6)),
    st.tuples(st.just("delete"), st.sampled_from(["customers", "orders"]), st.integers(0, 6)),
    st.tuples(st.just("truncate"), st.sampled_from(["orders", "audit"]), st.just(0)),
    st.tuples(st.just("resend"), st.just(""), st.integers(1, 3)),
    st.tuples(st.just("cut"), st.just(""), st.just(0)),
)


def _do(pg: SourceDatabase, step: tuple[str, str, int], n: int) -> None:
    kind, table, i = step
    if kind == "insert":
        row = _customer(i) if table == "customers" else (
            {"order_id": i, "customer": i, "total": f"{n}.125", "notes": None} if table == "orders" else {"msg": f"m{n}", "n": n}
        )
        pg.insert(table, row)
    elif kind in ("update", "update_in_flight"):
        if kind == "update_in_flight":
            _do(pg, ("insert", table, i), n)  # a key to update (no change when present)
        changes: dict[str, Any] = {"name": f"u{n}"} if table == "customers" else {"total": f"{n}.500"}
        if table == "customers" and n % 3 == 0:
            changes["bio"] = f"new bio {n}"
        pg.update(table, (i,), changes, in_flight=kind == "update_in_flight")
    elif kind == "delete":
        pg.delete(table, (i,))
    elif kind == "truncate":
        pg.truncate(table)
    elif kind == "resend":
        pg.resend(i)


@settings(max_examples=examples(30))
@given(steps=st.lists(_step, min_size=1, max_size=30), partitions=st.integers(1, 3), tasks=st.integers(1, 3))
def test_any_debezium_stream_matches_the_model_after_every_batch(steps: list[tuple[str, str, int]], partitions: int, tasks: int) -> None:
    with tempfile.TemporaryDirectory(prefix="lakesink-debezium-") as root:
        warehouse = os.path.join(root, "warehouse")
        pg = SourceDatabase(Connector("postgresql", "pg", partitions=partitions), [CUSTOMERS, ORDERS, AUDIT], toasted=["bio"])
        replica = Replicator(warehouse, tasks=tasks)
        model = Replica()
        done_records = done_events = 0

        def cut() -> None:
            nonlocal done_records, done_events
            records, events = pg.records[done_records:], pg.events[done_events:]
            done_records, done_events = len(pg.records), len(pg.events)
            if records:
                replica.run(records)
                model.apply(events, _identifier)
                replica.assert_replica(model, [CUSTOMERS, ORDERS, AUDIT])

        for n, step in enumerate(steps):
            if step[0] == "cut":
                cut()
            else:
                _do(pg, step, n)
        cut()
        _close_catalog(warehouse)


def _close_catalog(warehouse: str) -> None:
    from lakesink_datasource.catalog import loader

    for key in [k for k in loader._cache if any(warehouse in str(v) for v in k[1])]:
        cached, _inode = loader._cache.pop(key)
        engine = getattr(cached, "engine", None)
        if engine is not None:
            engine.dispose()


def test_table_names_from_a_template_and_a_tables_own_options(warehouse: str) -> None:
    """Two schemas with a table of one name kept apart by `table_name`; one table partitioned
    and sorted by its own options (`tables.<namespace>.<table>.*`)."""
    pg = Connector("postgresql", "pg")
    sales = SourceTable("shop", "sales", "items", (Column("id", "int32", optional=False), Column("day", "date")), ("id",))
    stock = SourceTable("shop", "stock", "items", (Column("id", "int32", optional=False), Column("day", "date")), ("id",))
    records = []
    for t, i in ((sales, 1), (stock, 1), (sales, 2)):
        made, _ = pg.change(t, "c", {"id": i, "day": dt.date(2024, 1, i)})
        records += made
        pg.advance()
    replica = Replicator(warehouse, table_name="{schema}_{table}", **{
        "tables.replica.sales_items.partition_by": "days(day)", "tables.replica.sales_items.sort_by": "id",
    })
    replica.run(records)
    assert pyiceberg_rows(load(warehouse, "replica.sales_items"), ["id"]) == Counter({(1,): 1, (2,): 1})
    assert pyiceberg_rows(load(warehouse, "replica.stock_items"), ["id"]) == Counter({(1,): 1})
    table = load(warehouse, "replica.sales_items")
    assert str(table.spec().fields[0].transform) == "day"
    assert [f.source_id for f in table.sort_order().fields] == [table.schema().find_field("id").field_id]
    assert not load(warehouse, "replica.stock_items").spec().fields


def test_a_debezium_stream_into_history_tables_keeps_every_version(warehouse: str) -> None:
    """history=true on a Debezium stream: each keyed table keeps every version of its rows,
    bounded by the source position (a struct); a change log stays a change log."""
    pg = SourceDatabase(Connector("postgresql", "pg"), [ORDERS, AUDIT])
    replica = Replicator(warehouse, history="true")
    pg.insert("orders", {"order_id": 1, "customer": 1, "total": "1.000", "notes": None})
    pg.insert("audit", {"msg": "a", "n": 1})
    replica.run(pg.records)
    start = len(pg.records)
    pg.update("orders", (1,), {"total": "2.000"})
    pg.delete("orders", (1,))
    pg.insert("orders", {"order_id": 1, "customer": 1, "total": "3.000", "notes": None})
    replica.run(pg.records[start:])
    lsns = [e.position[0] for e in pg.events if e.table is ORDERS]
    table = load(warehouse, "replica.orders")
    rows = pyiceberg_rows(table, ["order_id", "total", "__start_at", "__end_at"])
    got = sorted((r[1], dict(r[2])["lsn"], dict(r[3])["lsn"] if r[3] else None) for r in rows)  # structs as (field, value) pairs
    assert got == [
        (decimal.Decimal("1.000"), lsns[0], lsns[1]), (decimal.Decimal("2.000"), lsns[1], lsns[2]), (decimal.Decimal("3.000"), lsns[3], None),
    ]
    assert check_table(table) == []
    assert pyiceberg_rows(load(warehouse, "replica.audit"), ["msg"]) == Counter({("a",): 1})


@pytest.mark.parametrize("tasks", [1, 2])
def test_a_history_table_keeps_the_versions_a_truncate_in_the_same_batch_ends(warehouse: str, tasks: int) -> None:
    """SCD type 2 keeps the past: a row inserted and updated, then truncated, all in one batch,
    leaves its two versions, the second ended at the truncate; a row inserted in the same
    batch after the truncate starts anew. (The batch's rows before its truncate once never
    became versions.)"""
    pg = SourceDatabase(Connector("postgresql", "pg"), [ORDERS])
    replica = Replicator(warehouse, tasks=tasks, history="true")
    pg.insert("orders", {"order_id": 1, "customer": 1, "total": "1.000", "notes": None})
    pg.update("orders", (1,), {"total": "2.000"})
    pg.insert("orders", {"order_id": 2, "customer": 2, "total": "5.000", "notes": None})
    pg.truncate("orders")
    pg.insert("orders", {"order_id": 1, "customer": 1, "total": "3.000", "notes": None})
    replica.run(pg.records)
    lsn = [e.position[0] for e in pg.events if e.table is ORDERS]  # insert 1, update 1, insert 2, truncate, insert 1
    table = load(warehouse, "replica.orders")
    rows = pyiceberg_rows(table, ["order_id", "total", "__start_at", "__end_at"])
    got = sorted((r[0], r[1], dict(r[2])["lsn"], dict(r[3])["lsn"] if r[3] else None) for r in rows)
    assert got == [
        (1, decimal.Decimal("1.000"), lsn[0], lsn[1]), (1, decimal.Decimal("2.000"), lsn[1], lsn[3]),
        (1, decimal.Decimal("3.000"), lsn[4], None), (2, decimal.Decimal("5.000"), lsn[2], lsn[3]),
    ]
    assert check_table(table) == []


def test_a_history_table_from_events_without_connect_schemas_keeps_its_own_columns_out_of_the_input(warehouse: str) -> None:
    """JsonConverter with schemas off: a batch's values take their types from the existing
    table, whose __start_at/__end_at are the history's own, not the events' (found by the
    Java cross-check: the second batch was refused as if the events carried them)."""
    sales = SourceTable("testDB", "dbo", "sales", (Column("id", "int32", optional=False), Column("qty", "int32")), ("id",))
    db = SourceDatabase(Connector("sqlserver", "ms", wrapper=False), [sales])
    replica = Replicator(warehouse, history="true")
    db.insert("sales", {"id": 1, "qty": 1})
    replica.run(db.records)
    start = len(db.records)
    db.update("sales", (1,), {"qty": 2})
    db.update("sales", (1,), {"qty": 3})
    replica.run(db.records[start:])
    table = load(warehouse, "replica.sales")
    versions = sorted((r[0], r[1] is None) for r in pyiceberg_rows(table, ["qty", "__end_at"]))
    assert versions == [(1, False), (2, False), (3, True)]
    assert check_table(table) == []


# -- issue 59: placeholders of every type, MongoDB, rows without an envelope, names that clash -------


def _expected_toast(columns: list[str]) -> Counter:
    from debezium_toast import expected

    def plain(v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v

    return Counter(tuple(plain(row[c]) if c != "id" else i for c in columns) for i, row in expected().items())


def test_unchanged_toasted_values_of_every_column_type_keep_what_the_table_holds(warehouse: str) -> None:
    """Each placeholder form Debezium's PostgreSQL connector sends (tests/debezium_toast.py)
    is replaced by the key's value: from the table (an earlier batch) and from the key's
    earlier change in the batch; values that only look like a placeholder are written."""
    from debezium_toast import COLUMNS, stream

    first, second = stream()
    replica = Replicator(warehouse, tasks=1)
    replica.run(first)
    replica.run(second)
    table = load(warehouse, "replica.docs")
    expected = _expected_toast(COLUMNS)
    assert pyiceberg_rows(table, COLUMNS) == expected
    assert duckdb_rows(table.metadata_location, COLUMNS) == expected
    assert str(table.schema().find_field("days").field_type) == "list<date>"


def test_an_hstore_in_map_mode_keeps_its_value_in_a_keyed_write(warehouse: str) -> None:
    """hstore.handling.mode=map: Debezium's placeholder is a one-entry map, the placeholder
    to itself. A keyed write with option unavailable_value (a map column from Spark) keeps the
    key's stored map."""
    from lakesink_datasource.options import parse_options
    from lakesink_datasource.table.setup import plan_write
    from lakesink_datasource.write.task import write_task

    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("attrs", T.MapType(T.StringType(), T.StringType()))])
    arrow = pa.schema([("id", pa.int64()), ("attrs", pa.map_(pa.string(), pa.string()))])
    options = parse_options({"table": "db.h", "warehouse": warehouse, "operation": "upsert", "primary_key": "id", "maintenance": "off",
                             "index_dir": f"{warehouse}/idx", "unavailable_value": "__debezium_unavailable_value"})
    placeholder = [("__debezium_unavailable_value", "__debezium_unavailable_value")]
    batches = [
        [{"id": 1, "attrs": [("a", "1")]}, {"id": 2, "attrs": [("b", "2")]}],
        [{"id": 1, "attrs": placeholder}, {"id": 2, "attrs": [("b", "3")]}, {"id": 3, "attrs": [("c", "4")]}, {"id": 3, "attrs": placeholder}],
    ]
    for batch_id, rows in enumerate(batches):
        plan = plan_write(options, schema, overwrite=False)
        message = write_task(plan, iter([pa.RecordBatch.from_pylist(rows, schema=arrow)]), TaskIdentity(partition_id=0, attempt=batch_id, batch_id=batch_id, query_id="h"))
        datasource._commit(plan, [message], batch_id)
    table = load(warehouse, "db.h")
    expected = Counter({(1, (("a", "1"),)): 1, (2, (("b", "3"),)): 1, (3, (("c", "4"),)): 1})
    got = Counter((r["id"], tuple(r["attrs"])) for r in table.scan().to_arrow().to_pylist())
    assert got == expected


def test_mongodb_events_are_refused_by_name(warehouse: str) -> None:
    """A change event of Debezium's MongoDB connector (its documented shape: `after` the
    document's extended JSON, source.collection, no source.table)."""
    source = {"version": "2.7.3.Final", "connector": "mongodb", "name": "fulfillment", "ts_ms": 1558965508000, "snapshot": "false",
              "db": "inventory", "rs": "rs0", "collection": "customers", "ord": 31, "h": None}
    event = {"after": '{"_id": {"$numberLong": "1004"}, "first_name": "Anne"}', "source": source, "op": "c", "ts_ms": 1558965515240}
    bad = {"key": b'{"id": "1004"}', "value": json.dumps(event).encode(), "topic": "fulfillment.inventory.customers", "partition": 0, "offset": 7}
    with pytest.raises(DebeziumInputError, match=r"MongoDB connector.*ExtractNewDocumentState") as raised:
        Replicator(warehouse, tasks=1).run(_good_and(bad))
    assert "offset 7" in str(raised.value) and "source.table" not in str(raised.value)
    assert not table_exists(warehouse, "replica.audit")


@pytest.mark.parametrize("row", [
    {"id": 1, "status": "BEGIN", "note": "a job"},  # a table of jobs, unwrapped: not a transaction marker
    {"id": 2, "status": "END", "event_count": 3},
    {"id": 3, "ddl": "CREATE TABLE t (i int)", "databaseName": "shop"},  # a table of migrations: not a schema change
])
def test_rows_without_an_envelope_are_refused_whatever_their_columns_hold(warehouse: str, row: dict[str, Any]) -> None:
    """ExtractNewRecordState's rows (no envelope) were skipped as transaction markers when a
    `status` column held BEGIN or END. Debezium's own markers (every field of theirs) still are."""
    for wrapped in (False, True):
        value = json.dumps({"schema": {"type": "struct", "fields": []}, "payload": row} if wrapped else row).encode()
        bad = {"key": b'{"id": 1}', "value": value, "topic": "pg.public.jobs", "partition": 0, "offset": 9}
        with pytest.raises(DebeziumInputError, match=r"it has no 'op'.*ExtractNewRecordState"):
            Replicator(warehouse, tasks=1).run(_good_and(bad))
        assert not table_exists(warehouse, "replica.audit")
    pg = Connector("postgresql", "pg")
    good, markers = _good_and({})[:-1], [pg.transaction("BEGIN"), pg.transaction("END")]
    Replicator(warehouse, tasks=1).run([markers[0], *good, markers[1]])  # Debezium's own markers: skipped
    assert pyiceberg_rows(load(warehouse, "replica.audit"), ["msg"]) == Counter({("fine",): 1})


def _orders(schema: str) -> SourceTable:
    return SourceTable("shop", schema, "orders", (Column("id", "int32", optional=False), Column("v", "string")), ("id",))


def test_same_named_tables_of_two_schemas_are_refused_under_the_default_table_name(warehouse: str) -> None:
    """public.orders and sales.orders: one task, two tasks of one batch (each its own topic),
    and a later batch; a template that keeps them apart, or one given on purpose, writes."""
    pg = Connector("postgresql", "pg")
    public, _ = pg.change(_orders("public"), "c", {"id": 1, "v": "p"})
    pg.advance()
    sales, _ = pg.change(_orders("sales"), "c", {"id": 1, "v": "s"})
    pg.advance()
    message = r"source tables shop\.public\.orders and shop\.sales\.orders.*'\{schema\}_\{table\}'"
    with pytest.raises(DebeziumInputError, match=message):
        Replicator(warehouse, tasks=1).run(public + sales)  # one task reads both
    assert not table_exists(warehouse, "replica.orders")
    # A task each (each its topic's Kafka partition), one after the other (Spark runs each task
    # in a worker process of its own: threads of this process would share one index
    # environment, which no two Spark tasks do): the second task refuses if it finds the table
    # the first made, else the commit refuses both, before any table changes.
    write = plan_routed_write(Replicator(warehouse, namespace="both").raw, KAFKA, False)

    def task(i: int, rows: list[dict[str, Any]]) -> Any:
        return write_routed_task(write, iter(to_arrow(rows).to_batches()), TaskIdentity(partition_id=i, attempt=i, batch_id=0, query_id=QUERY))

    results: list[Any] = []
    raised: list[Exception] = []
    for i, rows in enumerate((public, sales)):
        try:
            results.append(task(i, rows))
        except DebeziumInputError as exc:
            raised.append(exc)
    if raised:
        assert len(raised) == 1 and re.search(message, str(raised[0])), raised
    else:
        with pytest.raises(DebeziumInputError, match=message):
            commit_routed(results, 0, datasource._commit, datasource._abort, progress=False)
    assert load(warehouse, "both.orders").metadata.current_snapshot() is None
    replica = Replicator(warehouse, tasks=1)
    replica.run(public, batch_id=1)
    with pytest.raises(DebeziumInputError, match=message):
        replica.run(sales, batch_id=2)  # a later batch
    assert pyiceberg_rows(load(warehouse, "replica.orders"), ["id", "v"]) == Counter({(1, "p"): 1})
    Replicator(warehouse, tasks=1, table_name="{schema}_{table}").run(public + sales)
    assert pyiceberg_rows(load(warehouse, "replica.sales_orders"), ["id", "v"]) == Counter({(1, "s"): 1})
    Replicator(warehouse, tasks=1, table_name="all_{table}").run(public + sales)  # gathered on purpose
    assert pyiceberg_rows(load(warehouse, "replica.all_orders"), ["id", "v"]) == Counter({(1, "s"): 1})
    mysql = Connector("mysql", "my")
    shop, _ = mysql.change(SourceTable("shop", None, "orders", _orders("x").columns, ("id",)), "c", {"id": 1, "v": "a"})
    crm, _ = mysql.change(SourceTable("crm", None, "orders", _orders("x").columns, ("id",)), "c", {"id": 2, "v": "b"})
    with pytest.raises(DebeziumInputError, match=r"crm\.orders and shop\.orders.*'\{db\}_\{table\}'"):
        Replicator(warehouse, tasks=1, namespace="my").run(shop + crm)


# -- each connector's own order (issue 59) ------------------------------------------------------


def _sees(warehouse: str, t: SourceTable, expected: dict[int, str]) -> None:
    want = Counter((i, v) for i, v in expected.items())
    table = load(warehouse, _identifier(t))
    assert pyiceberg_rows(table, ["id", "v"]) == want
    assert duckdb_rows(table.metadata_location, ["id", "v"]) == want


@pytest.mark.parametrize("case", ORDER_CASES, ids=[c.id for c in ORDER_CASES])
@pytest.mark.parametrize("batches", ["one", "two", "each"])
def test_each_connectors_changes_land_in_its_own_commit_order(warehouse: str, case: OrderCase, batches: str) -> None:
    """PostgreSQL and Oracle: a transaction in flight while the snapshot ran wins over the
    snapshot's read, and of two transactions the one committed last wins. SQL Server: a
    re-snapshot's rows (later commit_lsn, no change_lsn) replace older streamed rows. MySQL:
    Flink CDC's snapshot rows (no binlog file) are taken and sort before the binlog. In one
    batch, across two (the snapshot, then the stream), one event a batch."""
    steps = case.records("src")
    replica = Replicator(warehouse, tasks=1)
    if batches == "one":
        replica.run([r for step in steps for r in step])
    elif batches == "two":
        replica.run([r for step in steps[: case.cut] for r in step])
        replica.run([r for step in steps[case.cut :] for r in step])
    else:
        for step in steps:
            replica.run(step)
    _sees(warehouse, case.table, case.expected)


@pytest.mark.parametrize("case", ORDER_CASES, ids=[c.id for c in ORDER_CASES])
def test_a_connector_restart_resending_the_stream_changes_nothing(warehouse: str, case: OrderCase) -> None:
    """The connector restarts and sends its streamed events again (their positions, new Kafka
    offsets), over two batches: after each, the table shows the source's rows, and a history
    table holds no new version."""
    steps = case.records("src")
    replica = Replicator(warehouse, tasks=1, history="true")
    sent = [r for step in steps for r in step]
    replica.run(sent)
    versions = pyiceberg_rows(load(warehouse, _identifier(case.table)), ["id", "v", "__end_at"])
    assert Counter((i, v) for i, v, end in versions.elements() if end is None) == Counter(case.expected.items())
    again = resent([r for step in steps[case.cut :] for r in step], first_offset=len(sent))
    for part in (again[: len(again) // 2], again[len(again) // 2 :]):
        replica.run(part)
        assert pyiceberg_rows(load(warehouse, _identifier(case.table)), ["id", "v", "__end_at"]) == versions


ITEM_COLUMNS_KV = (Column("id", "int32", optional=False), Column("v", "string"))


@pytest.mark.parametrize("kind", ["postgresql", "mysql", "sqlserver", "oracle"])
def test_a_restart_resending_changes_of_one_key_across_batches_never_shows_an_older_value(warehouse: str, kind: str) -> None:
    """Three changes of one key; the connector restarts and sends the last two again, split
    across two batches: the table keeps the newest value after each, and its history the three
    versions the source had."""
    t = SourceTable("db1", "s1" if kind != "mysql" else None, "kv", ITEM_COLUMNS_KV, ("id",))
    db = SourceDatabase(Connector(kind, "src"), [t])
    replica = Replicator(warehouse, tasks=1, history="true")
    db.insert("kv", {"id": 1, "v": "a"})
    db.update("kv", (1,), {"v": "b"})
    db.update("kv", (1,), {"v": "c"})
    replica.run(db.records)
    sent = len(db.records)
    db.resend(2)
    for record in db.records[sent:]:
        replica.run([record])
        table = load(warehouse, "replica.kv")
        ended = sorted((v, end is None) for _i, v, end in pyiceberg_rows(table, ["id", "v", "__end_at"]).elements())
        assert ended == [("a", False), ("b", False), ("c", True)]  # the current row (no end) is still "c"


OLD_PRIMARY, NEW_PRIMARY = "3e11fa47-71ca-11e1-9e33-c80aa9429562", "6f1b2c3d-0a0b-11ef-8f2e-0242ac120003"


def _at(file: int, pos: int, gtid: str | None) -> dict[str, Any]:
    return {"file": f"mysql-bin.{file:06d}", "pos": pos, "gtid": gtid, "server_id": 1 if gtid is None or OLD_PRIMARY in gtid else 2}


@pytest.mark.parametrize("batches", ["one", "two"])
def test_mysql_changes_after_a_failover_to_a_server_with_lower_binlog_numbers_win(warehouse: str, batches: str) -> None:
    """With GTIDs, a failover to a replica whose binlog numbers are lower: the new primary's
    changes are the newest (Kafka's order), the old primary's transactions it replicated and
    the connector re-sends after the switch are not. In one batch and across two."""
    t = SourceTable("inventory", None, "failover", ITEM_COLUMNS_KV, ("id",))
    c = Connector("mysql", "src")
    sent: list[list[dict[str, Any]]] = []
    for key, value, at in [
        (1, "old primary", _at(120, 900, f"{OLD_PRIMARY}:57")),
        (2, "old primary", _at(120, 1400, f"{OLD_PRIMARY}:58")),
        (1, "new primary", _at(3, 200, f"{NEW_PRIMARY}:1")),
        (2, "replicated, re-sent", _at(3, 150, f"{OLD_PRIMARY}:58")),  # the switch re-sends a transaction already read
        (3, "new primary", _at(3, 400, f"{NEW_PRIMARY}:2")),
    ]:
        records, _ = c.change(t, "u", {"id": key, "v": value}, source=at)
        sent.append(records)
    replica = Replicator(warehouse, tasks=1)
    cut = 2 if batches == "two" else len(sent)
    replica.run([r for rs in sent[:cut] for r in rs])
    if cut < len(sent):
        replica.run([r for rs in sent[cut:] for r in rs])
    expected = {(1, "new primary"): 1, (2, "old primary"): 1, (3, "new primary"): 1}
    assert pyiceberg_rows(load(warehouse, "replica.failover"), ["id", "v"]) == Counter(expected)
    # A restart re-sending the new primary's changes changes nothing.
    replica.run(resent([r for rs in sent[2:] for r in rs], first_offset=sum(len(rs) for rs in sent)))
    table = load(warehouse, "replica.failover")
    assert pyiceberg_rows(table, ["id", "v"]) == Counter(expected)
    # What the table keeps to tell the next batch: one failover, one entry per partition and server.
    (binlog,) = json.loads(table.metadata.properties["lakesink.debezium.binlogs"]).values()
    assert binlog["failovers"] == 1 and binlog["newest"] == {OLD_PRIMARY: 58, NEW_PRIMARY: 2}


def test_mysql_without_gtids_keeps_ordering_by_binlog_position(warehouse: str) -> None:
    """Without GTIDs a lower position is an older change, never taken for a failover: a late
    copy of an older change (below the key's stored one) is dropped."""
    t = SourceTable("inventory", None, "plain", ITEM_COLUMNS_KV, ("id",))
    c = Connector("mysql", "src")
    newer, _ = c.change(t, "u", {"id": 1, "v": "newer"}, source=_at(7, 900, None))
    older, _ = c.change(t, "u", {"id": 1, "v": "older"}, source=_at(7, 300, None))
    replica = Replicator(warehouse, tasks=1)
    replica.run(newer)
    replica.run(older)
    assert pyiceberg_rows(load(warehouse, "replica.plain"), ["id", "v"]) == Counter({(1, "newer"): 1})


def test_a_mysql_table_whose_positions_count_no_failovers_is_written_as_before(warehouse: str) -> None:
    """A MySQL table an earlier lakesink made stores (file_number, pos, streamed, row): it is
    still written, ordered by binlog position (no failover counted), and gets no binlogs
    property."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

    os.makedirs(warehouse, exist_ok=True)
    catalog = embedded_catalog(warehouse)
    catalog.create_namespace("replica")
    earlier = StructType(
        NestedField(5, "file_number", LongType()), NestedField(6, "pos", LongType()), NestedField(7, "streamed", IntegerType()),
        NestedField(8, "row", LongType()),
    )
    catalog.create_table("replica.my_items", Schema(
        NestedField(1, "id", IntegerType(), required=True), NestedField(2, "v", StringType()), NestedField(3, "__op", StringType()),
        NestedField(4, "__source_position", earlier), identifier_field_ids=[1],
    ))
    case = ORDER_CASES[3]
    assert case.table.table == "my_items"
    Replicator(warehouse, tasks=1).run([r for step in case.records("src") for r in step])
    table = load(warehouse, "replica.my_items")
    assert pyiceberg_rows(table, ["id", "v"]) == Counter(case.expected.items())
    assert [f.name for f in table.schema().find_field("__source_position").field_type.fields] == ["file_number", "pos", "streamed", "row"]
    assert "lakesink.debezium.binlogs" not in table.metadata.properties


def test_a_table_written_with_the_old_position_layout_is_refused_and_left_as_it_was(warehouse: str) -> None:
    """A table an earlier lakesink wrote stores positions as (lsn, last_commit_lsn,
    kafka_offset): compared field by field with the new ones they would misorder, so the
    write is refused by name, before anything is written."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

    os.makedirs(warehouse, exist_ok=True)
    catalog = embedded_catalog(warehouse)
    catalog.create_namespace("replica")
    old = StructType(NestedField(5, "lsn", LongType()), NestedField(6, "last_commit_lsn", LongType()), NestedField(7, "kafka_offset", LongType()))
    catalog.create_table("replica.pg_items", Schema(
        NestedField(1, "id", IntegerType(), required=True), NestedField(2, "v", StringType()), NestedField(3, "__op", StringType()),
        NestedField(4, "__source_position", old), identifier_field_ids=[1],
    ))
    steps = ORDER_CASES[0].records("src")
    with pytest.raises(DebeziumSchemaError, match=r"replica\.pg_items: its column __source_position holds \(lsn, last_commit_lsn, kafka_offset\)"):
        Replicator(warehouse, tasks=1).run([r for step in steps for r in step])
    assert load(warehouse, "replica.pg_items").metadata.current_snapshot() is None


_SOURCE_STEP = st.tuples(st.sampled_from(["insert", "update", "update", "delete", "truncate"]), st.integers(0, 4))


@settings(max_examples=examples(40))
@given(steps=st.lists(_SOURCE_STEP, min_size=1, max_size=20), cuts=st.lists(st.integers(1, 19), max_size=3), tasks=st.sampled_from([1, 2]))
def test_a_debezium_history_table_with_truncates_matches_the_scd2_model(steps: list[tuple[str, int]], cuts: list[int], tasks: int) -> None:
    """A PostgreSQL table's inserts, updates, deletes and truncates (keys over two Kafka
    partitions), in batches cut anywhere, into a history table: it holds the versions of the
    independent SCD type 2 model (tests/scd2_model.py), bounds being the events' LSNs. Each
    batch holds every partition's events of a range of the source's log (no partition lags
    behind a truncate: docs/limits.md)."""
    from scd2_model import Change, history

    t = SourceTable("d", "public", "kv", ITEM_COLUMNS_KV, ("id",))
    pg = SourceDatabase(Connector("postgresql", "pg", partitions=2), [t])
    ends: list[int] = []  # records written after each step
    for n, (kind, key) in enumerate(steps):
        if kind == "insert":
            pg.insert("kv", {"id": key, "v": f"i{n}"})
        elif kind == "update":
            pg.update("kv", (key,), {"v": f"u{n}"})  # values never repeat: every update is a change of v
        elif kind == "delete":
            pg.delete("kv", (key,))
        else:
            pg.truncate("kv")
        ends.append(len(pg.records))
    bounds = sorted({ends[c] for c in cuts if c < len(ends)} | {ends[-1]})
    changes = [
        Change(None, (e.position[0],), "truncate", None) if e.op == "t"
        else Change((e.row["id"],), (e.position[0],), "delete" if e.op == "d" else "upsert", None if e.op == "d" else {"v": e.row["v"]})
        for e in pg.events
    ]
    expected = Counter((v.key[0], v.values["v"], v.start[0], None if v.end is None else v.end[0]) for v in history([changes]))
    with tempfile.TemporaryDirectory() as warehouse:
        try:
            got = _history_replica(warehouse, tasks, [pg.records[a:b] for a, b in zip([0, *bounds], bounds)])
        finally:  # the example's index environments go with its directory (hundreds of examples in one process)
            environment.close_cached([p for p in environment.cached_paths() if p.startswith(warehouse)])
    assert got == expected, f"missing {dict(expected - got)}, unexpected {dict(got - expected)}"


def _history_replica(warehouse: str, tasks: int, batches: list[list[dict[str, Any]]]) -> Counter:
    """The history table replica.kv's versions as (id, v, start LSN, end LSN) after `batches`."""
    replica = Replicator(warehouse, tasks=tasks, history="true")
    for batch in batches:
        replica.run(batch)
    if not table_exists(warehouse, "replica.kv"):
        return Counter()  # only truncates: no table, no version
    table = load(warehouse, "replica.kv")
    assert check_table(table) == []
    rows = pyiceberg_rows(table, ["id", "v", "__start_at", "__end_at"])
    return Counter({(i, v, dict(s)["lsn"], dict(e)["lsn"] if e else None): c for (i, v, s, e), c in rows.items()})
