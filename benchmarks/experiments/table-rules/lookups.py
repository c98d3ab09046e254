"""Point lookups on a Bloom-filtered column (issue 45, part 4), measured with DuckDB.

Two tables of the same N rows (even ids in random order, so min/max statistics rule
nothing out, and an odd id is absent though within every row group's range), written by lakesink's production path in row groups of --row-group-mib, one with
`write.parquet.bloom-filter-enabled.column.id=true`. For 50 ids present and 50 absent:
the row groups DuckDB's Bloom probe rules out, and the median time of
`SELECT count(*) FROM read_parquet(files) WHERE id = ?` (DuckDB 1.5 reads the filters
when it scans). Prints a Markdown table.

usage: python benchmarks/experiments/table-rules/bloom_lookup.py [--rows 4000000] [--row-group-mib 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--row-group-mib", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(11)
    ids = rng.permutation(args.rows).astype(np.int64) * 2  # even ids: an odd one is in range yet absent
    batch = pa.RecordBatch.from_pydict({"id": pa.array(ids), "v": pa.array(np.char.add("v", ids.astype(str)).tolist())}, schema=ARROW)
    present = [int(i) for i in rng.choice(ids, 50, replace=False)]
    absent = [int(i) * 2 + 1 for i in rng.integers(0, args.rows, 50)]
    rows = []
    with tempfile.TemporaryDirectory() as warehouse:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = None
        sides = (("plain", {}), ("Bloom filter on id", {"property.write.parquet.bloom-filter-enabled.column.id": "true"}),
                 ("sorted by id", {"sort_by": "id"}))
        for n, (side, extra) in enumerate(sides):
            table_name = f"db.t{n}"
            options = {"table": table_name, "warehouse": warehouse, "progress": "false", "maintenance": "off",
                       "property.write.parquet.row-group-size-bytes": str(args.row_group_mib * 1024 * 1024), **extra}
            plan = plan_write(parse_options(options), SCHEMA, False)
            commit_write(plan, decode_messages([write_task(plan, iter([batch]), TaskIdentity())]), None)
            catalog = catalog or SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
            table = catalog.load_table(table_name)
            files = [e.data_file.file_path.removeprefix("file://") for e in live_data_files(table.io, table.metadata.current_snapshot())]
            con = duckdb.connect()
            groups = con.execute(f"SELECT count(*) FROM parquet_metadata({files!r}) WHERE column_id = 0").fetchone()[0]
            stats = [pq.ParquetFile(f).metadata for f in files]
            ruled_out = {}
            admitted = {}
            timings = {}
            for kind, values in (("present", present), ("absent", absent)):
                outs, admits, times = [], [], []
                for value in values:
                    admits.append(sum(
                        1 for meta in stats for g in range(meta.num_row_groups)
                        if meta.row_group(g).column(0).statistics.min <= value <= meta.row_group(g).column(0).statistics.max
                    ))
                    outs.append(sum(bool(r[2]) for f in files for r in con.execute(
                        f"SELECT * FROM parquet_bloom_probe('{f}', 'id', {value})").fetchall()))
                    started = time.perf_counter()
                    got = con.execute(f"SELECT count(*) FROM read_parquet({files!r}) WHERE id = {value}").fetchone()[0]
                    times.append(time.perf_counter() - started)
                    assert got == (1 if kind == "present" else 0)
                ruled_out[kind] = statistics.mean(outs)
                admitted[kind] = statistics.mean(admits)
                timings[kind] = statistics.median(times)
            rows.append((side, groups, admitted, ruled_out, timings))
    print(f"## Point lookups, {args.rows:,} rows in {args.row_group_mib} MiB row groups ({time.strftime('%Y-%m-%d')}, DuckDB {duckdb.__version__})\n")
    print("| table | row groups | admitted by min/max (key present / absent) | ruled out by the Bloom probe | lookup median (present / absent) |")
    print("|---|---|---|---|---|")
    for side, groups, admit, out, t in rows:
        print(f"| {side} | {groups} | {admit['present']:.1f} / {admit['absent']:.1f} | {out['present']:.1f} / {out['absent']:.1f} "
              f"| {t['present'] * 1000:.1f} ms / {t['absent'] * 1000:.1f} ms |")
    base = rows[0][4]
    for side, _, _, _, t in rows[1:]:
        print(f"\n{side}: lookups take {t['present'] / base['present']:.2f}x (present) and "
              f"{t['absent'] / base['absent']:.2f}x (absent) the plain table's time.")


if __name__ == "__main__":
    main()
