"""A routed batch's tables each wait with their own budget (issue 53): table r.a gives the
catalog one second (its table property `lakesink.outage-timeout-ms`), r.b ten minutes. The tables commit
together, each in a thread of its own (routing/route_commit.py); the outage budget used to
be one process-wide value that each thread set, so one table's setting became the other's.

Driven as Spark drives a routed write, without Spark: the task (`write_routed_task`), then
the driver's commit of every table (`commit_routed` with the data source's own commit) on
the embedded SQLite catalog, which commits a batch's tables in one transaction. The catalog
is made to refuse one table's calls (`catalog_call` / `refuse`); the tables are read with
DuckDB and pyiceberg.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, embedded_catalog, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource import datasource
from lakesink_datasource.catalog.errors import CatalogUnavailable
from lakesink_datasource.iceberg.compat import v3_metadata_writes
from lakesink_datasource.iceberg.outage import OUTAGE_TIMEOUT_MS
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID
from lakesink_datasource.routing.route_commit import commit_routed
from lakesink_datasource.routing.route_plan import plan_routed_write
from lakesink_datasource.routing.route_task import write_routed_task
from lakesink_datasource.write.task import TaskIdentity

FLAT = T.StructType([T.StructField("tbl", T.StringType()), T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
FLAT_ARROW = pa.schema([("tbl", pa.string()), ("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]


def _options(warehouse: str) -> dict[str, str]:
    return {"warehouse": warehouse, "table_column": "tbl", "namespace": "r", "progress": "false", "maintenance": "off"}


def _budgets(warehouse: str) -> None:
    """The tables' own outage budgets, set as another engine would set a table property."""
    for table, ms in (("a", "1000"), ("b", "600000")):
        with v3_metadata_writes():
            embedded_catalog(warehouse).load_table(f"r.{table}").transaction().set_properties({OUTAGE_TIMEOUT_MS: ms}).commit_transaction()


def _rows(batch: int) -> list[dict]:
    return [{"tbl": t, "id": 10 * batch + i, "v": f"{t}{batch}"} for i in range(3) for t in ("a", "b")]


def _write(warehouse: str, batch: int):  # type: ignore[no-untyped-def]
    data = pa.RecordBatch.from_pylist(_rows(batch), schema=FLAT_ARROW)
    return write_routed_task(plan_routed_write(_options(warehouse), FLAT, False), iter([data]), TaskIdentity(partition_id=0, attempt=batch, batch_id=batch, query_id="q"))


def _commit(message, batch: int) -> str:  # type: ignore[no-untyped-def]
    return commit_routed([message], batch, datasource._commit, datasource._abort, progress=False)


def _expected(table: str, batches: range) -> object:
    return expected_rows([{"id": r["id"], "v": r["v"]} for b in batches for r in _rows(b) if r["tbl"] == table], COLUMNS)


def test_a_table_rides_out_an_outage_its_own_budget_covers_though_the_others_would_not(warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    assert _commit(_write(warehouse, 0), 0).startswith("committed together")
    _budgets(warehouse)
    message = _write(warehouse, 1)
    # r.b's catalog calls are refused three times: about 3.5 s of waiting, past r.a's 1 s.
    arm_fault({"point": "catalog_call", "table": "r.b", "nth": [1, 2, 3], "action": "refuse"})
    assert _commit(message, 1).startswith("committed together")
    for table in ("a", "b"):
        assert_readers_see(warehouse, f"r.{table}", _expected(table, range(2)), COLUMNS)


def test_a_table_gives_up_at_its_own_budget_and_the_batch_changes_no_table(warehouse: str, arm_fault) -> None:  # type: ignore[no-untyped-def]
    assert _commit(_write(warehouse, 0), 0).startswith("committed together")
    _budgets(warehouse)
    before = {t: load(warehouse, f"r.{t}").metadata_location for t in ("a", "b")}
    message = _write(warehouse, 1)
    arm_fault({"point": "catalog_call", "table": "r.a", "action": "refuse"})  # r.a's catalog is away for good
    with pytest.raises(CatalogUnavailable, match=rf"loading table r\.a kept failing .*{OUTAGE_TIMEOUT_MS} \(now 1000 ms\)"):
        _commit(message, 1)
    arm_fault()
    assert {t: load(warehouse, f"r.{t}").metadata_location for t in ("a", "b")} == before
    for table in ("a", "b"):
        assert_readers_see(warehouse, f"r.{table}", _expected(table, range(1)), COLUMNS)


def test_a_transaction_the_catalog_refused_is_sent_again_and_each_table_lands_once(warehouse: str, arm_fault, faults_file) -> None:  # type: ignore[no-untyped-def]
    """The batch's one catalog transaction is refused (the catalog is away when it is sent):
    each table's commit takes it as its own swap's failure, waits on its own clock, reads its
    table (nothing landed) and hands its swap in again; the next round lands both, once."""
    assert _commit(_write(warehouse, 0), 0).startswith("committed together")
    message = _write(warehouse, 1)
    # r.a's commit loads its table (hit 1), then the transaction is sent (hit 2): refused.
    arm_fault({"point": "catalog_call", "table": "r.a", "nth": [2], "action": "refuse"})
    assert _commit(message, 1).startswith("committed together")
    assert json.loads(faults_file.read_text())[0]["hits"] >= 4  # a read back and a second send followed
    for table in ("a", "b"):
        assert_readers_see(warehouse, f"r.{table}", _expected(table, range(2)), COLUMNS)
        epochs = [s.summary.additional_properties.get(EPOCH_ID) for s in load(warehouse, f"r.{table}").metadata.snapshots]
        assert sorted(epochs) == ["0", "1"]
