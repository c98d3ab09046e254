"""Issue 44's long run: an append stream whose every tenth table commit loses its answer.

A rate source (1,000 rows a second, 1 s trigger, maintenance=off, as in the issue) writes
through SeaweedFS's real REST catalog behind tests/fault_proxy.py, which forwards each table
commit and answers every tenth with 503 (or closes the connection: --fault close) after the
catalog applied it. After --minutes the query is stopped and the table checked: DuckDB and
pyiceberg read every value of the rate source once (0..max, none twice, none missing),
`check` passes, each epoch landed once, and every file under metadata/ is referenced by the
table (metadata log, snapshots' manifest lists and their manifests) except the attempts
that did not land.

usage: python benchmarks/experiments/lost-answers/soak.py [--minutes 10] [--fault 503|close]
Needs SeaweedFS (./scripts/start_seaweedfs.sh). Prints a Markdown summary.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from fault_proxy import HttpFaultProxy, Rule  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fault", default="503", choices=["503", "close"])
    args = parser.parse_args()

    from pyarrow import fs
    from pyiceberg.catalog import load_catalog
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource
    from lakesink_datasource.check import check_table
    from lakesink_datasource.duckdb_reader import connect as duckdb_connect
    from lakesink_datasource.iceberg.manifest_list import read_manifest_list
    from lakesink_datasource.iceberg.summary_keys import EPOCH_ID

    host = "http://127.0.0.1"
    s3 = {"s3.endpoint": f"{host}:8333", "s3.access-key-id": "admin", "s3.secret-access-key": "adminsecret",
          "s3.region": "us-east-1", "s3.path-style-access": "true"}
    rest = f"{host}:8181"
    namespace = f"soak{uuid.uuid4().hex[:8]}"
    catalog_props = {"type": "rest", "uri": rest, "warehouse": "warehouse", "credential": "admin:adminsecret",
                     "oauth2-server-uri": f"{rest}/v1/oauth/tokens", **s3}
    commits = Rule("POST", re.compile(rf"/namespaces/{namespace}/tables/t$"), args.fault, lambda n: n % 10 == 0)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LakeSinkDataSource)
    started = time.time()
    with HttpFaultProxy(rest, [commits]) as proxy:
        options = {f"catalog.{k}": v for k, v in catalog_props.items()}
        options.update({"catalog": "restp", "catalog.uri": proxy.url, "table": f"{namespace}.t", "maintenance": "off",
                        "progress": "false"})
        query = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
                 .writeStream.format("lakesink").options(**options)
                 .option("checkpointLocation", f"/tmp/lakesink-soak/{namespace}").trigger(processingTime="1 second").start())
        deadline = time.time() + args.minutes * 60
        while time.time() < deadline:
            assert query.exception() is None, query.exception()
            time.sleep(5)
        query.stop()
        assert query.exception() is None, query.exception()
    seconds = time.time() - started
    table = load_catalog("rest", **catalog_props).load_table(f"{namespace}.t")
    duck = duckdb_connect(s3).execute(
        f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM iceberg_scan('{table.metadata_location}')"
    ).fetchone()
    py = table.scan(selected_fields=("value",)).to_arrow().column("value").to_pylist()
    epochs = Counter(s.summary[EPOCH_ID] for s in table.metadata.snapshots if s.summary and EPOCH_ID in s.summary.additional_properties)
    problems = check_table(table)
    # Every file under metadata/ the table does not reference.
    referenced = {e.metadata_file for e in table.metadata.metadata_log} | {table.metadata_location}
    for snapshot in table.metadata.snapshots:
        referenced.add(snapshot.manifest_list)
        referenced.update(m.manifest_path for m in read_manifest_list(table.io, snapshot.manifest_list))
    store = fs.S3FileSystem(access_key="admin", secret_key="adminsecret", endpoint_override=f"{host}:8333", scheme="http",
                            region="us-east-1")
    listed = store.get_file_info(fs.FileSelector(f"warehouse/{namespace}/t/metadata", recursive=True))
    present = {f"s3://{i.path}" for i in listed if i.type == fs.FileType.File}
    unreferenced = sorted(present - referenced)
    print(f"## Lost answers, {args.fault} on every tenth commit ({time.strftime('%Y-%m-%d')})\n")
    print(f"- ran {seconds / 60:.1f} min; table commits {commits.seen}, answers lost {len(commits.fired)}")
    print(f"- snapshots {len(table.metadata.snapshots)}, epochs {len(epochs)}, epochs landed more than once: "
          f"{sum(1 for c in epochs.values() if c > 1)}")
    print(f"- DuckDB: rows {duck[0]:,}, distinct {duck[1]:,}, min {duck[2]}, max {duck[3]:,} "
          f"({'every value once' if duck[0] == duck[1] == duck[3] + 1 and duck[2] == 0 else 'NOT EXACT'})")
    print(f"- pyiceberg: rows {len(py):,}, distinct {len(set(py)):,} ({'agrees' if sorted(py) == list(range(len(py))) and len(py) == duck[0] else 'DISAGREES'})")
    print(f"- check: {problems or 'OK'}")
    print(f"- metadata files {len(present)}, unreferenced {len(unreferenced)}: {unreferenced[:5]}")
    spark.stop()


if __name__ == "__main__":
    main()
