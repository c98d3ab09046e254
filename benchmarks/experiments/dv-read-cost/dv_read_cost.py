"""Where DuckDB's extra scan time on a keyed table goes: python .../dv_read_cost.py [ROWS].

Builds scenario 6's table without Spark (ROWS base rows, then four upserts of 100K rows,
half updates of random keys), maintenance off, and times DuckDB's scenario-6 query on:
the table as written (extra files + DVs), after lakesink's full compaction (same rows, no
DVs), and a fresh copy of the live rows in one write; then DuckDB's `read_parquet` of the
compacted file as written (one row group) and rewritten by pyarrow in 150K-row groups.
"""

import shutil
import statistics
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T

from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.duckdb_reader import connect
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

ROOT = "/tmp/lakesink-dv-read-cost"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("cat", T.LongType()),
                       T.StructField("amount", T.DoubleType()), T.StructField("name", T.StringType())])
QUERY = "SELECT count(*), sum(amount), max(name), sum(cat) FROM iceberg_scan('{}')"


def batches(ids: np.ndarray, version: int, chunk: int = 50_000):  # type: ignore[no-untyped-def]
    for i in range(0, len(ids), chunk):
        x = ids[i:i + chunk]
        h = (x * 2654435761 + version * 97) % 1_000_003
        yield pa.record_batch([pa.array(x), pa.array(h % 1000), pa.array(h / 100.0),
                               pa.array([f"user_{v:07d}@shop-{version:04d}.example" for v in h.tolist()])],
                              names=["id", "cat", "amount", "name"])


def write(table: str, ids: np.ndarray, batch: int, operation: str = "upsert", tasks: int = 2) -> None:
    options = {"table": table, "warehouse": ROOT, "operation": operation, "index_dir": ROOT + "/idx", "maintenance": "off"}
    if operation == "upsert":
        options["primary_key"] = "id"
    plan = plan_write(parse_options(options), SCHEMA, overwrite=False)
    parts = np.array_split(ids.astype(np.int64), tasks)
    messages = [write_task(plan, batches(p, batch), who=TaskIdentity(partition_id=i, batch_id=batch, query_id="q"))
                for i, p in enumerate(parts)]
    commit_write(plan, decode_messages(messages), batch)


def scan(metadata_location: str, reps: int = 9) -> float:
    con = connect()
    con.execute(QUERY.format(metadata_location)).fetchall()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        con.execute(QUERY.format(metadata_location)).fetchall()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def scan_file(path: str, reps: int = 9) -> float:
    con = connect()
    query = f"SELECT count(*), sum(amount), max(name), sum(cat) FROM read_parquet('{path}')"
    con.execute(query).fetchall()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        con.execute(query).fetchall()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def load(table: str):  # type: ignore[no-untyped-def]
    plan = plan_write(parse_options({"table": table, "warehouse": ROOT}), SCHEMA, overwrite=False)
    return sql_commit.load_table(loader.load(plan.catalog), plan.identifier)


def shape(table) -> str:  # type: ignore[no-untyped-def]
    summary = table.metadata.current_snapshot().summary
    return (f"{summary['total-data-files']} data files, {summary['total-delete-files']} DVs, "
            f"{summary['total-position-deletes']} deleted rows")


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    shutil.rmtree(ROOT, ignore_errors=True)
    rng = np.random.default_rng(1)
    write("db.keyed", np.arange(rows), 0)
    existing = rows
    for batch in range(1, 5):
        ids = np.concatenate([rng.choice(existing, 50_000, replace=False), np.arange(existing, existing + 50_000)])
        existing += 50_000
        write("db.keyed", ids, batch)
    keyed = load("db.keyed")
    live = connect().execute(f"SELECT id FROM iceberg_scan('{keyed.metadata_location}')").to_arrow_table()
    write("db.plain", np.sort(live.column("id").to_numpy()), 0, operation="append")
    results = [("as written", keyed.metadata_location, shape(keyed))]
    plain = load("db.plain")
    compact(keyed, budget_bytes=1 << 40, tiered=False)
    keyed = load("db.keyed")
    results.append(("after full compaction", keyed.metadata_location, shape(keyed)))
    results.append(("fresh copy (scenario 6's baseline)", plain.metadata_location, shape(plain)))
    base = scan(plain.metadata_location)
    for name, location, what in results:
        seconds = scan(location)
        print(f"| {name} | {what} | {seconds * 1000:.1f} ms | {seconds / base:.2f} |")
    compacted = keyed.inspect.files().column("file_path")[0].as_py().removeprefix("file://")
    regrouped = f"{ROOT}/regrouped.parquet"
    pq.write_table(pq.read_table(compacted), regrouped, row_group_size=150_000, compression="zstd")
    for path in (compacted, regrouped):
        groups = pq.ParquetFile(path).metadata.num_row_groups
        print(f"read_parquet of the compacted file, {groups} row group(s): {scan_file(path) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
