"""One write routed to many tables (issue 47), through the production path without Spark:
the driver's check (plan_routed_write), tasks (write_routed_task, as Spark's executors run
them) and the driver's commit (commit_routed with the sink's own per-table commit).

Against a plain-Python model per table: live rows by key (cdc with a sequence column) or
every row (appends); read back by DuckDB and pyiceberg.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load, table_exists
from pyspark.sql import types as T

from lakesink_datasource import datasource
from lakesink_datasource.options import OptionError
from lakesink_datasource.routing.route_commit import by_table, commit_routed
from lakesink_datasource.routing.route_plan import RoutedWrite, plan_routed_write
from lakesink_datasource.routing.route_rows import RoutedInputError
from lakesink_datasource.routing.route_task import write_routed_task
from lakesink_datasource.write.task import TaskIdentity

QUERY = "routed-query"
FLAT = T.StructType([T.StructField("tbl", T.StringType()), T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
FLAT_ARROW = pa.schema([("tbl", pa.string()), ("id", pa.int64()), ("v", pa.string())])
CDC = T.StructType([
    T.StructField("tbl", T.StringType()), T.StructField("op", T.StringType()), T.StructField("seq", T.LongType()),
    T.StructField("after", T.StringType()),
])
CDC_ARROW = pa.schema([("tbl", pa.string()), ("op", pa.string()), ("seq", pa.int64()), ("after", pa.string())])


def _run(write: RoutedWrite, tasks: list[list[dict]], schema: pa.Schema, batch_id: int | None) -> None:
    messages = [
        write_routed_task(write, iter([pa.RecordBatch.from_pylist(rows, schema=schema)]), TaskIdentity(partition_id=i, attempt=100 * (batch_id or 0) + i, batch_id=batch_id, query_id=QUERY))
        for i, rows in enumerate(tasks)
    ]
    commit_routed(messages, batch_id, datasource._commit, datasource._abort, progress=False)


def test_an_append_routed_by_a_column_creates_and_fills_each_table(warehouse: str) -> None:
    raw = {"table_column": "tbl", "namespace": "shop", "warehouse": warehouse, "progress": "false", "maintenance": "off"}
    rows = [{"tbl": t, "id": i, "v": f"{t}{i}"} for i in range(30) for t in ("orders", "users", "other.audit")]
    _run(plan_routed_write(raw, FLAT, False), [rows[:40], rows[40:]], FLAT_ARROW, None)
    for identifier, name in (("shop.orders", "orders"), ("shop.users", "users"), ("other.audit", "other.audit")):
        expected = expected_rows([{"id": r["id"], "v": r["v"]} for r in rows if r["tbl"] == name], ["id", "v"])
        assert_readers_see(warehouse, identifier, expected, ["id", "v"])


def _cdc(table: str, op: str, seq: int, after: dict | None) -> dict:
    return {"tbl": table, "op": op, "seq": seq, "after": None if after is None else json.dumps(after)}


class _Model:
    def __init__(self) -> None:
        self.live: dict[str, dict[int, tuple[int, dict]]] = {}

    def apply(self, rows: list[dict], keys: dict[str, str]) -> None:
        for r in rows:
            after = json.loads(r["after"]) if r["after"] else {}
            key = after[keys[r["tbl"]]]
            table = self.live.setdefault(r["tbl"], {})
            held = table.get(key)
            if held is not None and held[0] > r["seq"]:
                continue  # a late change
            if r["op"] == "d":
                table[key] = (r["seq"], {})  # a tombstone keeps the delete's sequence
            else:
                table[key] = (r["seq"], after)

    def rows(self, table: str) -> list[dict]:
        return [row for _, row in self.live.get(table, {}).values() if row]


def test_a_cdc_stream_of_several_tables_with_json_payloads_matches_the_model_and_replays_once(warehouse: str) -> None:
    raw = {
        "table_column": "tbl", "payload_column": "after", "operation": "cdc", "op_column": "op", "sequence_column": "seq",
        "warehouse": warehouse, "index_dir": os.path.join(warehouse, "idx"), "progress": "false", "merge_schema": "true",
        "maintenance": "off", "tables.db.orders.primary_key": "order_id", "tables.db.users.primary_key": "uid",
        "tables.db.late.primary_key": "k", "checkpointLocation": os.path.join(warehouse, "chk"),
    }
    keys = {"db.orders": "order_id", "db.users": "uid", "db.late": "k"}
    model = _Model()
    batches = [
        [
            [_cdc("db.orders", "c", 1, {"order_id": 1, "amount": 10.5}), _cdc("db.users", "c", 1, {"uid": 7, "name": "ann"}),
             _cdc("db.orders", "c", 2, {"order_id": 2, "amount": 3.0})],
            [_cdc("db.users", "c", 2, {"uid": 8, "name": "bob"}), _cdc("db.orders", "u", 3, {"order_id": 1, "amount": 11.0})],
        ],
        [
            # users gains a column; a late update of order 1 is ignored; order 2 deleted; a new table appears
            [_cdc("db.users", "u", 5, {"uid": 7, "name": "ann", "email": "a@x"}), _cdc("db.orders", "u", 2, {"order_id": 1, "amount": 99.0}),
             _cdc("db.orders", "d", 6, {"order_id": 2})],
            [_cdc("db.late", "c", 1, {"k": 1, "note": "new table"})],
        ],
    ]
    for batch_id, tasks in enumerate(batches):
        write = plan_routed_write(raw, CDC, False)
        _run(write, tasks, CDC_ARROW, batch_id)
        model.apply([r for task in tasks for r in task], keys)
        for table, columns in (("db.orders", ["order_id", "amount"]), ("db.users", ["uid", "name"]), ("db.late", ["k", "note"])):
            if table_exists(warehouse, table):
                assert_readers_see(warehouse, table, expected_rows(model.rows(table), columns), columns)
    assert load(warehouse, "db.users").schema().find_field("email") is not None
    emails = {r["uid"]: r.get("email") for r in model.rows("db.users")}
    assert_readers_see(warehouse, "db.users", expected_rows([{"uid": u, "email": e} for u, e in emails.items()], ["uid", "email"]), ["uid", "email"])

    # Batch 1 again, as Spark replays it after a driver died between two tables' commits:
    # one table had committed it, the rest had not.
    snapshots = {t: load(warehouse, t).metadata.current_snapshot_id for t in keys}
    write = plan_routed_write(raw, CDC, False)
    messages = [
        write_routed_task(write, iter([pa.RecordBatch.from_pylist(rows, schema=CDC_ARROW)]), TaskIdentity(partition_id=i, attempt=900 + i, batch_id=1, query_id=QUERY))
        for i, rows in enumerate(batches[1])
    ]
    commit_routed(messages, 1, datasource._commit, datasource._abort, progress=False)
    assert {t: load(warehouse, t).metadata.current_snapshot_id for t in keys} == snapshots  # nothing twice
    for table, columns in (("db.orders", ["order_id", "amount"]), ("db.late", ["k", "note"])):
        assert_readers_see(warehouse, table, expected_rows(model.rows(table), columns), columns)


def test_a_batch_whose_commit_stopped_between_two_tables_lands_the_rest_on_replay(warehouse: str) -> None:
    raw = {"table_column": "tbl", "warehouse": warehouse, "progress": "false", "maintenance": "off"}
    rows = [{"tbl": t, "id": i, "v": "x"} for i in range(5) for t in ("db.a", "db.b", "db.c")]
    write = plan_routed_write(raw, FLAT, False)
    batch = [pa.RecordBatch.from_pylist(rows, schema=FLAT_ARROW)]
    message = write_routed_task(write, iter(batch), TaskIdentity(partition_id=0, attempt=1, batch_id=0, query_id=QUERY))
    plan, table_messages = by_table([message])["db.a"]
    datasource._commit(plan, table_messages, 0)  # the driver died after db.a
    replay = write_routed_task(plan_routed_write(raw, FLAT, False), iter(batch), TaskIdentity(partition_id=0, attempt=2, batch_id=0, query_id=QUERY))
    commit_routed([replay], 0, datasource._commit, datasource._abort, progress=False)
    for table in ("db.a", "db.b", "db.c"):
        assert_readers_see(warehouse, table, expected_rows([{"id": i} for i in range(5)], ["id"]), ["id"])


def test_bad_routed_input_is_refused_before_anything_is_written(warehouse: str) -> None:
    base = {"warehouse": warehouse, "progress": "false"}
    with pytest.raises(OptionError, match="column 'nope' is not in the DataFrame"):
        plan_routed_write({**base, "table_column": "nope"}, FLAT, False)
    with pytest.raises(OptionError, match="'table' cannot be given with 'table_column'"):
        plan_routed_write({**base, "table_column": "tbl", "table": "db.t"}, FLAT, False)
    with pytest.raises(OptionError, match=r"table db.orders \(routed by 'tbl'\): unknown option 'primary_kee'"):
        plan_routed_write({**base, "table_column": "tbl", "tables.db.orders.primary_kee": "id"}, FLAT, False)
    for option in ("branch", "tables.db.orders.evolve_partition", "replace_where"):
        with pytest.raises(OptionError, match=f"option '{option}' cannot be used with 'table_column'"):
            plan_routed_write({**base, "table_column": "tbl", option: "x"}, FLAT, False)
    write = plan_routed_write({**base, "table_column": "tbl"}, FLAT, False)
    with pytest.raises(OptionError, match="without a namespace"):
        _run(write, [[{"tbl": "bare", "id": 1, "v": "x"}]], FLAT_ARROW, None)
    with pytest.raises(RoutedInputError, match="null table name"):
        _run(write, [[{"tbl": None, "id": 1, "v": "x"}]], FLAT_ARROW, None)
    strict = plan_routed_write({**base, "table_column": "tbl", "create_tables": "false"}, FLAT, False)
    with pytest.raises(OptionError, match="does not exist and create_tables is false"):
        _run(strict, [[{"tbl": "db.missing", "id": 1, "v": "x"}]], FLAT_ARROW, None)
    assert not table_exists(warehouse, "db.missing")
    assert not table_exists(warehouse, "default.bare")


def test_a_routed_write_refuses_what_a_plain_write_refuses_in_the_same_words(warehouse: str) -> None:
    """A table of format version 1, and a partitioning the table does not have: the routed
    task's planner and the plain write's name the same fix, and nothing is written."""
    from lakesink_testing import embedded_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from lakesink_datasource.options import parse_options
    from lakesink_datasource.table.setup import plan_write

    os.makedirs(warehouse)
    catalog = embedded_catalog(warehouse)
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "v", StringType(), required=False))
    catalog.create_table("db.old", schema=schema, properties={"format-version": "1"})
    catalog.create_table("db.flat", schema=schema, properties={"format-version": "2"})
    upgrade = r"table db.old is Iceberg format version 1; lakesink writes versions 2 and 3 \(upgrade it first"
    with pytest.raises(OptionError, match=upgrade):
        plan_write(parse_options({"table": "db.old", "warehouse": warehouse}), T.StructType(FLAT.fields[1:]), False)
    raw = {"table_column": "tbl", "warehouse": warehouse, "progress": "false", "maintenance": "off"}
    with pytest.raises(OptionError, match=upgrade):
        _run(plan_routed_write(raw, FLAT, False), [[{"tbl": "db.old", "id": 1, "v": "x"}]], FLAT_ARROW, None)
    with pytest.raises(OptionError, match=r"table db.flat: a write routed to many tables cannot evolve the table's partitioning"):
        _run(plan_routed_write({**raw, "tables.db.flat.partition_by": "v"}, FLAT, False), [[{"tbl": "db.flat", "id": 1, "v": "x"}]],
             FLAT_ARROW, None)
    for t in ("db.old", "db.flat"):
        assert load(warehouse, t).metadata.current_snapshot() is None


def _data_files_on_disk(warehouse: str, identifier: str) -> set[str]:
    root = os.path.join(warehouse, *identifier.split("."), "data")
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files}


def test_a_batchs_tables_land_together_or_not_at_all(warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    """The embedded SQLite catalog changes a batch's tables in one database transaction: one
    table's commit failing leaves every table as it was (and deletes the batch's files); a
    lost answer after the transaction landed is recognised in every table."""
    raw = {"table_column": "tbl", "warehouse": warehouse, "progress": "false", "maintenance": "off"}
    tables = ("db.a", "db.b", "db.c")

    def batch(n: int) -> list[pa.RecordBatch]:
        return [pa.RecordBatch.from_pylist([{"tbl": t, "id": 10 * n + i, "v": t} for i in range(3) for t in tables], schema=FLAT_ARROW)]

    def run(n: int, attempt: int) -> str:
        message = write_routed_task(plan_routed_write(raw, FLAT, False), iter(batch(n)), TaskIdentity(partition_id=0, attempt=attempt, batch_id=n, query_id=QUERY))
        return commit_routed([message], n, datasource._commit, datasource._abort, progress=False)

    assert run(0, 1).startswith("committed together in one catalog transaction")
    before = {t: load(warehouse, t).metadata_location for t in tables}
    files = {t: _data_files_on_disk(warehouse, t) for t in tables}
    arm_fault({"point": "before_commit", "table": "db.b", "action": "raise"})
    with pytest.raises(Exception, match=r"injected fault at before_commit \(batch 1, table db.b\)"):
        run(1, 2)
    assert {t: load(warehouse, t).metadata_location for t in tables} == before  # none of them changed
    assert {t: _data_files_on_disk(warehouse, t) for t in tables} == files  # and the batch's files are gone
    arm_fault({"point": "catalog_updated", "action": "lose_answer", "once": True})
    run(1, 3)  # Spark runs the batch again; the transaction lands, its answer is lost on the way back
    for t in tables:
        assert_readers_see(warehouse, t, expected_rows([{"id": 10 * n + i} for n in (0, 1) for i in range(3)], ["id"]), ["id"])
        history = load(warehouse, t).metadata.snapshots
        assert len(history) == 2, f"{t}: {len(history)} snapshots"


def test_a_routed_task_failing_after_some_tables_leaves_none_of_their_files(warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    """A task writes its tables one after another: when the second fails, the first's data
    files and its deleted keys' files (tombstones) are deleted with it, not left as orphans;
    the retried task lands the batch exactly."""
    raw = {"table_column": "tbl", "payload_column": "after", "operation": "cdc", "op_column": "op", "sequence_column": "seq",
           "warehouse": warehouse, "index_dir": os.path.join(warehouse, "idx"), "progress": "false", "maintenance": "off",
           "tables.db.a.primary_key": "k", "tables.db.b.primary_key": "k"}
    first = [_cdc(t, "c", 1, {"k": k, "v": f"{t}{k}"}) for t in ("db.a", "db.b") for k in range(4)]
    _run(plan_routed_write(raw, CDC, False), [first], CDC_ARROW, 0)
    on_disk = {t: _data_files_on_disk(warehouse, t) for t in ("db.a", "db.b")}
    second = [_cdc("db.a", "d", 2, {"k": 0}), _cdc("db.a", "u", 2, {"k": 1, "v": "new"}), _cdc("db.b", "c", 2, {"k": 9, "v": "b9"})]
    arm_fault({"point": "task_files_written", "action": "raise", "nth": [2]})  # db.a's write done, db.b's files written
    with pytest.raises(Exception, match="injected fault at task_files_written"):
        _run(plan_routed_write(raw, CDC, False), [second], CDC_ARROW, 1)
    assert {t: _data_files_on_disk(warehouse, t) for t in ("db.a", "db.b")} == on_disk
    arm_fault()
    _run(plan_routed_write(raw, CDC, False), [second], CDC_ARROW, 1)
    model = _Model()
    model.apply(first + second, {"db.a": "k", "db.b": "k"})
    for t in ("db.a", "db.b"):
        assert_readers_see(warehouse, t, expected_rows(model.rows(t), ["k", "v"]), ["k", "v"])


def test_a_process_writing_many_keyed_tables_keeps_few_indexes_open(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each key index maps files and holds descriptors: a task writing 12 keyed tables keeps the
    last 3 tables' open; a table met again reopens its index and stays exact."""
    from lakesink_datasource.index import environment
    from lakesink_datasource.routing import route_task

    monkeypatch.setattr(route_task, "KEEP_OPEN_TABLES", 3)
    raw = {"table_column": "tbl", "warehouse": warehouse, "progress": "false", "maintenance": "off", "operation": "upsert",
           "primary_key": "id", "index_dir": os.path.join(warehouse, "idx")}
    index_root = os.path.abspath(os.path.join(warehouse, "idx"))
    tables = [f"db.k{i:02d}" for i in range(12)]
    for batch_id in range(2):
        rows = [{"tbl": t, "id": i, "v": f"{batch_id}"} for t in tables for i in range(batch_id, batch_id + 4)]
        _run(plan_routed_write(raw, FLAT, False), [rows], FLAT_ARROW, batch_id)
        open_tables = {p.removeprefix(index_root).split(os.sep)[1].split(".")[0] for p in environment.cached_paths() if p.startswith(index_root)}
        uuids = {str(load(warehouse, t).metadata.table_uuid) for t in tables}
        assert len(open_tables) == 3 and open_tables <= uuids  # three of these tables' indexes, no more, none other
    for t in tables:
        want = [{"id": 0, "v": "0"}] + [{"id": i, "v": "1"} for i in range(1, 5)]
        assert_readers_see(warehouse, t, expected_rows(want, ["id", "v"]), ["id", "v"])


