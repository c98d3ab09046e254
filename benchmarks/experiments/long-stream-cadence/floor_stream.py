"""The long stream's Spark floor: the same rate-micro-batch source and the same per-row columns
into a Python streaming sink that only consumes its input. Prints the addBatch medians of the
first and last 10% of batches (and per 100)."""
import os, sys, time, statistics, threading
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.streaming import StreamingQueryListener

class NullWriter(DataSourceStreamArrowWriter):
    def write(self, iterator):
        for _ in iterator:
            pass
        return WriterCommitMessage()
    def commit(self, messages, batchId):
        pass
    def abort(self, messages, batchId):
        pass

class NullSink(DataSource):
    @classmethod
    def name(cls):
        return "nullsink"
    def streamWriter(self, schema, overwrite):
        return NullWriter()

N = int(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.driver.memory", "2g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
spark.dataSource.register(NullSink)
got = {}
lock = threading.Condition()
class L(StreamingQueryListener):
    def onQueryStarted(self, e): pass
    def onQueryIdle(self, e): pass
    def onQueryTerminated(self, e): pass
    def onQueryProgress(self, e):
        p = e.progress
        if p.numInputRows:
            with lock:
                got[p.batchId] = p.durationMs.get("addBatch", 0); lock.notify_all()
spark.streams.addListener(L())
src = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 2000).option("numPartitions", 2).load()
       .select((F.col("value") % 50000).alias("id"), F.col("value").alias("version"), F.col("timestamp").alias("ts"),
               F.concat(F.lit("payload-"), F.col("value").cast("string")).alias("payload")))
q = src.writeStream.format("nullsink").option("checkpointLocation", f"/tmp/floor-cp-{time.time()}").trigger(processingTime="0 seconds").start()
with lock:
    while len(got) < N:
        lock.wait(5)
q.stop()
b = [got[k] for k in sorted(got)][:N]
n = len(b) // 10
print("first", statistics.median(b[:n]), "last", statistics.median(b[-n:]))
for lo in range(0, N, 100):
    print(lo, statistics.median(b[lo:lo+100]))
