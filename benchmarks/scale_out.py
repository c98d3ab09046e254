"""Keyed streams on 1, 2 and 4 hosts through key shards: `python -m benchmarks scale-out`.

A real standalone cluster (tests/standalone_cluster.py: a master and workers, each with a HOME
of its own, so its own key index) runs a keyed upsert stream routed by
`cluster_by_key` (SHARDS key shards, one per task slot) over 100K-row micro-batches (half
updates of existing keys spread over the table, half new keys; one Parquet file per
micro-batch) into a table of each size:

1. for 1, 2 and 4 workers (SLOTS task slots in all: 4, 2 and 1 cores each; 4 one-core
   workers share this machine's 2 cores, so their batch times say little, but the bytes
   each host holds and the index seconds summed over hosts do not need the cores), a
   warm-up micro-batch (every shard's index starts: rebuilt or fetched), then `--reps` timed
   ones; what each host's index holds on disk; which host held which shard in every batch
   (shard moves: a shard on another host than in the batch before);
2. on 2 workers, a fresh worker joining: one worker is killed and a new one (empty HOME)
   starts; the next micro-batch is timed (its shards start from their published copies and
   catch up), as is a plain append's first batch on a fresh worker (what any sink's first
   batch there costs: Python workers, imports, catalog, metadata);
3. on 1 worker, today's route against the key-shard route: the same stream unclustered
   (`repartition(SHARDS, "id")` into the whole index) and routed, alternating rounds.

Writes SCALE-OUT.md and scale_out.json. Targets (issue 36): index bytes per host at most
0.6x one host's with 2 workers and 0.35x with 4; index seconds summed over hosts at most
1.1x one host's with 2; a fresh executor's first batch at 10M rows at most 2x a steady one
(over the plain append's first-batch cost); no shard moves in steady state; the routed
stream at most 1.2x today's route on one host at 1M rows.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, host_probe, log, register_lakesink, tests_module

Cluster = tests_module("standalone_cluster").Cluster  # the cluster the tests start

IDENT = "bench.keyed"
SLOTS = 4  # task slots in every set-up
SHARDS = SLOTS  # one key shard per slot: the first batch places one per slot, evenly
SCHEMA = "id long, v string, cat int, batch long"
# What docs/usage.md recommends for clustered streams: a shard whose executor is gone waits this
# long (not Spark's default 3 s) before it runs elsewhere (experiments/fresh-executor).
LOCALITY_WAIT = "100ms"
TARGETS = {"bytes_2": 0.6, "bytes_4": 0.35, "index_2": 1.1, "fresh": 2.0, "routed_over_plain": 1.2}


def _session(cluster: Any, workers: int) -> Any:
    from pyspark.sql import SparkSession


    spark = (
        SparkSession.builder.master(cluster.master)
        .appName(f"scale-out-{workers}")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.cores", str(SLOTS // workers))
        .config("spark.executor.memory", f"{max(1, 4 // workers)}g")
        .config("spark.cores.max", str(SLOTS))
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(SHARDS))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.locality.wait.process", LOCALITY_WAIT)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_lakesink(spark)
    return spark


def _wait_for_executors(spark: Any, count: int) -> None:
    deadline = time.monotonic() + 180
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < count + 1:  # + the driver
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} executor(s) never registered")
        time.sleep(0.2)


def _options(warehouse: Path, index_dir: str | None = None) -> dict[str, str]:
    options = {"table": IDENT, "warehouse": str(warehouse), "progress": "false", "operation": "upsert", "primary_key": "id"}
    if index_dir is not None:
        options["index_dir"] = index_dir
    return options


def _build_base(spark: Any, warehouse: Path, rows: int) -> float:
    """The base table by plain appends (the keys are unique by construction): no index yet."""
    started = time.perf_counter()
    chunk = 5_000_000
    for start in range(0, rows, chunk):
        df = spark.range(start, min(rows, start + chunk), numPartitions=4).selectExpr(
            "id", "concat('base-', cast(id as string)) as v", "cast(id % 1000 as int) as cat", "cast(0 as long) as batch")
        df.write.format("lakesink").options(table=IDENT, warehouse=str(warehouse), progress="false", maintenance="off").mode("append").save()
    return time.perf_counter() - started


class Source:
    """A folder of Parquet files, one micro-batch each, in the order they are added."""

    def __init__(self, folder: Path, rows: int, batch_rows: int, first: int = 1):
        self.folder, self.rows, self.batch_rows = folder, rows, batch_rows
        self.next = first

    def add(self, spark: Any, count: int) -> None:
        half = self.batch_rows // 2
        for _ in range(count):
            b = self.next
            existing = spark.range(half).selectExpr(f"pmod(id * 7919 + {b * 104_729}, {self.rows}) as id")
            new = spark.range(self.rows + b * half, self.rows + (b + 1) * half)
            df = existing.union(new).selectExpr(
                "id", f"concat('b{b}-', cast(id as string)) as v", "cast(id % 1000 as int) as cat", f"cast({b} as long) as batch")
            target = self.folder / f"{b:05d}"
            df.coalesce(1).write.mode("overwrite").parquet(str(target))
            (file,) = target.glob("*.parquet")
            os.replace(file, self.folder / f"{b:05d}.parquet")
            shutil.rmtree(target)
            os.utime(self.folder / f"{b:05d}.parquet", (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
            self.next += 1


def _stream(spark: Any, source: Source, checkpoint: Path, warehouse: Path, clustered: bool) -> list[dict[str, Any]]:
    """Run the stream over the files not read yet; per micro-batch: its id and seconds."""
    from lakesink_datasource import cluster_by_key

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(source.folder))
    if clustered:
        writer = cluster_by_key(df, "id", **_options(warehouse)).writeStream.format("lakesink")
    else:
        writer = df.repartition(SHARDS, "id").writeStream.format("lakesink").options(**_options(warehouse))
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return [
        {"batch": int(p["batchId"]), "seconds": p["durationMs"]["triggerExecution"] / 1000, "query": p["id"]}
        for p in query.recentProgress if p["numInputRows"] > 0
    ]


def _running_stream(spark: Any, source: Source, checkpoint: Path, warehouse: Path) -> Any:
    from lakesink_datasource import cluster_by_key

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(source.folder))
    return (cluster_by_key(df, "id", **_options(warehouse)).writeStream.format("lakesink")
            .option("checkpointLocation", str(checkpoint)).trigger(processingTime="0 seconds").start())


def _wait_for_batches(query: Any, count: int) -> list[dict[str, Any]]:
    """The first `count` micro-batches with rows this run of `query` made, once made."""
    deadline = time.monotonic() + 900
    while True:
        done = [p for p in query.recentProgress if p["numInputRows"] > 0]
        if len(done) >= count:
            return [{"batch": int(p["batchId"]), "seconds": p["durationMs"]["triggerExecution"] / 1000, "query": p["id"]} for p in done[:count]]
        if query.exception() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the stream stopped or stalled: {query.exception()}")
        time.sleep(0.2)


def _snapshots(warehouse: Path, ident: str = IDENT) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    return catalog.load_table(ident).metadata


def annotate(warehouse: Path, batches: list[dict[str, Any]], homes: list[Path], shards: int = SHARDS, ident: str = IDENT) -> None:
    """Each batch's index seconds (summed over its tasks), what started over, and which
    worker held each key shard, from its snapshot."""
    from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, HOSTS, INDEX_SECONDS, INDEX_STARTS, QUERY_ID
    from lakesink_datasource.index.key_shards import KeyShard
    from lakesink_datasource.index.owner import index_owner, owner_digest

    metadata = _snapshots(warehouse, ident)
    owners: dict[str, tuple[int, int]] = {}
    for worker, home in enumerate(homes):
        for query in {r["query"] for r in batches}:
            # Each streaming query keeps its own index on a host (index/for_write.index_location).
            base = home / ".cache" / "lakesink" / "index" / f"{metadata.table_uuid}.query-{owner_digest(query)}"
            owners[index_owner(str(base))] = (worker, -1)
            owners.update({index_owner(f"{base}.{KeyShard(s, shards).name()}"): (worker, s) for s in range(shards)})
    by_epoch = {}
    for snapshot in metadata.snapshots:
        props = snapshot.summary.additional_properties
        if EPOCH_ID in props:
            by_epoch[(props.get(QUERY_ID), int(props[EPOCH_ID]))] = props
    for record in batches:
        props = by_epoch[(record["query"], record["batch"])]
        record["index_seconds"] = float(props.get(INDEX_SECONDS, 0))
        record["index_starts"] = props.get(INDEX_STARTS)
        held = [owners.get(h, (-1, -1)) for h in props.get(HOSTS, "").split(",") if h]
        record["placement"] = {str(shard): worker for worker, shard in held if shard >= 0}


def moves(batches: list[dict[str, Any]]) -> list[int]:
    """Per batch after the first: key shards on another worker than in the batch before."""
    return [sum(1 for s, w in b["placement"].items() if a["placement"].get(s) not in (None, w)) for a, b in itertools.pairwise(batches)]


def _index_bytes(home: Path) -> int:
    """Bytes on disk of the key shards' indexes a worker holds (blocks in use: LMDB files
    may be sparse)."""
    folder = home / ".cache" / "lakesink" / "index"
    return sum(f.stat().st_blocks * 512 for d in folder.glob("*.key-shard-*") for f in d.rglob("*") if f.is_file())


def _median(records: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in records), 3)


def _phase(root: Path, warehouse: Path, rows: int, workers: int, reps: int, batch_rows: int, source: Source,
           fresh: bool, compare: bool) -> dict[str, Any]:
    cluster = Cluster(root)
    cluster.start_master()
    for _ in range(workers):
        cluster.start_worker(memory=f"{max(2, 6 // workers)}g", cores=SLOTS // workers)
    spark = _session(cluster, workers)
    out: dict[str, Any] = {"workers": workers}
    try:
        _wait_for_executors(spark, workers)
        checkpoint = source.folder.parent / "checkpoint-routed"  # one query across the set-ups, restarted on each
        source.add(spark, reps + 1)
        batches = _stream(spark, source, checkpoint, warehouse, clustered=True)
        annotate(warehouse, batches, cluster.homes)
        out["warmup"], out["steady"] = batches[0], batches[1:]
        out["moves"] = moves(batches)
        out["index_bytes_per_host"] = [_index_bytes(h) for h in cluster.homes]
        log(f"    {workers} worker(s): warm-up {batches[0]['seconds']:.2f} s; steady " + ", ".join(
            f"{b['seconds']:.2f}/{b['index_seconds']:.2f}" for b in batches[1:]) + f"; moves {out['moves']}; "
            f"index MB per host {[round(b / 1e6) for b in out['index_bytes_per_host']]}")
        if compare:
            # Today's route (the whole index, repartition by key) against key shards, alternating.
            rounds: dict[str, list[dict[str, Any]]] = {"plain": [], "routed": []}
            plain_source = Source(source.folder.parent / "source-plain", source.rows, source.batch_rows, first=10_000)
            plain_source.folder.mkdir(exist_ok=True)
            for r in range(2):
                for routed in (False, True):
                    feed = source if routed else plain_source
                    feed.add(spark, reps + 1)
                    run = _stream(spark, feed, checkpoint if routed else feed.folder.parent / "checkpoint-plain", warehouse, clustered=routed)
                    annotate(warehouse, run, cluster.homes)
                    rounds["routed" if routed else "plain"] += run[1:]  # the first catches up the other's batches
                    log(f"    round {r} {'routed' if routed else 'plain'}: " + ", ".join(f"{b['seconds']:.2f}" for b in run))
            out["compare"] = rounds
        if fresh:
            plain = {"table": "bench.plain", "warehouse": str(warehouse), "progress": "false"}
            append = spark.range(100_000).selectExpr("id", "'x' as v", "0 as cat", "cast(0 as long) as batch")
            append.limit(1).write.format("lakesink").options(**plain).mode("append").save()
            for label in ("fresh_append", "warm_append"):
                if label == "fresh_append":
                    cluster.kill_worker(len(cluster.homes) - 1)
                    cluster.start_worker(memory=f"{max(2, 6 // workers)}g", cores=SLOTS // workers)
                    _wait_for_executors(spark, workers)
                t0 = time.perf_counter()
                append.repartition(SLOTS).write.format("lakesink").options(**plain).mode("append").save()
                out[label] = round(time.perf_counter() - t0, 3)
            # The stream keeps running while a worker is lost and a fresh one joins (a restarted
            # query would place every shard anew: Spark keeps state store locations per run).
            query = _running_stream(spark, source, checkpoint, warehouse)
            try:
                source.add(spark, 2)
                settled = _wait_for_batches(query, 2)  # the restart's placement settles
                cluster.kill_worker(len(cluster.homes) - 1)
                cluster.start_worker(memory=f"{max(2, 6 // workers)}g", cores=SLOTS // workers)
                _wait_for_executors(spark, workers)
                source.add(spark, 2)
                joined = _wait_for_batches(query, 4)[2:]
            finally:
                query.stop()
            annotate(warehouse, settled + joined, cluster.homes)
            out["restart"] = settled
            out["fresh"], out["after_fresh"] = joined[0], joined[1]
            out["restart_moves"] = moves([batches[-1], *settled])
            out["fresh_moves"] = moves([settled[-1], *joined])
            log(f"    restarted query: moves {out['restart_moves']}; fresh worker: first batch {joined[0]['seconds']:.2f} s (index "
                f"{joined[0]['index_seconds']:.2f} s; {joined[0]['index_starts']}), next {joined[1]['seconds']:.2f} s; moves "
                f"{out['fresh_moves']}; plain append on a fresh worker {out['fresh_append']:.2f} s, warm {out['warm_append']:.2f} s")
    finally:
        spark.stop()
        cluster.stop()
    return out


def run(sizes: list[int], reps: int, batch_rows: int, workdir: Path, out_dir: Path) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    started = time.perf_counter()
    results: dict[str, Any] = {
        "batch_rows": batch_rows, "reps": reps, "shards": SHARDS, "slots": SLOTS, "locality_wait": LOCALITY_WAIT, "date": time.strftime("%Y-%m-%d"),
        "host_probe_start": host_probe(), "sizes": [],
    }
    for rows in sizes:
        root = workdir / f"rows-{rows}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        warehouse = root / "warehouse"
        log(f"{rows:,} rows: building the base table")
        build_cluster = Cluster(root / "build")
        build_cluster.start_master()
        build_cluster.start_worker(memory="5g", cores=SLOTS)
        spark = _session(build_cluster, 1)
        try:
            _wait_for_executors(spark, 1)
            build = _build_base(spark, warehouse, rows)
        finally:
            spark.stop()
            build_cluster.stop()
        log(f"  base built in {build:.1f} s")
        source = Source(root / "source", rows, batch_rows)
        source.folder.mkdir()
        entry: dict[str, Any] = {"rows": rows, "build_seconds": round(build, 1), "phases": {}}
        for workers in (1, 2, 4):
            entry["phases"][str(workers)] = _phase(
                root / f"w{workers}", warehouse, rows, workers, reps, batch_rows, source,
                fresh=workers == 2, compare=workers == 1 and rows == min(sizes),
            )
        entry["summary"] = _summary(entry)
        results["sizes"].append(entry)
        shutil.rmtree(root, ignore_errors=True)
    results["host_probe_end"] = host_probe()
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scale_out.json").write_text(json.dumps(results, indent=2))
    (out_dir / "SCALE-OUT.md").write_text(render(results))
    log(f"wrote {out_dir / 'SCALE-OUT.md'}")
    return results


def _summary(entry: dict[str, Any]) -> dict[str, Any]:
    phases = entry["phases"]
    s: dict[str, Any] = {}
    for w in ("1", "2", "4"):
        p = phases[w]
        s[f"batch_{w}"] = _median(p["steady"], "seconds")
        s[f"index_{w}"] = _median(p["steady"], "index_seconds")
        s[f"index_sum_{w}"] = round(sum(b["index_seconds"] for b in p["steady"]), 2)
        s[f"bytes_{w}"] = p["index_bytes_per_host"]
        # What one host holds against all of them: the whole index at that table state (the
        # table grows by half a micro-batch of keys per batch, so set-ups are not compared).
        s[f"bytes_ratio_{w}"] = round(max(p["index_bytes_per_host"]) / max(sum(p["index_bytes_per_host"]), 1), 2)
        s[f"moves_{w}"] = sum(p["moves"][1:])  # from the first timed batch on
    s["index_ratio_2"] = round(s["index_2"] / max(s["index_1"], 1e-9), 2)
    s["index_ratio_4"] = round(s["index_4"] / max(s["index_1"], 1e-9), 2)
    two = phases["2"]
    if "fresh" in two:
        extra = max(0.0, two["fresh_append"] - two["warm_append"])
        s["fresh_s"] = two["fresh"]["seconds"]
        s["fresh_over_steady"] = round((two["fresh"]["seconds"] - extra) / max(s["batch_2"], 1e-9), 2)
        s["fresh_append_extra_s"] = round(extra, 3)
        s["fresh_moves"] = two["fresh_moves"]
        s["restart_moves"] = two["restart_moves"]
    one = phases["1"]
    if "compare" in one:
        s["plain_s"] = _median(one["compare"]["plain"], "seconds")
        s["routed_s"] = _median(one["compare"]["routed"], "seconds")
        s["routed_over_plain"] = round(s["routed_s"] / max(s["plain_s"], 1e-9), 2)
    return s


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Keyed streams on 1, 2 and 4 hosts through key shards (standalone cluster)",
        "",
        f"`python -m benchmarks scale-out`, {results['date']}: {results['batch_rows']:,}-row upsert micro-batches (half existing keys) "
        f"routed by `cluster_by_key` into {results['shards']} key shards; {results['slots']} task slots in every set-up (1 worker x "
        f"{results['slots']} cores, 2 x {results['slots'] // 2}, 4 x 1; this machine has 2 cores, so 4 workers time-share them), "
        f"each worker with its own HOME (key index); `spark.locality.wait.process={results.get('locality_wait', '3s')}` (the "
        "setting docs/usage.md recommends for clustered streams); "
        f"{results['reps']} timed micro-batches per set-up after a warm-up one; medians. "
        f"Host probe {results['host_probe_start']} -> {results['host_probe_end']}; {results['total_seconds'] / 60:.1f} min in all.",
        "",
        "| rows | index MB per host: 1 / 2 / 4 workers | largest host's share of all: 2 (<= 0.6) / 4 (<= 0.35) | index s summed over "
        "hosts, median: 1 / 2 / 4 | 2/1 (<= 1.1) | batch s: 1 / 2 / 4 | shard moves in steady state | fresh worker's first batch: s (x steady, <= 2) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in results["sizes"]:
        s = entry["summary"]
        mb = " / ".join(",".join(f"{b / 1e6:.0f}" for b in s[f"bytes_{w}"]) for w in ("1", "2", "4"))
        ratio = (f"{s['fresh_over_steady']:.2f}x" if s["fresh_over_steady"] > 0 else "within")  # quicker than a plain append's first batch
        fresh = (f"{s['fresh_s']:.2f} ({ratio}, less {s['fresh_append_extra_s']:.2f} s any sink's first batch; "
                 f"shards moved {s['fresh_moves'][0]} of {results['shards']})") if "fresh_s" in s else "-"
        lines.append(
            f"| {entry['rows']:,} | {mb} | {s['bytes_ratio_2']:.2f} / {s['bytes_ratio_4']:.2f} | {s['index_1']:.2f} / {s['index_2']:.2f} / "
            f"{s['index_4']:.2f} | {s['index_ratio_2']:.2f} | {s['batch_1']:.2f} / {s['batch_2']:.2f} / {s['batch_4']:.2f} | "
            f"{s['moves_1']} / {s['moves_2']} / {s['moves_4']} | {fresh} |"
        )
    for entry in results["sizes"]:
        s = entry["summary"]
        if "restart_moves" in s:
            lines += ["", f"{entry['rows']:,} rows, 2 workers: restarting the query on the same checkpoint moved "
                      f"{s['restart_moves'][0]} of {results['shards']} shards (Spark keeps state store locations per query run), "
                      f"then none moved; the running query losing a worker moved {s['fresh_moves'][0]}."]
        if "routed_s" in s:
            lines += ["", f"One worker, {entry['rows']:,} rows, today's route (`repartition({results['shards']}, id)` into the whole "
                      f"index) against key shards, alternating rounds: {s['plain_s']:.2f} s vs {s['routed_s']:.2f} s a micro-batch "
                      f"({s['routed_over_plain']:.2f}x; target <= 1.2x)."]
    lines += ["", "Per micro-batch (seconds / index seconds summed over tasks; which worker held each shard; what started over):", ""]
    for entry in results["sizes"]:
        for w, phase in entry["phases"].items():
            records = [phase["warmup"], *phase["steady"], *phase.get("restart", []), *[phase[k] for k in ("fresh", "after_fresh") if k in phase]]
            lines.append(f"- {entry['rows']:,} rows, {w} worker(s): " + "; ".join(
                f"b{r['batch']} {r['seconds']:.2f}/{r['index_seconds']:.2f} {r['placement']}" + (f" [{r['index_starts']}]" if r["index_starts"] else "")
                for r in records))
    return "\n".join(lines) + "\n"


def main_args(sizes: str, reps: int, batch_rows: int, workdir: str | None, out: str | None) -> int:
    run([int(s) for s in sizes.split(",")], reps, batch_rows, Path(workdir or "/tmp/lakesink-scale-out"),
        Path(out).resolve() if out else OUT_DIR)
    return 0
