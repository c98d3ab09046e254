"""A PostgreSQL-backed SQL catalog works like the embedded one (Iceberg JDBC table layout).

Needs a PostgreSQL server (the `postgres_uri` fixture of conftest.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa
from lakesink_testing import duckdb_rows, expected_rows, pyiceberg_rows
from pyiceberg.catalog.sql import SqlCatalog


def test_streaming_and_batch_writes_through_a_postgres_catalog(spark, tmp_path: Path, postgres_uri: str) -> None:
    warehouse = f"file://{tmp_path / 'pg-warehouse'}"
    namespace = f"pg_{uuid.uuid4().hex[:8]}"  # the database outlives the test: keep runs apart
    identifier = f"{namespace}.events"
    options = {"catalog": "pg", "catalog.type": "sql", "catalog.uri": postgres_uri, "catalog.warehouse": warehouse}

    first = [{"id": i, "name": f"n{i}"} for i in range(20)]
    writer = spark.createDataFrame(first, "id long, name string").write.format("lakesink").option("table", identifier)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.option("partition_by", "bucket(2, id)").mode("append").save()

    source = tmp_path / "source"
    second = [{"id": i, "name": f"s{i}"} for i in range(100, 110)]
    spark.createDataFrame(second, "id long, name string").coalesce(1).write.parquet(str(source))
    stream = spark.readStream.schema("id long, name string").parquet(str(source)).writeStream.format("lakesink")
    for key, value in {**options, "table": identifier, "checkpointLocation": str(tmp_path / "ck")}.items():
        stream = stream.option(key, value)
    stream.trigger(availableNow=True).start().awaitTermination()

    catalog = SqlCatalog("pg", uri=postgres_uri, warehouse=warehouse)
    table = catalog.load_table(identifier)
    expected = expected_rows(first + second, ["id", "name"])
    assert pyiceberg_rows(table, ["id", "name"]) == expected
    assert duckdb_rows(table.metadata_location, ["id", "name"]) == expected
    assert table.metadata.format_version == 3 and len(table.metadata.snapshots) == 2

    # The catalog row is the one Iceberg's JDBC catalog reads: name parts plus the pointer.
    engine = sa.create_engine(postgres_uri)
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT metadata_location, previous_metadata_location FROM iceberg_tables "
                    "WHERE catalog_name = 'pg' AND table_namespace = :ns AND table_name = 'events'"),
            {"ns": namespace},
        ).one()
    assert row.metadata_location == table.metadata_location and row.previous_metadata_location is not None
