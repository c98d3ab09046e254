"""Dev check (not CI): keyed batches on two hosts survive Iceberg Java's maintenance in between.

    python benchmarks/experiments/scale-out/java_interop.py

A v3 CDC table (bucket(4, id), sequence column; 20K keys) written through the production
path (plan_write -> write_task, which also rewrites the compaction groups the plan carries
(fan-in 2 here, so most batches carry one) -> the driver's commit) by two hosts (two
index directories; each batch's keys split between them by a parity that changes from
batch to batch), with published index copies on. Between batches: Iceberg Java 1.10.2's
`rewrite_data_files`, then `expire_snapshots` and `remove_orphan_files` (backdated, so it
also deletes lakesink's published index copies), then a rewrite again, and a cold third
host joins at the end. Prints what each host's index did per batch, checks DuckDB against
the model and runs the six readers of read_table.py. Needs the readers' set-up
(../shared/tools/readers/setup_readers.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import msgspec
import numpy as np
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.datasource import LakeSinkStreamWriter
from lakesink_datasource.duckdb_reader import connect as duckdb_connect
from lakesink_datasource.index import published
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

WAREHOUSE = "/tmp/lakesink-java-scale-out"
TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "tools", "readers")
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType()),
                       T.StructField("op", T.StringType()), T.StructField("lsn", T.LongType())])
OPTIONS = {"table": "db.cdc", "warehouse": WAREHOUSE, "operation": "cdc", "primary_key": "id", "op_column": "op",
           "sequence_column": "lsn", "partition_by": "bucket(4, id)", "progress": "false",
           # Fan-in 2, every batch: the tasks carry a compaction in most batches, so the files
           # Java's rewrite, expiry and orphan removal left are what they read and replace.
           "property.lakesink.maintenance.compaction-fan-in": "2",
           "property.lakesink.maintenance.compaction-batches-per-run": "1"}


def catalog() -> SqlCatalog:
    return SqlCatalog("lakesink", uri=f"sqlite:///{WAREHOUSE}/catalog.db", warehouse=f"file://{WAREHOUSE}")


def batch(ids: np.ndarray, ops: list[str], lsn: int, hosts: list[int]) -> list[str]:
    """One batch: keys with id % len(hosts) == i go to host hosts[i]. Returns what each
    task's sync did to its host's index."""
    plan = plan_write(parse_options(OPTIONS), SCHEMA, overwrite=False)
    messages = []
    for part, host in enumerate(hosts):
        chosen = np.flatnonzero(ids % len(hosts) == part)
        rows = pa.record_batch([pa.array(ids[chosen]), pa.array([f"v{lsn}-{i}" for i in ids[chosen].tolist()]),
                                pa.array([ops[i] for i in chosen.tolist()]), pa.array(np.full(len(chosen), lsn, dtype=np.int64))],
                               names=["id", "v", "op", "lsn"])
        on_host = msgspec.structs.replace(plan, options=msgspec.structs.replace(plan.options, index_dir=f"{WAREHOUSE}/idx-{host}"))
        messages.append(write_task(on_host, iter([rows]), who=TaskIdentity(batch_id=lsn, query_id="q", partition_id=part)))
    LakeSinkStreamWriter(plan).commit(messages, lsn)
    published.wait_for_publishing()
    return [f"host {h}: {r.index_sync}" + (f", compacted {len(r.compaction.rewritten)} files into {len(r.compaction.files)}"
                                             if r.compaction is not None else "")
            for h, r in zip(hosts, decode_messages(messages))]


def java(*actions: str) -> None:
    for action in actions:
        args = [sys.executable, os.path.join(TOOLS, "java_maintenance.py"), WAREHOUSE, "db.cdc", action]
        subprocess.run([*args, "--backdate"] if action == "orphans" else args, check=True)
        _repoint_after_a_copy()


def _repoint_after_a_copy() -> None:
    """java_maintenance.py hands Java a copy of the current metadata file (vN+1) in a Hadoop
    layout; when Java commits nothing (orphan removal), the catalog keeps pointing at the
    original, which Java's orphan removal deletes (it is not in the copy's metadata log).
    Point the catalog at the identical copy, as a user with one catalog would have it."""
    import glob
    import re
    import sqlite3

    with sqlite3.connect(f"{WAREHOUSE}/catalog.db") as con:
        (location,) = con.execute("SELECT metadata_location FROM iceberg_tables WHERE table_name = 'cdc'").fetchone()
        if os.path.exists(location.removeprefix("file://")):
            return
        folder = os.path.dirname(location.removeprefix("file://"))
        newest = max(glob.glob(f"{folder}/v*.metadata.json"), key=lambda p: int(re.findall(r"v(\d+)\.metadata", p)[0]))
        con.execute("UPDATE iceberg_tables SET metadata_location = ? WHERE table_name = 'cdc'", (f"file://{newest}",))
        print(f"(catalog re-pointed from the deleted {location} to its copy {newest})", flush=True)


def main() -> None:
    shutil.rmtree(WAREHOUSE, ignore_errors=True)
    published.MIN_KEYS = 0  # copies of this small table too
    published.MIN_CHANGED_ROWS = 0
    rng = np.random.default_rng(11)
    model: dict[int, str] = {}
    lsn = 1

    def apply(ids: np.ndarray, ops: list[str], hosts: list[int]) -> None:
        nonlocal lsn
        order = np.argsort(ids, kind="stable")
        ids, ops = ids[order], [ops[i] for i in order]
        syncs = batch(ids, ops, lsn, hosts)
        for i, op in zip(ids.tolist(), ops):
            if op == "d":
                model.pop(i, None)
            else:
                model[i] = f"v{lsn}-{i}"
        print(f"batch {lsn}: {'; '.join(syncs)}", flush=True)
        lsn += 1

    def changes(hosts: list[int]) -> None:
        keys = np.array(sorted(model))
        picked = rng.choice(keys, 3_000, replace=False)
        new = np.arange(100_000 + lsn * 1000, 100_000 + lsn * 1000 + 500)
        apply(np.concatenate([picked, new]), ["u"] * 2_500 + ["d"] * 500 + ["c"] * 500, hosts)

    apply(np.arange(20_000), ["c"] * 20_000, [0, 1])
    for hosts in ([0, 1], [1, 0], [0, 1]):
        changes(hosts)
    java("rewrite")
    print("-- after Java's rewrite_data_files", flush=True)
    changes([1, 0])
    changes([0, 1])
    java("expire", "orphans")
    print("-- after Java's expire_snapshots and remove_orphan_files (backdated: the published copies go too)", flush=True)
    changes([1, 0])
    java("rewrite")
    print("-- after Java's rewrite_data_files", flush=True)
    changes([0, 1])
    changes([2, 1])  # a cold host joins
    table = catalog().load_table("db.cdc")
    got = duckdb_connect().execute(f"SELECT id, v FROM iceberg_scan('{table.metadata_location}')").fetchall()
    assert dict(got) == model and len(got) == len(model), "DuckDB does not see the model's rows"
    print(f"DuckDB sees exactly the model's {len(model):,} rows; check_table:", check_table(table) or "OK", flush=True)
    subprocess.run([sys.executable, os.path.join(TOOLS, "read_table.py"), table.metadata_location.removeprefix("file://"),
                    "--columns", "id,v"], check=False)


if __name__ == "__main__":
    main()
