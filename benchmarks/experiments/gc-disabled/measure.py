"""gc.enabled=false: expire snapshots from the metadata only, or stop expiring? Measured.

Two tables with gc.enabled=false take the same N small appends through lakesink's
production path without Spark (plan_write -> write_task -> commit_write): one with the
retention lakesink applies on such tables (snapshots older than the table's max age leave
the metadata, their files stay), one that never expires (what Iceberg Java's refusal to
expire amounts to). Prints, every N/6 batches, the current metadata.json's size and the
commit's median time over the last 20 batches, as a Markdown table.

usage: python benchmarks/experiments/gc-disabled/measure.py [--batches 600]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=600)
    args = parser.parse_args()
    sides = {
        "expire from the metadata (lakesink)": {"property.history.expire.max-snapshot-age-ms": "1000"},
        "never expire": {"property.history.expire.max-snapshot-age-ms": str(10 * 365 * 24 * 3600 * 1000)},
    }
    step = max(1, args.batches // 6)
    with tempfile.TemporaryDirectory() as warehouse:
        figures: dict[str, list[tuple[int, int, float, int]]] = {}
        for name, extra in sides.items():
            table = f"db.t{len(figures)}"
            options = {"table": table, "warehouse": warehouse, "progress": "false", "maintenance": "auto",
                       "property.gc.enabled": "false", "property.lakesink.maintenance.orphan-interval-ms": "1", **extra}
            seconds: list[float] = []
            rows: list[tuple[int, int, float, int]] = []
            for b in range(args.batches):
                plan = plan_write(parse_options(options), SCHEMA, False)
                batch = pa.RecordBatch.from_pylist([{"id": b * 10 + i, "v": "x"} for i in range(10)], schema=ARROW)
                message = write_task(plan, iter([batch]), TaskIdentity(batch_id=b, query_id="q"))
                started = time.perf_counter()
                outcome = commit_write(plan, decode_messages([message]), b)
                seconds.append(time.perf_counter() - started)
                if (b + 1) % step == 0:
                    assert outcome.table is not None
                    size = os.path.getsize(outcome.table.metadata_location.removeprefix("file://"))
                    rows.append((b + 1, size, statistics.median(seconds[-20:]), len(outcome.table.metadata.snapshots)))
            figures[name] = rows
    print(f"## gc.enabled=false: {args.batches} appends of 10 rows ({time.strftime('%Y-%m-%d')}, embedded catalog)\n")
    names = list(figures)
    print("| batches | " + " | ".join(f"{n}: metadata.json, commit (median of 20), snapshots" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for i, (batches, *_rest) in enumerate(figures[names[0]]):
        cells = [f"{figures[n][i][1] / 1024:,.0f} KiB, {figures[n][i][2] * 1000:.0f} ms, {figures[n][i][3]}" for n in names]
        print(f"| {batches} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