def test_one_tables_bad_payload_creates_and_writes_no_table(warehouse: str) -> None:
    raw = {"table_column": "tbl", "payload_column": "after", "warehouse": warehouse, "progress": "false", "maintenance": "off"}
    schema = T.StructType([T.StructField("tbl", T.StringType()), T.StructField("after", T.StringType())])
    arrow = pa.schema([("tbl", pa.string()), ("after", pa.string())])
    write = plan_routed_write(raw, schema, False)
    rows = [{"tbl": "db.good", "after": '{"id": 1}'}, {"tbl": "db.bad", "after": '{"id": 2'}]
    with pytest.raises(RoutedInputError, match="column 'after' \\(payload_column\\) holds a value that is not a JSON object"):
        _run(write, [rows], arrow, None)
    assert not table_exists(warehouse, "db.good") and not table_exists(warehouse, "db.bad")
    # A field null in every row is left out until a row types it.
    _run(write, [[{"tbl": "db.good", "after": '{"id": 1, "later": null}'}]], arrow, None)
    assert [f.name for f in load(warehouse, "db.good").schema().fields] == ["id"]


def test_debeziums_message_key_names_each_rows_key(warehouse: str) -> None:
    """key_column: the key's fields are the row's key and a created table's primary key; a
    delete whose payload is null (as Debezium sends it) deletes by the key alone."""
    raw = {"table_column": "tbl", "payload_column": "after", "key_column": "key", "operation": "cdc", "op_column": "op",
           "warehouse": warehouse, "index_dir": os.path.join(warehouse, "idx"), "progress": "false", "maintenance": "off"}
    schema = T.StructType([T.StructField(n, T.StringType()) for n in ("tbl", "op", "key", "after")])
    arrow = pa.schema([(n, pa.string()) for n in ("tbl", "op", "key", "after")])
    write = plan_routed_write(raw, schema, False)
    _run(write, [[
        {"tbl": "db.users", "op": "c", "key": '{"uid": 1}', "after": '{"uid": 1, "name": "ann"}'},
        {"tbl": "db.users", "op": "c", "key": '{"uid": 2}', "after": '{"uid": 2, "name": "bob"}'},
        {"tbl": "db.orders", "op": "c", "key": '{"oid": 9}', "after": '{"oid": 9, "total": 5.5}'},
    ]], arrow, 0)
    assert [load(warehouse, "db.users").schema().find_column_name(i) for i in load(warehouse, "db.users").schema().identifier_field_ids] == ["uid"]
    _run(write, [[
        {"tbl": "db.users", "op": "d", "key": '{"uid": 1}', "after": None},
        {"tbl": "db.orders", "op": "u", "key": '{"oid": 9}', "after": '{"oid": 9, "total": 7.0}'},
    ]], arrow, 1)
    assert_readers_see(warehouse, "db.users", expected_rows([{"uid": 2, "name": "bob"}], ["uid", "name"]), ["uid", "name"])
    assert_readers_see(warehouse, "db.orders", expected_rows([{"oid": 9, "total": 7.0}], ["oid", "total"]), ["oid", "total"])
    with pytest.raises(OptionError, match="option 'key_column' needs 'payload_column'"):
        plan_routed_write({**raw, "payload_column": ""}, schema, False)
