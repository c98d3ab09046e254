"""An unknown outcome is never a failure (issue 60).

The catalog applies a batch's commit, and then lakesink hears an error instead of the
answer: every exception type a catalog's clients raise (requests, urllib3, http.client,
json, SQLAlchemy, sqlite3, psycopg2, OSError) and one class no client has, defined here.
Only a catalog's refusal proves that a commit did not apply; after any other error the
commit's files stay and the table is read, and the stream goes on as the table says.

One append stream per catalog kind (the embedded SQLite catalog, PostgreSQL, SeaweedFS's
REST catalog on its S3 store) meets every error in turn, one per batch, raised by a fault
point right after the catalog applied the commit. After it: the stream ran to its end,
every batch landed once, and the table reads exact in pyiceberg and DuckDB.
"""

from __future__ import annotations

import base64
import errno
import http.client
import json
import os
import sqlite3
import sys
import uuid
from collections import Counter
from pathlib import Path

import psycopg2
import pyarrow as pa
import pytest
import requests.exceptions
import sqlalchemy.exc
import urllib3.exceptions
from lakesink_testing import expected_rows, numbered_parquet_source, rows, stream_files_into_lakesink
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from pyspark import cloudpickle

from lakesink_datasource.check import check_table
from lakesink_datasource.duckdb_reader import connect as duckdb_connect
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, QUERY_ID

COLUMNS = ["id", "name"]


class UnlistedError(Exception):
    """A type no catalog client raises and no rule of lakesink names."""


def _errors() -> list[BaseException]:
    """What a catalog's clients raise when an answer is cut off, garbled or lost (the
    messages are theirs: requests/urllib3 on a body cut short, libpq on a dropped TLS
    connection, SQLite on a failing disk)."""
    cut = http.client.IncompleteRead(b'{"metadata-location": "s3://warehouse/', 2048)
    return [
        requests.exceptions.ChunkedEncodingError(
            urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(38 bytes read, 2048 more expected)", cut)
        ),
        requests.exceptions.ConnectionError("('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))"),
        requests.exceptions.JSONDecodeError("Unterminated string starting at", '{"metadata-location": "s3://warehouse/', 23),
        urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(38 bytes read, 2048 more expected)", cut),
        cut,
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        json.JSONDecodeError("Unterminated string starting at", '{"metadata-location": "s3://warehouse/', 23),
        sqlalchemy.exc.OperationalError("COMMIT", {}, psycopg2.OperationalError("SSL SYSCALL error: EOF detected")),
        sqlalchemy.exc.OperationalError("COMMIT", {}, sqlite3.OperationalError("disk I/O error")),
        sqlalchemy.exc.InterfaceError("COMMIT", {}, psycopg2.InterfaceError("connection already closed")),
        sqlite3.DatabaseError("database disk image is malformed"),
        psycopg2.OperationalError("server closed the connection unexpectedly"),
        OSError(errno.EIO, "Input/output error"),
        UnlistedError("raised after the catalog applied the commit"),
    ]


def _pickled(errors: list[BaseException]) -> list[str]:
    # By value: the commit runs in a Python process of Spark's that cannot import this module.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        return [base64.b64encode(cloudpickle.dumps(e)).decode() for e in errors]
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _stream(spark, options: dict[str, str], table: str, tmp_path: Path, batches: int) -> list[list[dict]]:  # type: ignore[no-untyped-def]
    parts = [[{"id": b * 100 + i, "name": f"b{b}-{i}"} for i in range(10)] for b in range(batches)]
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    source = numbered_parquet_source(tmp_path / "source", parts, schema)
    all_options = {**options, "table": table, "maintenance": "off"}
    assert stream_files_into_lakesink(spark, source, "id long, name string", all_options, tmp_path / "checkpoint") == list(range(batches))
    return parts


def _assert_exact(table: Table, parts: list[list[dict]], s3: dict[str, str] | None = None) -> None:
    expected = expected_rows([r for part in parts for r in part], COLUMNS)
    assert rows(table.scan().to_arrow(), COLUMNS) == expected, "pyiceberg disagrees with the rows written"
    duck = duckdb_connect(s3).execute(f"SELECT id, name FROM iceberg_scan('{table.metadata_location}')").to_arrow_table()
    assert rows(duck, COLUMNS) == expected, "DuckDB disagrees with the rows written"
    assert check_table(table) == []
    epochs = Counter(
        (s.summary[QUERY_ID], s.summary[EPOCH_ID]) for s in table.metadata.snapshots
        if s.summary is not None and EPOCH_ID in s.summary.additional_properties
    )
    assert len(epochs) == len(parts) and max(epochs.values()) == 1, epochs


