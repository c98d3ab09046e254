"""cluster_by_key on a write routed to many tables (issue 47): each table's keys clustered by
the texts of their fields, as Spark hashes them. Spark's hash of a key's text is the same
whatever the JSON spells around it, and equals lakesink's replay from the table's values;
a clustered batch and stream write every table exactly, each file holding one shard's keys;
bad input is refused before any table is created."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, duckdb_rows, expected_rows, load, table_exists

from lakesink_datasource.index.key_shards import file_shard, shard_of_key_texts
from lakesink_datasource.routing.route_options import parse_routing

pytestmark = pytest.mark.spark

COLUMNS = ["id", "name"]


def test_sparks_hash_of_a_key_text_ignores_spelling_and_equals_the_replay_from_typed_values(spark) -> None:
    """The same key spelled with other whitespace, field order, name case or a struct gives
    one hash in Spark, the hash lakesink computes from the key's values in the table's types."""
    from pyspark.sql import functions as F

    from lakesink_datasource.key_clustering import key_text_column

    keys = [
        (7, "b", True, dt.date(2024, 2, 29)),
        (-(1 << 40), "é ü\"x", False, dt.date(1970, 1, 1)),
        (0, "", True, dt.date(9999, 12, 31)),
    ]
    rows = []
    for i, (n, s, b, d) in enumerate(keys):
        fields = {"n": n, "s": s, "b": b, "d": d.isoformat()}
        rows.append(("db.t", i, json.dumps(fields)))
        rows.append(("db.t", i, json.dumps(dict(reversed(fields.items())), indent=2)))  # other order, newlines
        rows.append(("db.t", i, json.dumps({k.upper(): v for k, v in fields.items()}, separators=(",", ":"))))
    df = spark.createDataFrame(rows, "tbl string, i int, k string")
    struct_df = spark.createDataFrame(
        [("db.t", i, (s, n, b, d)) for i, (n, s, b, d) in enumerate(keys)], "tbl string, i int, k struct<s:string,n:long,b:boolean,d:date>"
    )
    got = []
    for frame in (df, struct_df):
        routing = parse_routing({"table_column": "tbl", "key_column": "k", "payload_column": "k", "operation": "upsert"})
        got += frame.select("i", F.xxhash64(key_text_column(routing, frame.schema)).alias("h")).collect()
    by_key: dict[int, set[int]] = {}
    for row in got:
        by_key.setdefault(row.i, set()).add(row.h)
    assert all(len(hashes) == 1 for hashes in by_key.values()), by_key
    # The table's key columns, in its types, ordered by name as the route orders them: b, d, n, s.
    typed = [
        pa.array([k[2] for k in keys]), pa.array([k[3] for k in keys], pa.date32()),
        pa.array([k[0] for k in keys], pa.int64()), pa.array([k[1] for k in keys]),
    ]
    for shards in (1, 3, 8, 32768):
        expected = shard_of_key_texts(typed, shards).tolist()
        assert [next(iter(by_key[i])) % shards for i in range(len(keys))] == expected


def _event(table: str, op: str, key: int, name: str | None) -> dict:
    return {
        "tbl": table, "op": op, "key": json.dumps({"id": key}),
        "after": None if op == "d" else json.dumps({"id": key, "name": name}),
    }


def _files_hold_one_shard_each(warehouse: str, identifier: str, shards: int) -> None:
    """Every live data file names one text shard, and every key in it hashes to that shard."""
    table = load(warehouse, identifier)
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert files
    for path in files:
        route = file_shard(path)
        assert route is not None and route.by_text and route.shards == shards, path
        ids = pq.read_table(path.removeprefix("file://"), columns=["id"]).column("id")
        assert set(shard_of_key_texts([ids], shards).tolist()) == {route.shard}, path


def test_a_clustered_batch_writes_each_tables_shards_exactly(spark, tmp_path: Path, warehouse: str) -> None:
    from lakesink_datasource import cluster_by_key

    options = {
        "warehouse": warehouse, "table_column": "tbl", "namespace": "db", "payload_column": "after", "key_column": "key",
        "operation": "cdc", "op_column": "op", "index_dir": str(tmp_path / "index"),
    }
    schema = "tbl string, op string, key string, after string"
    models: dict[str, dict[int, str]] = {"a": {}, "b": {}, "c": {}}
    rounds = [
        [_event(t, "c", k, f"{t}{k}-0") for t in models for k in range(40)],
        [_event(t, "u", k, f"{t}{k}-1") for t in ("a", "b") for k in range(0, 40, 3)] + [_event("c", "d", k, None) for k in range(0, 40, 2)],
    ]
    for events in rounds:
        for e in events:
            if e["op"] == "d":
                models[e["tbl"]].pop(json.loads(e["key"])["id"], None)
            else:
                after = json.loads(e["after"])
                models[e["tbl"]][after["id"]] = after["name"]
        df = spark.createDataFrame([tuple(e.values()) for e in events], schema)
        cluster_by_key(df, shards=3, **options).write.format("lakesink").options(**options).mode("append").save()
    for table, model in models.items():
        want = expected_rows([{"id": k, "name": v} for k, v in model.items()], COLUMNS)
        assert_readers_see(warehouse, f"db.{table}", want, COLUMNS)
        _files_hold_one_shard_each(warehouse, f"db.{table}", 3)
    # Each shard's index of each table, kept apart from an unclustered write's.
    assert len(list((tmp_path / "index").glob("*.key-text-shard-*-of-00003"))) == 9


def test_a_clustered_stream_writes_each_tables_shards_exactly(spark, tmp_path: Path, warehouse: str) -> None:
    from lakesink_datasource import cluster_by_key

    source = tmp_path / "source"
    source.mkdir()
    events = [_event(t, "c", k, f"{t}{k}") for t in ("x", "y") for k in range(30)] + [_event("x", "d", 4, None)]
    pq.write_table(pa.Table.from_pylist(events), source / "0.parquet")
    options = {
        "warehouse": warehouse, "table_column": "tbl", "namespace": "db", "payload_column": "after", "key_column": "key",
        "operation": "cdc", "op_column": "op", "index_dir": str(tmp_path / "index"),
    }
    df = spark.readStream.schema("tbl string, op string, key string, after string").parquet(str(source))
    query = (
        cluster_by_key(df, **options).writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True).start()
    )
    query.awaitTermination()
    for table in ("x", "y"):
        want = [{"id": k, "name": f"{table}{k}"} for k in range(30) if (table, k) != ("x", 4)]
        assert duckdb_rows(load(warehouse, f"db.{table}").metadata_location, COLUMNS) == expected_rows(want, COLUMNS)
        _files_hold_one_shard_each(warehouse, f"db.{table}", 2)  # the default: one shard per task slot (local[2])


@pytest.mark.parametrize(
    "keys, options, message",
    [
        (("id",), {}, r"give no key columns \(got id\)"),
        ((), {"key_column": None}, r"give option 'key_column' .* or 'primary_key'"),
        ((), {"operation": "append"}, r"cluster_by_key is for keyed writes"),
        ((), {"key_column": "nope"}, r"option 'key_column': column 'nope' is not in the DataFrame"),
        ((), {"tables.db.t.branch": "b"}, r"option 'tables.db.t.branch' cannot be used with 'table_column'"),
        ((), {"tables.db.t.operation": "append"}, r"table\(s\) db.t are given a non-keyed operation"),
    ],
)
def test_clustering_a_routed_write_refuses_bad_input_before_anything_runs(
    spark, tmp_path: Path, warehouse: str, keys: tuple, options: dict, message: str
) -> None:
    from lakesink_datasource import LakesinkError, cluster_by_key

    df = spark.readStream.schema("tbl string, op string, key string, after string").parquet(str(tmp_path))
    given = {"warehouse": warehouse, "table_column": "tbl", "namespace": "db", "payload_column": "after", "key_column": "key",
             "operation": "upsert", **options}
    with pytest.raises(LakesinkError, match=message):
        cluster_by_key(df, *keys, **{k: v for k, v in given.items() if v is not None})
    assert not table_exists(warehouse, "db.t")


def test_a_key_in_a_shared_column_routes_deletes_whose_payload_is_null(spark, tmp_path: Path, warehouse: str) -> None:
    """The key is a top-level column (it wins over the payload's field, as in each table's
    row): a delete without payload is routed by it to the shard that holds the key."""
    from lakesink_datasource import cluster_by_key

    options = {"warehouse": warehouse, "table_column": "tbl", "namespace": "db", "payload_column": "after", "operation": "cdc",
               "op_column": "op", "primary_key": "id", "index_dir": str(tmp_path / "index")}
    schema = "tbl string, op string, id long, after string"
    inserts = [(t, "c", k, json.dumps({"id": k, "name": f"{t}{k}"})) for t in ("p", "q") for k in range(20)]
    deletes = [(t, "d", k, None) for t in ("p", "q") for k in range(0, 20, 4)]
    for rows in (inserts, deletes):
        df = spark.createDataFrame(rows, schema)
        cluster_by_key(df, shards=4, **options).write.format("lakesink").options(**options).mode("append").save()
    for table in ("p", "q"):
        want = [{"id": k, "name": f"{table}{k}"} for k in range(20) if k % 4]
        assert_readers_see(warehouse, f"db.{table}", expected_rows(want, COLUMNS), COLUMNS)


def test_a_key_whose_text_its_table_spells_otherwise_is_refused_before_any_table_is_created(spark, warehouse: str) -> None:
    """A timestamp key: Spark's JSON text of it is not Arrow's, so the shard its rows were
    routed to cannot be checked against the key's values: refused, naming the table and key."""
    from pyspark.errors import PySparkException

    from lakesink_datasource import cluster_by_key

    options = {"warehouse": warehouse, "table_column": "tbl", "namespace": "db", "payload_column": "row", "operation": "upsert",
               "primary_key": "at"}
    df = spark.createDataFrame(
        [("events", (dt.datetime(2024, 1, 1, 12) + dt.timedelta(hours=h), "x")) for h in range(16)],
        "tbl string, row struct<at:timestamp,v:string>",
    )
    with pytest.raises(PySparkException, match=r"table db.events: key column 'at' is timestamp.*only for integer, string, boolean and date"):
        cluster_by_key(df, shards=1, **options).write.format("lakesink").options(**options).mode("append").save()
    assert not table_exists(warehouse, "db.events")
