"""Run by test_spark_connect.py as a Spark Connect client: a batch write with no register
call (the server finds lakesink by name), then registers lakesink from the client, a
streaming write and a read; prints what it saw as JSON."""

import json
import sys

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from lakesink_datasource import LakeSinkDataSource
from lakesink_datasource.spark_version import register_replaces_found

port, warehouse, work = sys.argv[1], sys.argv[2], sys.argv[3]
spark = SparkSession.builder.remote(f"sc://localhost:{port}").getOrCreate()
out = {}
# No register call first: the server found lakesink by itself (pyspark_lakesink).
spark.createDataFrame([(i, f"b{i}") for i in range(5)], "id long, v string").write.format("lakesink").option("warehouse", warehouse).mode("append").save("db.connect")
if register_replaces_found():  # still allowed (PySpark 4.1+): the stream below goes through the registered class
    spark.dataSource.register(LakeSinkDataSource)
spark.createDataFrame([(i, f"s{i}") for i in range(100, 103)], "id long, v string").write.parquet(f"{work}/src")
q = (spark.readStream.schema("id long, v string").parquet(f"{work}/src").writeStream.format("lakesink")
     .option("warehouse", warehouse).option("table", "db.connect").option("checkpointLocation", f"{work}/ck")
     .trigger(availableNow=True).start())
q.awaitTermination()
rows = spark.read.format("lakesink").option("warehouse", warehouse).load("db.connect").collect()
out["read"] = sorted([r["id"], r["v"]] for r in rows)
spark.conf.set("spark.sql.connect.serverStacktrace.enabled", "false")  # what the docs tell a user to set
try:
    spark.createDataFrame([(1, "a")], "id long, v string").write.format("lakesink").option("warehouse", warehouse).option(
        "primary_kye", "id").mode("append").save("db.connect")
except AnalysisException as error:
    out["misspelt"] = str(error)
print(json.dumps(out))
