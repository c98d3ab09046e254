"""`foreachBatch` into lakesink, exactly once: the Arrow-keeping stream sink on PySpark 4.0.

PySpark 4.0 hands a Python stream sink Rows (spark_rows.py converts them, at a cost); a batch
write gets Arrow. `foreachBatch` with a batch write keeps Arrow, and lakesink's idempotent
batch writes (`txn_app_id`, `txn_version`: a version at or below the one recorded is skipped)
make a micro-batch Spark runs again after a crash land once:

    query = df.writeStream.foreachBatch(batch_sink("db.events", "events-ingest")) \\
        .option("checkpointLocation", "/chk/events").start()

Works on every minor; on 4.1 and newer `writeStream.format("lakesink")` is as fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lakesink_datasource.options import OptionError


def batch_sink(table: str, txn_app_id: str, **options: str) -> Callable[[Any, int], None]:
    """A `foreachBatch` function writing each micro-batch to `table` with `options` (any write
    option: operation, primary_key, catalog...), as version `batch_id` of `txn_app_id`: name it
    after the query (one id per query and table; two queries sharing one would skip each
    other's batches)."""
    if not txn_app_id or not txn_app_id.strip():
        raise OptionError("batch_sink needs a txn_app_id naming the query (one per query and table)")
    clashing = {"txn_app_id", "txn_version", "table"} & set(options)
    if clashing:
        raise OptionError(f"batch_sink sets option(s) {', '.join(sorted(clashing))} itself: leave them out")

    def write(df: Any, batch_id: int) -> None:
        (df.write.format("lakesink").options(**options).option("txn_app_id", txn_app_id)
         .option("txn_version", str(batch_id)).mode("append").save(table))

    return write
