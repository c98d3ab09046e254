"""Dev check (not CI): a routed keyed stream on a standalone cluster follows Iceberg Java's
maintenance between its micro-batches.

    python benchmarks/experiments/scale-out/java_routed.py

A standalone cluster of two 2-core workers (each its own HOME, so its own key shards) runs an
upsert stream routed by `cluster_by_key` (4 key shards) into a table of 20K keys, three
micro-batches at a time (`availableNow`). Between the runs: Iceberg Java 1.10.2's
`rewrite_data_files`, then `expire_snapshots` (keeps the last) and `remove_orphan_files`
(backdated: lakesink's published shard copies go too), then another rewrite. Each shard's
index must follow the rewrites (or start over where its history expired) and the table
must hold exactly the last value of every key: DuckDB against the model, then the six
readers of read_table.py. Needs the readers' set-up (../shared/tools/readers/setup_readers.sh).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.harness import tests_module
from benchmarks.scale_out import IDENT, Source, _build_base, _session, _stream, _wait_for_executors, annotate

Cluster = tests_module("standalone_cluster").Cluster

ROOT = Path("/tmp/lakesink-java-routed")
ROWS, BATCH_ROWS = 20_000, 4_000
TOOLS = Path(__file__).resolve().parents[4] / "shared" / "tools" / "readers"


def _java(warehouse: Path, action: str) -> None:
    args = [sys.executable, str(TOOLS / "java_maintenance.py"), str(warehouse), IDENT, action]
    subprocess.run([*args, "--backdate"] if action == "orphans" else args, check=True)
    _repoint_after_a_copy(warehouse)


def _repoint_after_a_copy(warehouse: Path) -> None:
    """When Java commits nothing (orphan removal) the catalog keeps pointing at the original
    metadata file, which Java's orphan removal deletes: point it at Java's identical copy."""
    db = sqlite3.connect(warehouse / "catalog.db")
    (location,) = db.execute("SELECT metadata_location FROM iceberg_tables WHERE table_name = 'keyed'").fetchone()
    if not os.path.exists(location.removeprefix("file://")):
        folder = os.path.dirname(location.removeprefix("file://"))
        copies = sorted(glob.glob(f"{folder}/v*.metadata.json"), key=lambda p: int(re.findall(r"v(\d+)", p)[-1]))
        db.execute("UPDATE iceberg_tables SET metadata_location = ? WHERE table_name = 'keyed'", (f"file://{copies[-1]}",))
        db.commit()
        print(f"(catalog re-pointed from the deleted {location} to its copy {copies[-1]})")
    db.close()


def _expected(source: Source) -> dict[int, str]:
    values = {i: f"base-{i}" for i in range(ROWS)}
    for path in sorted(source.folder.glob("*.parquet")):
        table = pq.read_table(path, columns=["id", "v"])
        values.update(zip(table.column("id").to_pylist(), table.column("v").to_pylist(), strict=True))
    return values


def main() -> int:
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    warehouse = ROOT / "warehouse"
    cluster = Cluster(ROOT)
    cluster.start_master()
    for _ in range(2):
        cluster.start_worker(memory="2g", cores=2)
    spark = _session(cluster, 2)
    try:
        _wait_for_executors(spark, 2)
        _build_base(spark, warehouse, ROWS)
        source = Source(ROOT / "source", ROWS, BATCH_ROWS)
        source.folder.mkdir()
        checkpoint = ROOT / "checkpoint"
        for step in ("rewrite", "expire+orphans", "rewrite again", None):
            source.add(spark, 3)
            batches = _stream(spark, source, checkpoint, warehouse, clustered=True)
            annotate(warehouse, batches, cluster.homes)
            for b in batches:
                print(f"batch {b['batch']}: {b['seconds']:.2f} s, shards on workers {b['placement']}; {b['index_starts'] or 'every shard caught up'}")
            if step is None:
                break
            print(f"-- Iceberg Java: {step}")
            for action in {"rewrite": ["rewrite"], "expire+orphans": ["expire", "orphans"], "rewrite again": ["rewrite"]}[step]:
                _java(warehouse, action)
    finally:
        spark.stop()
        cluster.stop()

    from pyiceberg.catalog.sql import SqlCatalog

    from lakesink_datasource.check import check_table
    from lakesink_datasource.duckdb_reader import connect

    table = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}").load_table(IDENT)
    got = dict(connect().execute(f"SELECT id, v FROM iceberg_scan('{table.metadata_location}')").fetchall())
    expected = _expected(source)
    problems = check_table(table)
    print(f"DuckDB: {len(got):,} rows, the model {len(expected):,}; equal: {got == expected}; check_table: {problems or 'OK'}")
    subprocess.run([sys.executable, str(TOOLS / "read_table.py"), table.metadata_location.removeprefix("file://"), "--columns", "id,v"], check=False)
    return 0 if got == expected and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
