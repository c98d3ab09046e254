"""A database's change stream as Debezium writes it (issue 52), through Spark: Kafka-shaped
records (key, value, topic, partition, offset) of a PostgreSQL, a MySQL and a SQL Server
connector, read as a stream of Parquet files, written with `cdc_format=debezium`.

Every replica is compared with its plain model (tests/debezium_events.py) in DuckDB and
pyiceberg: after a clean run, and after SIGKILLs at the windows that matter (after one
table's commit of a batch, before another's swap, between two tables committed in turn).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from debezium_events import KAFKA_ARROW, Column, Connector, Replica, SourceDatabase, SourceTable
from lakesink_testing import duckdb_rows, load, pyiceberg_rows

from lakesink_datasource.iceberg.summary_keys import EPOCH_ID

CHILD = str(Path(__file__).with_name("debezium_child.py"))
CUSTOMERS = SourceTable("shop", "public", "customers", (
    Column("id", "int32", optional=False), Column("name", "string"), Column("bio", "string"), Column("balance", "decimal"),
    Column("since", "date"), Column("updated", "zoned_timestamp"),
), ("id",))
ORDERS = SourceTable("shop", "public", "orders", (Column("order_id", "int64", optional=False), Column("total", "decimal", scale=3, precision=12)), ("order_id",))
AUDIT = SourceTable("shop", "public", "audit", (Column("msg", "string"), Column("n", "int64")), ())
PRODUCTS = SourceTable("inventory", None, "products", (Column("sku", "string", optional=False), Column("price", "decimal")), ("sku",))
SALES = SourceTable("testDB", "dbo", "sales", (Column("id", "int32", optional=False), Column("qty", "int32")), ("id",))
TABLES = [CUSTOMERS, ORDERS, AUDIT, PRODUCTS, SALES]
BATCHES = 6


def _name(t: SourceTable) -> str:
    return f"replica.{t.table}"


def make_stream(folder: Path, seed: int = 52) -> Replica:
    """Six micro-batches of the three connectors' records, one Parquet file each; returns the
    model of the replicas once every batch is in."""
    rng = random.Random(seed)
    pg = SourceDatabase(Connector("postgresql", "pg", partitions=2), [CUSTOMERS, ORDERS, AUDIT], toasted=["bio"])
    my = SourceDatabase(Connector("mysql", "my"), [PRODUCTS])
    ms = SourceDatabase(Connector("sqlserver", "ms", wrapper=False), [SALES])
    for i in range(8):
        pg.snapshot("customers", {"id": i, "name": f"c{i}", "bio": "x" * 300, "balance": f"{i}.50", "since": dt.date(2020, 1, 1),
                                  "updated": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)})
        ms.snapshot("sales", {"id": i, "qty": i})
    folder.mkdir(parents=True)
    model = Replica()
    done = {id(db): (0, 0) for db in (pg, my, ms)}
    n = 0
    for b in range(BATCHES):
        for _ in range(40):
            n += 1
            k = rng.randint(0, 9)
            r = rng.random()
            if r < 0.25:
                pg.update("customers", (k,), {"name": f"n{n}", **({"bio": f"new {n}"} if rng.random() < 0.3 else {})})
            elif r < 0.35:
                pg.delete("customers", (k,))
            elif r < 0.45:
                pg.insert("customers", {"id": k, "name": f"c{n}", "bio": "y" * 300, "balance": "1.00", "since": dt.date(2021, 5, 5),
                                        "updated": dt.datetime(2024, 3, 1, 12, tzinfo=dt.timezone.utc)})
            elif r < 0.6:
                pg.insert("orders", {"order_id": n, "total": f"{n}.125"})
            elif r < 0.65:
                pg.insert("audit", {"msg": f"m{n}", "n": n})
            elif r < 0.8:
                my.insert("products", {"sku": f"s{k}", "price": "2.00"})
                my.update("products", (f"s{k}",), {"price": f"{k}.{n % 100:02d}"})
            else:
                ms.update("sales", (k % 8,), {"qty": n})
        if b == 2:
            pg.truncate("orders")
            my.connector.rotate()
        if b == 4:
            pg.resend(4)
        records: list[dict[str, Any]] = [pg.connector.heartbeat()]
        events = []
        for db in (pg, my, ms):
            start_records, start_events = done[id(db)]
            records += db.records[start_records:]
            events += db.events[start_events:]
            done[id(db)] = (len(db.records), len(db.events))
        model.apply(events, _name)
        path = folder / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(records, schema=KAFKA_ARROW), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))  # file b is batch b
    return model


def assert_replicas(warehouse: str, model: Replica) -> None:
    for t in TABLES:
        columns = [c.name for c in t.columns] + ([] if t.key else ["__op"])
        table = load(warehouse, _name(t))
        expected = model.rows(_name(t), columns)
        assert pyiceberg_rows(table, columns) == expected, f"{_name(t)}: pyiceberg disagrees with the model"
        assert duckdb_rows(table.metadata_location, columns) == expected, f"{_name(t)}: DuckDB disagrees with the model"


def run(tmp_path: Path, warehouse: str, faults: list[dict] | None, *extra: str) -> int:
    env = dict(os.environ)
    env.pop("LAKESINK_FAULTS", None)
    if faults is not None:
        path = tmp_path / "child-faults.json"
        path.write_text(json.dumps(faults))
        env["LAKESINK_FAULTS"] = str(path)
    proc = subprocess.run(
        [sys.executable, CHILD, str(tmp_path / "source"), str(tmp_path / "checkpoint"), warehouse, *extra],
        env=env, start_new_session=True, capture_output=True, timeout=600,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr.decode()[-3000:])
    return proc.returncode


@pytest.mark.slow
def test_a_debezium_stream_of_three_connectors_survives_sigkills_with_every_replica_exact(tmp_path: Path, warehouse: str) -> None:
    model = make_stream(tmp_path / "source")
    # Batch 1 landed in every table (one transaction), Spark never logged it: replayed.
    assert run(tmp_path, warehouse, [{"point": "after_commit", "batch": 1, "table": "replica.customers", "action": "kill"}]) == -signal.SIGKILL
    # Batch 3 (the truncate's, the binlog rotation's) killed before one table's swap: none of its tables changed.
    assert run(tmp_path, warehouse, [{"point": "before_commit", "batch": 3, "table": "replica.products", "action": "kill"}]) == -signal.SIGKILL
    for t in TABLES:
        epochs = [s.summary[EPOCH_ID] for s in load(warehouse, _name(t)).metadata.snapshots if EPOCH_ID in s.summary.additional_properties]
        assert "3" not in epochs, _name(t)
    # One table after another: the driver dies between two tables' commits of batch 4 (the re-sent events').
    assert run(tmp_path, warehouse, [{"point": "after_commit", "batch": 4, "table": "replica.orders", "action": "kill"}], "commit_tables=in_turn") == -signal.SIGKILL
    assert run(tmp_path, warehouse, None) == 0
    assert_replicas(warehouse, model)
    for t in TABLES:
        epochs = Counter(s.summary[EPOCH_ID] for s in load(warehouse, _name(t)).metadata.snapshots if EPOCH_ID in s.summary.additional_properties)
        assert all(count == 1 for count in epochs.values()), f"{_name(t)}: a batch committed twice {epochs}"


def test_a_debezium_stream_and_a_batch_write_in_the_shared_session(spark, tmp_path: Path, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    model = make_stream(tmp_path / "source", seed=7)
    options = {"warehouse": warehouse, "cdc_format": "debezium", "namespace": "replica", "maintenance": "off"}
    df = spark.readStream.schema("key binary, value binary, topic string, partition int, offset long").option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "source"))
    query = df.writeStream.format("lakesink").options(**options).option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    query.awaitTermination()
    assert_replicas(warehouse, model)
    # The same records as JSON text in a batch write, into another namespace: the same replicas.
    text = spark.read.parquet(str(tmp_path / "source")).selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value", "topic", "partition", "offset")
    text.orderBy("offset").coalesce(1).write.format("lakesink").options(**{**options, "namespace": "again"}).mode("append").save()
    for t in TABLES:
        columns = [c.name for c in t.columns] + ([] if t.key else ["__op"])
        assert pyiceberg_rows(load(warehouse, f"again.{t.table}"), columns) == model.rows(_name(t), columns), t.table


def test_a_debezium_stream_clustered_by_key_keeps_each_shard_on_its_task(spark, tmp_path: Path, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    from lakesink_datasource import cluster_by_key
    from lakesink_datasource.index.key_shards import file_shard

    model = make_stream(tmp_path / "source", seed=11)
    options = {"warehouse": warehouse, "cdc_format": "debezium", "namespace": "replica", "maintenance": "off"}
    df = spark.readStream.schema("key binary, value binary, topic string, partition int, offset long").option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "source"))
    routed = cluster_by_key(df, shards=2, **options)
    query = routed.writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    query.awaitTermination()
    assert_replicas(warehouse, model)
    for t in (CUSTOMERS, ORDERS, PRODUCTS, SALES):
        for task in load(warehouse, _name(t)).scan().plan_files():
            route = file_shard(task.file.file_path)
            assert route is not None and route.by_text and route.shards == 2, task.file.file_path
