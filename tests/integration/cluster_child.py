"""A driver on a real Spark standalone cluster (tests/integration/test_standalone_cluster.py).

usage: cluster_child.py MASTER_URL WAREHOUSE FAULTS_FILE SCENARIO OUT_JSON
SCENARIO "cdc": keyed CDC batches clustered by key (an executor JVM is killed during one of
them), then a batch whose key reaches both hosts, then one more batch.
SCENARIO "speculation": the same session with spark.speculation=true: an append, then a
keyed write. SCENARIO "replace": a keyed CDC stream clustered by key over the first half of
the batches, then a pause (the file `<OUT_JSON>.paused` appears; the test replaces a worker
and writes `<OUT_JSON>.resume`), then the same stream (same checkpoint) over the rest.
SCENARIO "routed": the same through cluster_by_key (2 key shards, one per slot), an executor killed during
batch 2, the pause after batch 3.
SCENARIO "one-worker": two executors on one worker: a cdc stream through cluster_by_key, then
an unrouted keyed batch; an executor is killed in each (its task runs again on the same host
in a resubmitted stage).
OUT_JSON records what each step did, for the test to compare with its model.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

SCHEMA = "id long, v string, op string, seq long"
TABLE = "db.cdc"


def cdc_batches(count: int = 4) -> list[list[tuple[int, str, str, int]]]:
    """Batches over keys 0..199: inserts, updates, deletes, late (older) changes."""
    batches = []
    for b in range(count):
        rows = []
        for k in range(200):
            if (k + b) % 3 == 0:
                rows.append((k, f"b{b}-{k}", "d" if (k + b) % 6 == 0 else "u", 10 * b + 5))
            elif b and k % 7 == 0:
                rows.append((k, f"late{b}-{k}", "u", 10 * (b - 1)))  # older than what the table has: ignored
        batches.append(rows)
    return batches


def pause_for_the_test(out: str) -> None:
    """Say the driver paused (`<out>.paused`), then wait until the test has replaced a worker
    and says so (`<out>.resume`)."""
    open(f"{out}.paused", "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(f"{out}.resume"):
        if time.monotonic() > deadline:
            raise SystemExit("the test never replaced the worker")
        time.sleep(0.1)


def kill_an_executor_at_files_written(faults: str, batch: int | None = None) -> None:
    """Arm the fault: the first task (of micro-batch `batch`, if given) to finish writing its
    files loses its executor; fired once."""
    rule: dict[str, object] = {"point": "task_files_written", "action": "kill_executor", "once": True}
    if batch is not None:
        rule["batch"] = batch
    with open(faults, "w") as f:
        json.dump([rule], f)


def fault_fired(faults: str) -> bool:
    """Whether the armed fault fired (a fired rule is taken out of the file)."""
    with open(faults) as f:
        return json.load(f) == []


def main(master: str, warehouse: str, faults: str, scenario: str, out: str) -> None:
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource
    from lakesink_datasource.spark_version import register_replaces_found

    builder = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "768m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.executorEnv.LAKESINK_FAULTS", faults)
        .config("spark.task.maxFailures", "4")
        .config("spark.sql.session.timeZone", "UTC")
        # The JVM options tests/conftest.py gives every driver (the class archive, C1 only).
        .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
    )
    if scenario == "speculation":
        builder = builder.config("spark.speculation", "true")
    if scenario in ("routed", "one-worker"):
        builder = builder.config("spark.sql.shuffle.partitions", "4")
    if scenario == "one-worker":
        # As where each executor has a disk of its own (containers): a lost executor's map
        # output is lost with it (no reading its files from the host's disk), so Spark
        # resubmits the stage and task attempt numbers start over.
        builder = builder.config("spark.shuffle.readHostLocalDisk", "false")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if register_replaces_found():  # PySpark 4.0 refuses it: lakesink is found by name there
        spark.dataSource.register(LakeSinkDataSource)

    def both_executors() -> None:
        # Both workers' executors registered (the driver counts as one more): after an
        # executor is killed its worker starts another, and until it registers every task
        # would run on the one host left.
        deadline = time.monotonic() + 120
        while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:
            if time.monotonic() > deadline:
                raise SystemExit("the cluster's two executors never registered")
            time.sleep(0.2)

    def resubmitted_stages(group: str) -> int:
        # Stages of the job group's jobs that Spark ran more than once (a stage attempt above 0).
        tracker = spark.sparkContext.statusTracker()
        stages = {s for j in tracker.getJobIdsForGroup(group) if (job := tracker.getJobInfo(j)) for s in job.stageIds}
        return sum(1 for s in stages if (info := tracker.getStageInfo(s)) is not None and info.currentAttemptId > 0)

    keyed = {"table": TABLE, "warehouse": warehouse, "operation": "cdc", "primary_key": "id", "op_column": "op", "sequence_column": "seq"}
    report: dict[str, object] = {}

    def write(df, options: dict[str, str]) -> str | None:  # type: ignore[no-untyped-def]
        both_executors()
        try:
            df.write.format("lakesink").options(**options).mode("append").save()
            return None
        except Exception as exc:  # noqa: BLE001 (the test checks the message)
            return str(exc)

    if scenario == "routed":
        # A keyed CDC stream through cluster_by_key (its default: 2 key shards, one per slot of 2 one-core workers): an
        # executor is killed while it writes batch 2, then the driver pauses (the test
        # replaces a worker) and the same query goes on over batches 4..7.
        from lakesink_datasource import cluster_by_key

        source, checkpoint = f"{out}.source", f"{out}.checkpoint"
        batches = cdc_batches(8)
        routed_options = {k: v for k, v in keyed.items() if k != "primary_key"}

        def routed_stream(first: int, last: int) -> None:
            for b in range(first, last):
                spark.createDataFrame(batches[b], SCHEMA).coalesce(1).write.mode("append").parquet(source)
            both_executors()
            df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
            query = (
                cluster_by_key(df, "id", **routed_options).writeStream.format("lakesink")
                .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
            )
            query.awaitTermination()

        kill_an_executor_at_files_written(faults, batch=2)
        routed_stream(0, 4)
        report["fault_fired"] = fault_fired(faults)
        pause_for_the_test(out)
        routed_stream(4, 8)
        report["done"] = True
    elif scenario == "one-worker":
        # Two executors on one worker (one HOME, so one index directory for both processes):
        # a routed cdc stream (2 key shards, one on each executor), then an unrouted keyed
        # batch whose tasks on both executors share the worker's whole index.
        from lakesink_datasource import cluster_by_key

        both_executors()
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
        report["block_managers"] = status.size()
        source, checkpoint = f"{out}.source", f"{out}.checkpoint"
        for rows in cdc_batches(8):
            spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("append").parquet(source)
        # Two map tasks feed the shard tasks (one on each executor), so the executor killed in
        # batch 2 takes map output with it: Spark resubmits the stage, and the shard task runs
        # again on the same worker with its attempt number started over at 0.
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source).repartition(2)
        routed_options = {k: v for k, v in keyed.items() if k != "primary_key"}
        kill_an_executor_at_files_written(faults, batch=2)
        query = (cluster_by_key(df, "id", **routed_options).writeStream.format("lakesink").option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start())
        query.awaitTermination()
        report["routed_fault_fired"] = fault_fired(faults)
        report["routed_resubmitted"] = resubmitted_stages(str(query.runId))
        # The same for an unrouted keyed batch (two map tasks again, one on each executor).
        kill_an_executor_at_files_written(faults)
        last = [(k, f"final-{k}", "u", 1000) for k in range(0, 200, 10)]
        spark.sparkContext.setJobGroup("unrouted", "the unrouted keyed batch")
        report["after"] = write(spark.createDataFrame(last, SCHEMA).repartition(2).repartition(4, "id"), keyed)
        report["unrouted_fault_fired"] = fault_fired(faults)
        report["unrouted_resubmitted"] = resubmitted_stages("unrouted")
        report["done"] = True
    elif scenario == "replace":
        source, checkpoint = f"{out}.source", f"{out}.checkpoint"
        batches = cdc_batches()

        def stream(first: int, last: int) -> None:
            for b in range(first, last):
                spark.createDataFrame(batches[b], SCHEMA).coalesce(1).write.mode("append").parquet(source)
            both_executors()
            (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source).repartition(2, "id")
                .writeStream.format("lakesink").options(**keyed).option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start().awaitTermination())

        stream(0, 2)
        pause_for_the_test(out)
        stream(2, len(batches))
        report["done"] = True
    elif scenario == "speculation":
        report["append"] = write(spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string").repartition(2), {"table": "db.appended", "warehouse": warehouse})
        rows = [(k, f"v{k}", "u", 1) for k in range(10)]
        report["keyed"] = write(spark.createDataFrame(rows, SCHEMA).repartition(2, "id"), keyed)
    else:
        errors = []
        for b, rows in enumerate(cdc_batches()):
            if b == 2:
                kill_an_executor_at_files_written(faults)
            errors.append(write(spark.createDataFrame(rows, SCHEMA).repartition(4, "id"), keyed))
        report["errors"] = errors
        report["fault_fired"] = fault_fired(faults)
        # Key 7777 in each of 4 slices: tasks on both executors change it.
        spread = [[(7777, f"slice{s}", "u", 100 + s)] + [(1000 + 10 * s + i, "x", "u", 100) for i in range(3)] for s in range(4)]
        rdd = spark.sparkContext.parallelize([r for part in spread for r in part], 4)
        report["spread"] = write(spark.createDataFrame(rdd, SCHEMA), keyed)
        last = [(k, f"final-{k}", "u", 1000) for k in range(0, 200, 10)]
        report["after"] = write(spark.createDataFrame(last, SCHEMA).repartition(4, "id"), keyed)
    with open(out, "w") as f:
        json.dump(report, f)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
