"""Build a class-data-sharing archive of the classes a Spark driver loads, for this venv's Spark.

A Spark driver JVM spends most of its start loading and verifying some ten thousand classes
from Spark's jars (8.4 s to a local session here, 4.3 s with the archive). Java 13+ can
record the classes one run loaded (`-XX:ArchiveClassesAtExit`) and map them into later runs
(`-XX:SharedArchiveFile`); an archive that does not match the JVM or the class path is
ignored. This script runs a small lakesink job once, with the JVM recording, and leaves the
archive at `<venv>/lakesink-spark-classes.jsa` beside a stamp of the Spark and Java it was
made with; run again, it keeps an archive whose stamp still matches. tests/conftest.py hands
it to every driver the tests start (`SPARK_SUBMIT_OPTS`); docs/deploy.md gives the same
recipe for scheduled jobs.

    .venv/bin/python scripts/spark_class_archive.py            prints the archive's path
    .venv/bin/python scripts/spark_class_archive.py --options  prints SPARK_SUBMIT_OPTS for it

A job that fails or does not end within ten minutes leaves no archive (the tests then run
without one, only slower): the script says why on stderr and exits 0, printing nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHIVE = Path(sys.prefix) / "lakesink-spark-classes.jsa"
STAMP = ARCHIVE.with_suffix(".stamp")


def use_options(archive: Path) -> str:
    """The driver's JVM options that map `archive`; quiet when it does not fit (another JVM
    or class path), and the driver then starts unshared."""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not found:
        raise SystemExit("lakesink: no java on PATH and no JAVA_HOME")
    return os.path.realpath(found)


def stamp() -> str:
    import pyspark

    binary = java()
    st = os.stat(binary)
    return f"pyspark {pyspark.__version__} at {os.path.dirname(pyspark.__file__)}; java {binary} {st.st_size} {st.st_mtime_ns}\n"


def job(work: str) -> None:
    """What a test driver does: a session, lakesink found and registered, a parquet source
    streamed into a table (append, then keyed), a batch write, a SQL read."""
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource
    from lakesink_datasource.spark_version import register_replaces_found

    source = os.path.join(work, "source")
    os.makedirs(source)
    for b in range(2):
        rows = {"id": pa.array(range(b * 10, b * 10 + 20), pa.int64()), "name": [f"n{i}" for i in range(20)]}
        pq.write_table(pa.table(rows), os.path.join(source, f"{b:03d}.parquet"))
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    if register_replaces_found():
        spark.dataSource.register(LakeSinkDataSource)
    warehouse = os.path.join(work, "warehouse")
    stream = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", 1).parquet(source)
    for table, extra in (("db.appended", {"partition_by": "bucket(2, id)"}), ("db.keyed", {"operation": "upsert", "primary_key": "id"})):
        query = (
            stream.writeStream.format("lakesink").options(warehouse=warehouse, table=table, progress="false", **extra)
            .option("checkpointLocation", os.path.join(work, table)).trigger(availableNow=True).start()
        )
        query.awaitTermination()
    spark.read.parquet(source).write.format("lakesink").mode("append").options(warehouse=warehouse, progress="false").save("db.batch")
    spark.read.format("lakesink").options(warehouse=warehouse).load("db.keyed").createOrReplaceTempView("keyed")
    spark.sql("SELECT name, count(*) FROM keyed GROUP BY name ORDER BY name").collect()
    spark.stop()


def build() -> Path | None:
    wanted = stamp()
    if ARCHIVE.exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return ARCHIVE
    ARCHIVE.unlink(missing_ok=True)
    partial = ARCHIVE.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="lakesink-class-archive-") as work:
        env = dict(os.environ, SPARK_SUBMIT_OPTS=f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=off -Xlog:cds+dynamic=off")
        try:
            run = subprocess.run([sys.executable, __file__, "--job", work], env=env, capture_output=True, text=True, timeout=600)
            failed = f"the job exited {run.returncode}:\n{run.stderr[-2000:]}" if run.returncode != 0 else None
        except subprocess.TimeoutExpired:
            failed = "the job did not end within ten minutes"
    if failed is not None or not partial.exists():
        partial.unlink(missing_ok=True)
        print(f"lakesink: no Spark class archive ({failed or 'the JVM wrote none'})", file=sys.stderr)
        return None
    os.replace(partial, ARCHIVE)
    STAMP.write_text(wanted)
    return ARCHIVE


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job(sys.argv[2])
    else:
        built = build()
        if built is not None:
            print(use_options(built) if sys.argv[1:2] == ["--options"] else built)
