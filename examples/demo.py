"""lakesink demo: a streaming job into the embedded default catalog, then an independent read.

Writes three micro-batches of generated events into `demo.events` (Iceberg v3, partitioned
by days(ts) and bucket(4, id)) under ./lakesink-warehouse, then asks DuckDB, which shares
no code with lakesink, what the table holds.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from datetime import datetime, timedelta, timezone

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyarrow as pa
import pyarrow.parquet as pq


def make_input(folder: str, batches: int, rows: int) -> None:
    base = datetime(2026, 11, 1, tzinfo=timezone.utc)
    for b in range(batches):
        ids = list(range(b * rows, (b + 1) * rows))
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "user": [f"user-{i % 97}" for i in ids],
                "amount": [round(i * 0.37, 2) for i in ids],
                "ts": pa.array([base + timedelta(minutes=17 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            }
        )
        path = os.path.join(folder, f"events-{b:03d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (1_700_000_000 + b, 1_700_000_000 + b))  # file source order = batch order


def main() -> None:
    from pyspark.sql import SparkSession

    warehouse = os.path.abspath("lakesink-warehouse")
    work = tempfile.mkdtemp(prefix="lakesink-demo-")
    source = os.path.join(work, "input")
    os.makedirs(source)
    make_input(source, batches=3, rows=2000)

    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}") if os.path.exists(warehouse) else None
    if catalog is not None and catalog.table_exists("demo.events"):
        catalog.purge_table("demo.events")  # the demo starts from an empty table every run

    spark = (
        SparkSession.builder.master("local[2]").appName("lakesink-demo")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")  # keeps lakesink's progress lines on lines of their own
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # No spark.dataSource.register: Spark finds format("lakesink") by itself (pyspark_lakesink).

    try:
        query = (
            spark.readStream.schema("id long, user string, amount double, ts timestamp")
            .option("maxFilesPerTrigger", 1).parquet(source)
            .writeStream.format("lakesink")
            .option("table", "demo.events")
            .option("partition_by", "days(ts), bucket(4, id)")
            .option("checkpointLocation", os.path.join(work, "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
    except Exception as exc:
        if "DATA_SOURCE_NOT_FOUND" not in str(exc):
            raise
        from lakesink_datasource.spark_lookup import lookup_problem

        raise SystemExit(f"Spark did not find format('lakesink'): {lookup_problem() or exc}") from None
    query.awaitTermination()
    spark.stop()

    table = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}").load_table("demo.events")
    print(f"\nlakesink wrote {'.'.join(table.name())} (format v{table.metadata.format_version}) in {warehouse}")
    for snap in table.metadata.snapshots:
        s = snap.summary
        if s.get("lakesink.compaction") == "true":
            print(f"  snapshot {snap.snapshot_id}: replace (compaction of small files), total {s.get('total-records')} rows "
                  f"in {s.get('total-data-files')} files")
            continue
        print(f"  snapshot {snap.snapshot_id}: {s.operation.value}, batch {s.get('spark.sql.streaming.epochId')}, "
              f"+{s.get('added-records')} rows in {s.get('added-data-files')} files "
              f"({s.get('changed-partition-count')} partitions), total {s.get('total-records')}")
    print(
        "  Why so many files: each batch holds about 24 days of events (one every 17 minutes) and the table is\n"
        "  partitioned by day and by 4 buckets of id, so a batch writes one small file per (day, bucket) it\n"
        "  touches. maintenance=auto (the default) merges small files of a partition once a few batches'\n"
        "  worth have piled up (a `replace` snapshot; rows and row ids unchanged); on demand:\n"
        f"  python -m lakesink_datasource.maintain compact demo.events --warehouse {warehouse}"
    )

    from lakesink_datasource.duckdb_reader import connect

    con = connect()
    scan = f"iceberg_scan('{table.metadata_location}')"
    rows, users, total = con.execute(f"SELECT count(*), count(DISTINCT user), round(sum(amount), 2) FROM {scan}").fetchone()
    print(f"\nDuckDB {con.execute('select version()').fetchone()[0]} reads: {rows} rows, {users} users, amount total {total}")
    print("rows per day (first 5):")
    for day, n in con.execute(f"SELECT CAST(ts AS DATE) d, count(*) FROM {scan} GROUP BY d ORDER BY d LIMIT 5").fetchall():
        print(f"  {day}: {n}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
