"""Development check: Iceberg Java 1.10.2's MERGE INTO commits while a lakesink keyed batch is
in flight; the lakesink batch decides the shared keys at commit and lands; six readers agree.

    python benchmarks/experiments/concurrent-merge/run.py [--workdir DIR]

Needs the readers' set-up (../shared/tools/readers/setup_readers.sh: the Spark 3.5 venv and
Iceberg's runtime jar, ICEBERG_SPARK_JAR and SHADED_JACKSON_JAR exported). Not for CI.

1. lakesink creates db.m (v3, 10,000 keys, `v` = "base") with upserts;
2. a lakesink upsert of keys 0..4999 (`v` = "lake") is planned and its task writes;
3. Iceberg Java runs `MERGE INTO` (merge-on-read: deletion vectors) of keys 4000..5999
   (`v` = "java") through a Hadoop catalog on the same table directory, and the SQLite
   catalog's pointer is moved to its commit (compare-and-swap on the previous location);
4. the lakesink batch commits: keys 4000..4999 were written by both, lakesink is the later
   commit, so its rows win (upsert: commit order);
5. one more lakesink upsert of keys 4500..5499 (`v` = "after") checks that the key index
   followed both;
6. DuckDB and pyiceberg (here) and the six readers of read_table.py read the expected rows.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

READERS = Path(__file__).resolve().parents[4] / "shared" / "tools" / "readers"
HOME = Path(os.environ.get("READERS_HOME", Path.home() / ".cache" / "iceberg-readers"))
SCHEMA = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("v", T.StringType())])
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])

JAVA_MERGE = r"""
import sys
from pyspark.sql import SparkSession
wh, ns, name, jars = sys.argv[1:5]
spark = (SparkSession.builder.master("local[2]").config("spark.jars", jars)
         .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
         .config("spark.sql.catalog.j", "org.apache.iceberg.spark.SparkCatalog")
         .config("spark.sql.catalog.j.type", "hadoop").config("spark.sql.catalog.j.warehouse", "file://" + wh)
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
t = f"j.{ns}.{name}"
spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read')")
spark.range(4000, 6000).selectExpr("id", "'java' AS v").createOrReplaceTempView("src")
spark.sql(f"MERGE INTO {t} t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")
"""


def _writer(warehouse: Path, index: str) -> dict[str, str]:
    return {"table": "db.m", "warehouse": str(warehouse), "operation": "upsert", "primary_key": "id",
            "index_dir": str(warehouse.parent / index), "progress": "false"}


def _rows(ids: range, v: str) -> pa.RecordBatch:
    return pa.record_batch([pa.array(list(ids), pa.int64()), pa.array([v] * len(ids))], schema=ARROW)


def _java_merge(warehouse: Path) -> None:
    """MERGE INTO through a Hadoop catalog on the table's directory, then move the SQLite
    catalog's pointer to Java's commit (as java_maintenance.py does for maintenance)."""
    con = sqlite3.connect(warehouse / "catalog.db")
    (before,) = con.execute("SELECT metadata_location FROM iceberg_tables WHERE table_namespace='db' AND table_name='m'").fetchone()
    path = re.sub(r"^file:(//)?", "/", before)
    mdir = os.path.dirname(path)
    version = 1 + max([0, *(int(m) for f in os.listdir(mdir) for m in re.findall(r"^v(\d+)\.metadata\.json$", f))])
    shutil.copyfile(path, f"{mdir}/v{version}.metadata.json")
    Path(mdir, "version-hint.text").write_text(str(version))
    table_dir = os.path.dirname(mdir)
    jar = os.environ.get("ICEBERG_SPARK_JAR") or glob.glob(str(HOME / "dl/snowpark_connect_deps_iceberg/jars/iceberg-spark-runtime-3.5_2.12-*.jar"))[0]
    jackson = os.environ.get("SHADED_JACKSON_JAR", str(HOME / "dl/iceberg-shaded-jackson.jar"))
    py = str(HOME / "venv-spark35/bin/python")
    env = dict(os.environ, PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py)
    hwh = os.path.dirname(os.path.dirname(table_dir))
    subprocess.run([py, "-c", JAVA_MERGE, hwh, os.path.basename(os.path.dirname(table_dir)), os.path.basename(table_dir), f"{jar},{jackson}"],
                   env=env, check=True)
    newest = max((int(m), f) for f in os.listdir(mdir) for m in re.findall(r"^v(\d+)\.metadata\.json$", f))[1]
    moved = con.execute("UPDATE iceberg_tables SET metadata_location=?, previous_metadata_location=? WHERE table_name='m' AND metadata_location=?",
                        (f"file://{mdir}/{newest}", before, before))
    con.commit()
    assert moved.rowcount == 1, "another writer committed meanwhile"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/lakesink-concurrent-merge")
    args = parser.parse_args()
    root = Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    warehouse = root / "warehouse"
    warehouse.mkdir(parents=True)
    lake = parse_options(_writer(warehouse, "index-lake"))

    def batch(ids: range, v: str, batch_id: int) -> None:
        plan = plan_write(lake, SCHEMA, overwrite=False)
        commit_write(plan, decode_messages([write_task(plan, iter([_rows(ids, v)]), TaskIdentity(batch_id=batch_id, query_id="q"))]), batch_id)

    batch(range(10_000), "base", 0)
    plan = plan_write(lake, SCHEMA, overwrite=False)
    message = write_task(plan, iter([_rows(range(5000), "lake")]), TaskIdentity(batch_id=1, query_id="q"))
    _java_merge(warehouse)
    outcome = commit_write(plan, decode_messages([message]), 1)
    print(f"lakesink batch committed snapshot {outcome.snapshot_id}: {outcome.keys_redecided} keys decided at commit")
    batch(range(4500, 5500), "after", 2)

    final = {**dict.fromkeys(range(5000), "lake"), **dict.fromkeys(range(5000, 6000), "java"),
             **dict.fromkeys(range(6000, 10000), "base"), **dict.fromkeys(range(4500, 5500), "after")}
    from lakesink_testing import duckdb_rows, expected_rows, load, pyiceberg_rows  # tests/ on sys.path below

    expected = expected_rows([{"id": k, "v": v} for k, v in final.items()], ["id", "v"])
    table = load(str(warehouse), "db.m")
    got = duckdb_rows(table.metadata_location, ["id", "v"])
    print("DuckDB and pyiceberg match the expected rows:", got == expected, pyiceberg_rows(table, ["id", "v"]) == expected)
    readers = subprocess.run([sys.executable, str(READERS / "read_table.py"), table.metadata_location.removeprefix("file://"), "--columns", "id,v"])
    return 0 if got == expected and readers.returncode == 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
    raise SystemExit(main())
