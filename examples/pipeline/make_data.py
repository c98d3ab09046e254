"""The example pipeline's input: Parquet files of events, customer updates and a database's
change rows, under ROOT/data (ROOT: the first argument, else /tmp/lakesink-pipeline-example,
the spark-pipeline.yml's `spark.lakesink.example.root`). Run again, it writes the same files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def main(root: Path) -> None:
    data = root / "data"
    for folder in ("events", "customers", "changes"):
        (data / folder).mkdir(parents=True, exist_ok=True)
    # 300 events in two files: the append sink.
    for part, ids in enumerate((range(0, 200), range(200, 300))):
        pq.write_table(pa.table({
            "event_id": pa.array(list(ids), pa.int64()),
            "kind": [("view", "cart", "buy")[i % 3] for i in ids],
            "amount": [round(i * 1.25, 2) for i in ids],
        }), data / "events" / f"part-{part}.parquet")
    # 50 customers, then a second version of the first 10: the keyed sink keeps the newest.
    for part, (ids, version) in enumerate(((range(50), 1), (range(10), 2))):
        pq.write_table(pa.table({
            "customer_id": pa.array(list(ids), pa.int64()),
            "tier": [("bronze", "gold")[version - 1] for _ in ids],
            "version": pa.array([version] * len(ids), pa.int64()),
        }), data / "customers" / f"part-{part}.parquet")
    # A change stream of two source tables (Debezium-like op codes, an LSN, the row as JSON):
    # routed by `tbl` into replica.orders and replica.payments.
    changes = [("orders", "c", lsn, {"id": lsn, "total": lsn * 10}) for lsn in range(1, 21)]
    changes += [("payments", "c", 100 + i, {"id": i, "order_id": i + 1, "paid": True}) for i in range(5)]
    changes += [("orders", "u", 200, {"id": 1, "total": 999}), ("orders", "d", 201, {"id": 2})]
    pq.write_table(pa.table({
        "tbl": [c[0] for c in changes], "op": [c[1] for c in changes],
        "lsn": pa.array([c[2] for c in changes], pa.int64()), "after": [json.dumps(c[3]) for c in changes],
    }), data / "changes" / "part-0.parquet")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/lakesink-pipeline-example"))
