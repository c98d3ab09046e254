"""Where a fresh executor's first routed micro-batch spends its time (issue 36).

`python benchmarks/experiments/fresh-executor/locality.py ROWS [WAIT ...]`: a standalone
cluster of two 2-core workers runs a keyed upsert stream through `cluster_by_key` (4 shards,
100K-row micro-batches) into a table of ROWS keys; under the running query one worker is
killed and a fresh one (empty HOME) joins; the next micro-batch is timed. For each
`spark.locality.wait.process` in WAIT (default: Spark's 3s, then 0.3s), a new cluster and
query. Spark's REST API gives each task of the fresh batch its launch time against its
stage's submission: a task whose preferred executor (where its state store was) is gone
waits the locality wait before it runs anywhere else.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks import scale_out
from benchmarks.harness import tests_module
from benchmarks.scale_out import Source, _build_base, _running_stream, _wait_for_batches, _wait_for_executors, annotate

Cluster = tests_module("standalone_cluster").Cluster

WORKDIR = Path("/tmp/lakesink-fresh-executor")


def _session(cluster: Cluster, wait: str | None) -> Any:
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource

    builder = (
        SparkSession.builder.master(cluster.master).appName("fresh-executor")
        .config("spark.executor.cores", "2").config("spark.executor.memory", "2g").config("spark.cores.max", "4")
        .config("spark.driver.memory", "2g").config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC").config("spark.ui.enabled", "true").config("spark.ui.port", "4077")
    )
    if wait is not None:
        builder = builder.config("spark.locality.wait.process", wait)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LakeSinkDataSource)
    return spark


def _tasks(spark: Any, since_ms: float) -> list[dict[str, Any]]:
    """Every task of stages submitted after `since_ms`: stage, executor, locality, launch delay."""
    base = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}"
    with urllib.request.urlopen(f"{base}/stages?status=complete") as r:
        stages = json.load(r)
    out = []
    for st in stages:
        submitted = _ms(st.get("submissionTime"))
        if submitted is None or submitted < since_ms:
            continue
        with urllib.request.urlopen(f"{base}/stages/{st['stageId']}/{st['attemptId']}/taskList?length=100") as r:
            for t in json.load(r):
                out.append({"stage": st["stageId"], "name": st["name"][:40], "executor": t["executorId"], "locality": t["taskLocality"],
                            "launch_delay_s": round((_ms(t["launchTime"]) - submitted) / 1000, 2), "duration_s": round(t.get("duration", 0) / 1000, 2)})
    return out


def _ms(stamp: str | None) -> float | None:
    if not stamp:
        return None
    from datetime import datetime

    return datetime.strptime(stamp.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


def main(rows: int, waits: list[str | None]) -> None:
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    warehouse = WORKDIR / "warehouse"
    build = Cluster(WORKDIR / "build")
    build.start_master()
    build.start_worker(memory="5g", cores=4)
    spark = scale_out._session(build, 1)
    try:
        _wait_for_executors(spark, 1)
        _build_base(spark, warehouse, rows)
    finally:
        spark.stop()
        build.stop()
    results = []
    for i, wait in enumerate(waits):
        cluster = Cluster(WORKDIR / f"c{i}")
        cluster.start_master()
        for _ in range(2):
            cluster.start_worker(memory="3g", cores=2)
        spark = _session(cluster, wait)
        source = Source(WORKDIR / f"source{i}", rows, 100_000, first=1 + 100 * i)
        source.folder.mkdir()
        try:
            _wait_for_executors(spark, 2)
            query = _running_stream(spark, source, WORKDIR / f"checkpoint{i}", warehouse)
            try:
                source.add(spark, 3)
                settled = _wait_for_batches(query, 3)
                cluster.kill_worker(1)
                cluster.start_worker(memory="3g", cores=2)
                _wait_for_executors(spark, 2)
                since = time.time() * 1000
                source.add(spark, 3)
                joined = _wait_for_batches(query, 6)[3:]
            finally:
                query.stop()
            annotate(warehouse, settled + joined, cluster.homes)
            tasks = _tasks(spark, since)
        finally:
            spark.stop()
            cluster.stop()
        entry = {"locality_wait_process": wait or "3s (default)", "steady_s": [b["seconds"] for b in settled[1:]],
                 "fresh_s": joined[0]["seconds"], "after_s": [b["seconds"] for b in joined[1:]],
                 "fresh_index_s": joined[0]["index_seconds"], "placement": [b["placement"] for b in settled + joined], "tasks": tasks}
        results.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "tasks"}), flush=True)
        for t in tasks:
            print("   ", t, flush=True)
    (Path(__file__).parent / f"results-{time.strftime('%Y-%m-%d')}-{rows}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(int(sys.argv[1]), [None if w == "default" else w for w in (sys.argv[2:] or ["default", "0.3s"])])