# The servers' kinds carry their markers: the fixtures are taken inside, not named.
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("rest", marks=pytest.mark.s3)])
def test_every_error_after_an_applied_commit_keeps_the_table_and_the_stream(
    spark, arm_fault, request: pytest.FixtureRequest, tmp_path: Path, kind: str,  # type: ignore[no-untyped-def]
) -> None:
    errors = _errors()
    namespace = f"u{uuid.uuid4().hex[:10]}"
    s3 = None
    if kind == "sqlite":
        warehouse = str(tmp_path / "warehouse")
        options = {"warehouse": warehouse}
        props = {"type": "sql", "uri": f"sqlite:///{warehouse}/catalog.db", "warehouse": f"file://{warehouse}"}
        name = "lakesink"
    elif kind == "postgres":
        uri = request.getfixturevalue("postgres_uri")
        warehouse = f"file://{tmp_path / 'warehouse'}"
        name = "pgu"
        options = {"catalog": name, "catalog.type": "sql", "catalog.uri": uri, "catalog.warehouse": warehouse}
        props = {"type": "sql", "uri": uri, "warehouse": warehouse}
    else:
        store = request.getfixturevalue("object_store")
        options = store.options("rest", tmp_path, namespace)
        name = options["catalog"]
        props = {k.removeprefix("catalog."): v for k, v in options.items() if k.startswith("catalog.")}
        s3 = store.s3
    # Every commit of the stream after its first (which creates the table) meets one error.
    hits = list(range(2, len(errors) + 2))
    arm_fault({"point": "catalog_updated", "nth": hits, "action": "raise_pickled", "errors": _pickled(errors)})
    parts = _stream(spark, options, f"{namespace}.t", tmp_path, len(errors) + 2)
    fired = json.loads(Path(os.environ["LAKESINK_FAULTS"]).read_text())[0]["hits"]
    assert fired >= max(hits), f"the fault point was reached {fired} times; the test needs {max(hits)}"
    _assert_exact(load_catalog(name, **props).load_table(f"{namespace}.t"), parts, s3)


def test_every_commit_that_is_not_a_data_commit_settles_an_unknown_outcome(spark, arm_fault, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Schema evolution, a partition spec change, compaction and expiry (with the data commits
    between them) each meet an error after the embedded catalog applied them: an error of a
    type nobody listed, a truncated JSON answer, an I/O error, in turn. Each write returns,
    each maintenance step reports what it did, and the table is exact."""
    from lakesink_testing import load

    from lakesink_datasource.maintain import maintain_table

    warehouse = str(tmp_path / "warehouse")
    options = {"warehouse": warehouse, "table": "db.t", "maintenance": "off"}
    first = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    spark.createDataFrame(first, "id long, name string").write.format("lakesink").options(**options).mode("append").save()
    errors = [UnlistedError("raised after the catalog applied the commit"),
              json.JSONDecodeError("Unterminated string starting at", '{"metadata-location": "file:/', 23),
              OSError(errno.EIO, "Input/output error")]
    arm_fault({"point": "catalog_updated", "nth": list(range(1, 41)), "action": "raise_pickled", "errors": _pickled(errors)})
    evolved = [{"id": 3, "name": "c", "score": 0.5}]
    spark.createDataFrame(evolved, "id long, name string, score double").write.format("lakesink").options(
        **options, merge_schema="true").mode("append").save()
    respread = [{"id": i, "name": f"n{i}", "score": None} for i in range(4, 8)]
    spark.createDataFrame(respread, "id long, name string, score double").write.format("lakesink").options(
        **options, partition_by="bucket(4, id)", evolve_partition="true").mode("append").save()
    table = load(warehouse, "db.t")
    compacted = maintain_table(table, "compact", target_file_size=1 << 30)
    expired = maintain_table(load(warehouse, "db.t"), "expire", older_than_ms=0)
    fired = json.loads(Path(os.environ["LAKESINK_FAULTS"]).read_text())[0]["hits"]
    arm_fault()
    assert fired >= 6, f"the fault point was reached {fired} times: staging and data commits, compaction, expiry"
    assert compacted.compaction is not None and compacted.compaction.skipped_reason is None, compacted.lines
    assert expired.expiry is not None and expired.expiry.expired_snapshots > 0, expired.lines
    table = load(warehouse, "db.t")
    assert [f.name for f in table.schema().fields] == ["id", "name", "score"]
    assert [f.name for f in table.spec().fields] == ["id_bucket"]
    expected = expected_rows([{**r, "score": None} for r in first] + evolved + respread, ["id", "name", "score"])
    assert rows(table.scan().to_arrow(), ["id", "name", "score"]) == expected
    duck = duckdb_connect(None).execute(f"SELECT id, name, score FROM iceberg_scan('{table.metadata_location}')").to_arrow_table()
    assert rows(duck, ["id", "name", "score"]) == expected
    assert check_table(table) == []
