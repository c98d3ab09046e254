"""A commit whose answer is lost never breaks the table; a throttling store is waited out (issue 44).

The catalog applies a commit and its answer never reaches lakesink: SeaweedFS's real REST
catalog behind a proxy on the loopback that forwards the commit and then answers 503, closes
the connection, or holds the answer past the client's timeout; PostgreSQL behind a proxy
that drops the connection once the COMMIT of the catalog's UPDATE was applied; the embedded
SQLite catalog with its answer lost right after the UPDATE committed (a fault point: SQLite
has no connection to drop). Each loses the first, a middle and two consecutive commits of
an append stream, a keyed upsert stream and a run of batch writes. After each, the table
reads the same in DuckDB and pyiceberg, `check` passes, every row is there once, no batch
landed twice and the stream never stopped.
"""

from __future__ import annotations

import os
import re
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pytest
from fault_proxy import HttpFaultProxy, PostgresDropProxy, Rule
from lakesink_testing import expected_rows, numbered_parquet_source, rows, stream_files_into_lakesink
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

from lakesink_datasource.check import check_table
from lakesink_datasource.duckdb_reader import connect as duckdb_connect
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, QUERY_ID

COLUMNS = ["id", "name"]
BATCHES = 7
LOST = {1, 3, 5, 6}  # the first commit, a middle one, two consecutive ones


def _lost(n: int) -> bool:
    return n in LOST


def _batches(workload: str) -> list[list[dict]]:
    if workload == "upsert":  # keys come back: the last write of each wins
        return [[{"id": (b * 7 + i) % 40, "name": f"b{b}-{i}"} for i in range(20)] for b in range(BATCHES)]
    return [[{"id": b * 100 + i, "name": f"b{b}-{i}"} for i in range(20)] for b in range(BATCHES)]


def _model(workload: str, batches: list[list[dict]]) -> list[dict]:
    if workload != "upsert":
        return [r for part in batches for r in part]
    live: dict[int, dict] = {}
    for part in batches:
        live.update({r["id"]: r for r in part})
    return list(live.values())


def _workload_options(workload: str, tmp_path: Path) -> dict[str, str]:
    if workload == "upsert":  # compaction and expiry on, as a keyed stream runs by default
        return {"operation": "upsert", "primary_key": "id", "index_dir": str(tmp_path / "index")}
    return {"maintenance": "off"}


def _run(spark, workload: str, options: dict[str, str], table: str, tmp_path: Path) -> list[list[dict]]:  # type: ignore[no-untyped-def]
    """Write the workload's batches: a stream (one file per micro-batch) or batch writes."""
    batches = _batches(workload)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    all_options = {**options, **_workload_options(workload, tmp_path), "table": table}
    if workload == "upsert" and options.get("catalog.type") == "rest":
        # SeaweedFS's table bucket takes only Parquet, ORC and Avro under data/: the
        # deletion vectors (Puffin) go under a data path it exempts.
        namespace, name = table.split(".")
        all_options["property.write.data.path"] = f"s3://warehouse/{namespace}/{name}/_data"
    if workload == "batch":
        for part in batches:  # each write must return: a lost answer is no failure
            spark.createDataFrame(part, "id long, name string").write.format("lakesink").options(**all_options).mode("append").save()
        return batches
    source = numbered_parquet_source(tmp_path / "source", batches, schema)
    assert stream_files_into_lakesink(spark, source, "id long, name string", all_options, tmp_path / "checkpoint") == list(range(BATCHES))
    return batches


def _assert_exact(table: Table, workload: str, batches: list[list[dict]], s3: dict[str, str] | None = None) -> None:
    expected = expected_rows(_model(workload, batches), COLUMNS)
    assert rows(table.scan().to_arrow(), COLUMNS) == expected, "pyiceberg disagrees with the model"
    duck = duckdb_connect(s3).execute(f"SELECT id, name FROM iceberg_scan('{table.metadata_location}')").to_arrow_table()
    assert rows(duck, COLUMNS) == expected, "DuckDB disagrees with the model"
    assert check_table(table) == []
    if workload != "batch":
        # No batch landed twice (snapshots expire in the keyed stream: count the ones kept).
        epochs = Counter(
            (s.summary[QUERY_ID], s.summary[EPOCH_ID]) for s in table.metadata.snapshots
            if s.summary is not None and EPOCH_ID in s.summary.additional_properties
        )
        assert epochs and max(epochs.values()) == 1, epochs


# ----------------------------------------------------------------- REST catalog


@pytest.mark.parametrize("workload", ["append", "upsert", "batch"])
@pytest.mark.parametrize("fault", ["503", "close", "timeout"])
def test_a_lost_rest_answer_keeps_the_table_and_the_stream(spark, object_store, tmp_path: Path, fault: str, workload: str) -> None:  # type: ignore[no-untyped-def]
    namespace = f"n{uuid.uuid4().hex[:10]}"
    options = object_store.options("rest", tmp_path, namespace)
    # Table commits only: POST .../namespaces/<ns>/tables/<table> (not the table's creation).
    commits = Rule("POST", re.compile(rf"/namespaces/{namespace}/tables/t$"), fault, _lost, hold=5.0)
    with HttpFaultProxy(object_store.rest_uri, [commits]) as proxy:
        # The client waits 3 s for an answer; the proxy holds a `timeout` one for 5.
        routed = {**options, "catalog.uri": proxy.url, "catalog.rest.client.socket-timeout-ms": "3000"}
        batches = _run(spark, workload, routed, f"{namespace}.t", tmp_path)
    assert set(commits.fired) == LOST, f"the proxy lost the answers of commits {commits.fired}, of {commits.seen}"
    props = {k.removeprefix("catalog."): v for k, v in options.items() if k.startswith("catalog.")}
    table = load_catalog(options["catalog"], **props).load_table(f"{namespace}.t")
    _assert_exact(table, workload, batches, object_store.s3)


