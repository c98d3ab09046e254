"""Three lakesink sinks, each fed by a streaming flow. No `spark.dataSource.register` here:
Spark finds lakesink by name (the installed `pyspark_lakesink` module), and a Python data
source registered from the pipeline's definitions makes `spark-pipelines run` exit 1 after
a completed run (docs/usage.md, "Spark Declarative Pipelines", says why)."""

from pyspark import pipelines as dp
from pyspark.sql import SparkSession

# The pipeline's session (PySpark 4.2+ also hands definitions files a global `spark`; 4.1 does not).
spark = SparkSession.active()
root = spark.conf.get("spark.lakesink.example.root")
data, common = f"{root}/data", {"warehouse": f"{root}/warehouse"}

# An append sink. new_checkpoint=replace: a --full-refresh-all recomputes the table (its first
# batch from the flow's new checkpoint replaces what the old checkpoint wrote).
dp.create_sink("events_sink", format="lakesink", options={**common, "table": "shop.events", "new_checkpoint": "replace"})


@dp.append_flow(target="events_sink")
def events():
    return spark.readStream.schema("event_id long, kind string, amount double").parquet(f"{data}/events")


# A keyed sink: one row per customer, the highest version wins.
dp.create_sink("customers_sink", format="lakesink", options={
    **common, "table": "shop.customers", "operation": "upsert", "primary_key": "customer_id",
    "sequence_column": "version", "new_checkpoint": "replace",
})


@dp.append_flow(target="customers_sink")
def customers():
    return spark.readStream.schema("customer_id long, tier string, version long").parquet(f"{data}/customers")


# A change stream routed to one table per source table (table_column), applied by key.
# new_checkpoint=append: a --full-refresh-all replays the changes into the same tables, which
# the keys and sequences make a no-op (a stream routed to many tables cannot replace them).
dp.create_sink("replica_sink", format="lakesink", options={
    **common, "table_column": "tbl", "namespace": "replica", "payload_column": "after", "operation": "cdc",
    "op_column": "op", "sequence_column": "lsn", "primary_key": "id", "new_checkpoint": "append",
})


@dp.append_flow(target="replica_sink")
def changes():
    return spark.readStream.schema("tbl string, op string, lsn long, after string").parquet(f"{data}/changes")
