"""A routed write's tables land together on the catalogs that can (issue 47): SeaweedFS's
Iceberg REST catalog (`POST /v1/{prefix}/transactions/commit`) over its S3 store, and
PostgreSQL as a SQL catalog. One table's commit failing before its swap leaves every table
as it was; the batch run again lands in every table once. Read back by DuckDB and pyiceberg.
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import expected_rows, rows
from pyiceberg.catalog import load_catalog
from pyspark.sql import types as T

from lakesink_datasource import datasource
from lakesink_datasource.duckdb_reader import connect as duckdb_connect
from lakesink_datasource.routing.route_commit import commit_routed
from lakesink_datasource.routing.route_plan import plan_routed_write
from lakesink_datasource.routing.route_task import write_routed_task
from lakesink_datasource.write.task import TaskIdentity

FLAT = T.StructType([T.StructField("tbl", T.StringType()), T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
FLAT_ARROW = pa.schema([("tbl", pa.string()), ("id", pa.int64()), ("v", pa.string())])


def _together_or_none(options: dict[str, str], namespace: str, arm_fault, s3: dict[str, str] | None = None) -> None:  # type: ignore[no-untyped-def]
    raw = {**options, "table_column": "tbl", "namespace": namespace, "progress": "false", "maintenance": "off"}
    tables = ("a", "b", "c")
    catalog = load_catalog(options["catalog"], **{k.removeprefix("catalog."): v for k, v in options.items() if k.startswith("catalog.")})

    def run(n: int, attempt: int) -> str:
        batch = pa.RecordBatch.from_pylist([{"tbl": t, "id": 10 * n + i, "v": t} for i in range(3) for t in tables], schema=FLAT_ARROW)
        message = write_routed_task(plan_routed_write(raw, FLAT, False), iter([batch]), TaskIdentity(partition_id=0, attempt=attempt, batch_id=n, query_id="q"))
        return commit_routed([message], n, datasource._commit, datasource._abort, progress=False)

    def state() -> dict[str, str]:
        return {t: catalog.load_table(f"{namespace}.{t}").metadata_location for t in tables}

    assert run(0, 1).startswith("committed together in one catalog transaction")
    before = state()
    arm_fault({"point": "before_commit", "table": f"{namespace}.b", "action": "raise"})
    with pytest.raises(Exception, match="injected fault at before_commit"):
        run(1, 2)
    assert state() == before
    arm_fault()
    assert run(1, 3).startswith("committed together in one catalog transaction")
    for t in tables:
        table = catalog.load_table(f"{namespace}.{t}")
        want = expected_rows([{"id": 10 * n + i} for n in (0, 1) for i in range(3)], ["id"])
        assert rows(table.scan().to_arrow(), ["id"]) == want
        duck = duckdb_connect(s3).execute(f"SELECT id FROM iceberg_scan('{table.metadata_location}')").to_arrow_table()
        assert rows(duck, ["id"]) == want
        assert Counter(s.summary.additional_properties.get("spark.sql.streaming.epochId") for s in table.metadata.snapshots) == Counter({"0": 1, "1": 1})


def test_a_rest_catalogs_tables_land_together_or_not_at_all(object_store, tmp_path: Path, arm_fault) -> None:  # type: ignore[no-untyped-def]
    namespace = f"n{uuid.uuid4().hex[:10]}"
    _together_or_none(object_store.options("rest", tmp_path, namespace), namespace, arm_fault, object_store.s3)


def test_a_postgresql_catalogs_tables_land_together_or_not_at_all(postgres_uri: str, tmp_path: Path, arm_fault) -> None:  # type: ignore[no-untyped-def]
    namespace = f"n{uuid.uuid4().hex[:10]}"
    options = {"catalog": "pg", "catalog.type": "sql", "catalog.uri": postgres_uri, "catalog.warehouse": str(tmp_path / "warehouse")}
    _together_or_none(options, namespace, arm_fault)