@pytest.mark.parametrize("fault", ["half", "html502"])
def test_a_rest_answer_cut_in_half_or_replaced_keeps_the_table_and_the_stream(spark, object_store, tmp_path: Path, fault: str) -> None:  # type: ignore[no-untyped-def]
    """Issue 60: the catalog applies the commit and its answer arrives cut in half (the headers
    promise the whole body, the connection closes halfway: requests' ChunkedEncodingError) or
    as a load balancer's HTML 502 page. An error nobody listed is no proof that the commit did
    not land: its files stay, the table is read, and the stream goes on."""
    namespace = f"n{uuid.uuid4().hex[:10]}"
    options = object_store.options("rest", tmp_path, namespace)
    commits = Rule("POST", re.compile(rf"/namespaces/{namespace}/tables/t$"), fault, _lost)
    with HttpFaultProxy(object_store.rest_uri, [commits]) as proxy:
        batches = _run(spark, "append", {**options, "catalog.uri": proxy.url}, f"{namespace}.t", tmp_path)
    assert set(commits.fired) == LOST, f"the proxy spoiled the answers of commits {commits.fired}, of {commits.seen}"
    props = {k.removeprefix("catalog."): v for k, v in options.items() if k.startswith("catalog.")}
    table = load_catalog(options["catalog"], **props).load_table(f"{namespace}.t")
    _assert_exact(table, "append", batches, object_store.s3)


# ----------------------------------------------------------------- SQL catalogs


@pytest.mark.parametrize("workload", ["append", "upsert", "batch"])
def test_a_lost_sqlite_answer_keeps_the_table_and_the_stream(spark, arm_fault, tmp_path: Path, workload: str) -> None:  # type: ignore[no-untyped-def]
    warehouse = str(tmp_path / "warehouse")
    arm_fault({"point": "catalog_updated", "nth": sorted(LOST), "action": "lose_answer"})
    batches = _run(spark, workload, {"warehouse": warehouse}, "db.t", tmp_path)
    rules = __import__("json").loads(Path(os.environ["LAKESINK_FAULTS"]).read_text())
    assert rules[0]["hits"] >= max(LOST), "the fault point was not reached as often as the test needs"
    catalog = load_catalog("lakesink", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    _assert_exact(catalog.load_table("db.t"), workload, batches)


@pytest.mark.parametrize("workload", ["append", "upsert", "batch"])
def test_a_dropped_postgres_connection_after_the_update_keeps_the_table(spark, postgres_uri: str, tmp_path: Path, workload: str) -> None:  # type: ignore[no-untyped-def]
    real = urlsplit(postgres_uri)
    namespace = f"pg_{uuid.uuid4().hex[:8]}"
    warehouse = f"file://{tmp_path / 'warehouse'}"
    updates: Callable[[int], bool] = _lost
    with PostgresDropProxy((real.hostname or "127.0.0.1", real.port or 5432), updates) as proxy:
        netloc = real.netloc.rsplit("@", 1)
        proxied = urlunsplit(real._replace(netloc=(netloc[0] + "@" if len(netloc) == 2 else "") + f"127.0.0.1:{proxy.port}"))
        options = {"catalog": "pgp", "catalog.type": "sql", "catalog.uri": proxied, "catalog.warehouse": warehouse}
        batches = _run(spark, workload, options, f"{namespace}.t", tmp_path)
    assert set(proxy.dropped) == LOST, f"dropped after updates {proxy.dropped}, of {proxy.updates}"
    table = load_catalog("pgp", type="sql", uri=postgres_uri, warehouse=warehouse).load_table(f"{namespace}.t")
    _assert_exact(table, workload, batches)


# ----------------------------------------------------------------- throttling


@pytest.mark.parametrize("setup", ["sql", "rest"])
def test_a_keyed_stream_waits_out_a_throttling_store(spark, object_store, tmp_path: Path, setup: str) -> None:  # type: ignore[no-untyped-def]
    """A proxy in front of the real S3 store answers 503 SlowDown to bursts of PUT, GET and
    multipart requests, longer than pyarrow's own three attempts: the upsert stream (table
    creation included) keeps running and its table is exact."""
    namespace = f"n{uuid.uuid4().hex[:10]}"
    options = object_store.options(setup, tmp_path, namespace)
    throttled = Rule("PUT,GET,POST", re.compile(r"^/(warehouse|plain)/"), "slowdown", lambda n: n % 20 < 5)
    with HttpFaultProxy(object_store.s3["s3.endpoint"], [throttled]) as proxy:
        routed = {**options, "catalog.s3.endpoint": proxy.url}
        batches = _run(spark, "upsert", routed, f"{namespace}.t", tmp_path)
    assert len(throttled.fired) >= 5, "the store was not throttled"
    props = {k.removeprefix("catalog."): v for k, v in options.items() if k.startswith("catalog.")}
    table = load_catalog(options["catalog"], **props).load_table(f"{namespace}.t")
    _assert_exact(table, "upsert", batches, object_store.s3)
