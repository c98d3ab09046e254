"""Run by test_found_by_name.py through spark-submit: a job that never registers lakesink
writes (batch, stream, SQL) and reads with format("lakesink"), then registers it explicitly
and writes once more; prints what it read as JSON."""

import json
import sys

from pyspark.sql import SparkSession

warehouse, work = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
table = {"warehouse": warehouse, "table": "db.found"}
spark.createDataFrame([(i, f"b{i}") for i in range(3)], "id long, v string").write.format("lakesink").options(**table).mode("append").save()
spark.createDataFrame([(i, f"s{i}") for i in range(10, 12)], "id long, v string").write.parquet(f"{work}/src")
query = (spark.readStream.schema("id long, v string").parquet(f"{work}/src").writeStream.format("lakesink").options(**table)
         .option("checkpointLocation", f"{work}/ck").trigger(availableNow=True).start())
query.awaitTermination()
spark.sql("CREATE TABLE found (id BIGINT, v STRING) USING lakesink")
spark.sql(f"INSERT INTO found WITH ('table' = 'db.found', 'warehouse' = '{warehouse}') VALUES (20, 'q')")
before = sorted([r["id"], r["v"]] for r in spark.read.format("lakesink").options(**table).load().collect())

from pyspark.errors import AnalysisException  # noqa: E402

from lakesink_datasource import LakeSinkDataSource  # noqa: E402  (after: the writes above went without it)

try:
    spark.dataSource.register(LakeSinkDataSource)
    registered = "yes"
except AnalysisException as error:  # PySpark 4.0: a source found by name cannot be replaced
    registered = str(error)
spark.createDataFrame([(30, "r")], "id long, v string").write.format("lakesink").options(**table).mode("append").save()
print(json.dumps({"read": before, "registered": registered}))
spark.stop()
