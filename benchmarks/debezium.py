"""A database's change stream as Debezium writes it: `python -m benchmarks debezium` ->
DEBEZIUM.md, debezium.json.

The events: 20 source tables of a PostgreSQL connector, 1M change events in 10 micro-batches
of 100K, Kafka-shaped (key, value, topic, partition, offset; JsonConverter with its schema
wrapper on key and value), one Parquet file per micro-batch. A snapshot of 2,000 rows per
table first, then 60% updates (a tenth of them leave the TOASTed `bio` unchanged: its
placeholder), 10% deletes (each with its tombstone) and the rest inserts.

Two sides, each in a fresh process (`local[2]`, the embedded catalog, a warm-up stream first),
interleaved over `--reps` runs:
- `debezium`: `cdc_format=debezium`, nothing else;
- `by hand`: what a Spark user writes today: Spark's `get_json_object` for the table, op,
  LSN, row and key, tombstones filtered, into the routed cdc write (`table_column`,
  `payload_column`, `key_column`, `sequence_column`). It stores decimals as base64 text and
  the TOAST placeholder over real values: it is the speed to beat, not a correct replica.
Reported per side: wall time, mean micro-batch time, CPU seconds of the process tree, and
events per second (per core: divided by the 2 cores of local[2]). Issue 52's target: at
least 2x the hand-parsed path's events per second.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import OUT_DIR, PROJECT_ROOT, _cpu_ticks, _descendants, host_probe, log, register_lakesink

WORKDIR = Path("/tmp/lakesink-debezium")
TABLES = 20
SNAPSHOT_ROWS = 2_000
EVENTS = 1_000_000
BATCHES = 10
PLACEHOLDER = "__debezium_unavailable_value"
KAFKA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64())])
CLK_TCK = os.sysconf("SC_CLK_TCK")

_COLUMNS = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "string", "optional": True, "field": "email"},
    {"type": "string", "optional": True, "field": "bio"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
     "parameters": {"scale": "2", "connect.decimal.precision": "12"}, "field": "balance"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1, "field": "born"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "seen"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "updated"},
    {"type": "int32", "optional": True, "field": "visits"},
]


def _schemas(table: str) -> tuple[str, str]:
    value = {"type": "struct", "optional": True, "name": f"pg.public.{table}.Value", "fields": _COLUMNS}
    source = {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source", "field": "source", "fields": [
        {"type": "string", "optional": False, "field": "version"}, {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"}, {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "string", "optional": True, "field": "snapshot"}, {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"}, {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"}, {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"}, {"type": "int64", "optional": True, "field": "xmin"}]}
    envelope = {"type": "struct", "optional": False, "name": f"pg.public.{table}.Envelope", "fields": [
        {**value, "field": "before"}, {**value, "field": "after"}, source,
        {"type": "string", "optional": False, "field": "op"}, {"type": "int64", "optional": True, "field": "ts_ms"}]}
    key = {"type": "struct", "optional": False, "name": f"pg.public.{table}.Key", "fields": [{"type": "int64", "optional": False, "field": "id"}]}
    return json.dumps(envelope, separators=(",", ":")), json.dumps(key, separators=(",", ":"))


def _row(rng: random.Random, i: int, n: int) -> dict[str, Any]:
    cents = rng.randint(-10**7, 10**7)
    return {"id": i, "name": f"name {n}", "email": f"user{i}@example.org", "bio": f"biography {n} " * 8,
            "balance": base64.b64encode(cents.to_bytes(8, "big", signed=True)).decode(), "born": 7000 + i % 9000,
            "seen": 1_700_000_000_000_000 + n, "updated": "2024-03-01T10:00:00.123456Z", "visits": n % 1000}


def make_events(folder: Path, events_total: int = EVENTS, batches: int = BATCHES, seed: int = 52) -> int:
    """The micro-batches' records, one Parquet file each; returns the number of records."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    schemas = {f"t{t:02d}": _schemas(f"t{t:02d}") for t in range(TABLES)}
    live: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in schemas}
    next_id = dict.fromkeys(schemas, 0)
    offsets = dict.fromkeys(schemas, 0)
    lsn = 1_000_000
    records_total = 0
    per_batch = events_total // batches
    for b in range(batches):
        columns: dict[str, list[Any]] = {"key": [], "value": [], "topic": [], "partition": [], "offset": [], "file": []}
        # Each table's topic has one partition, on one of two files per micro-batch: two Spark
        # tasks, as a Kafka source reading two partitions' offsets gives.

        def emit(table: str, key: int, payload: dict[str, Any] | None, columns: dict[str, list[Any]] = columns) -> None:
            envelope, key_schema = schemas[table]
            columns["key"].append(f'{{"schema":{key_schema},"payload":{{"id":{key}}}}}'.encode())
            columns["value"].append(None if payload is None else f'{{"schema":{envelope},"payload":{json.dumps(payload, separators=(",", ":"))}}}'.encode())
            columns["topic"].append(f"pg.public.{table}")
            columns["partition"].append(0)
            columns["file"].append(int(table[1:]) % 2)
            columns["offset"].append(offsets[table])
            offsets[table] += 1

        events = 0
        while events < per_batch:
            table = f"t{rng.randrange(TABLES):02d}"
            rows = live[table]
            lsn += 8
            source = {"version": "2.7.3.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1_700_000_000_000, "db": "shop",
                      "sequence": f'["{lsn - 8}","{lsn}"]', "schema": "public", "table": table, "txId": lsn // 8, "lsn": lsn, "xmin": None}
            if b == 0 and next_id[table] < SNAPSHOT_ROWS:
                op = "r"
            else:
                r = rng.random()
                op = "u" if r < 0.6 and rows else "d" if r < 0.7 and rows else "c"
            if op in ("r", "c"):
                i = next_id[table]
                next_id[table] += 1
                rows[i] = _row(rng, i, events)
                emit(table, i, {"before": None, "after": rows[i], "source": {**source, "snapshot": "true" if op == "r" else "false"}, "op": op, "ts_ms": 1})
            elif op == "u":
                i = rng.choice(list(rows)) if len(rows) < 64 else rng.randrange(next_id[table])
                while i not in rows:
                    i = rng.randrange(next_id[table])
                current = rows[i]
                current.update(name=f"name {events}", visits=events % 1000)
                after = dict(current)
                if rng.random() < 0.1:
                    after["bio"] = PLACEHOLDER  # TOASTed and unchanged: not sent
                else:
                    current["bio"] = after["bio"] = f"new biography {events} " * 8
                emit(table, i, {"before": None, "after": after, "source": {**source, "snapshot": "false"}, "op": "u", "ts_ms": 1})
            else:
                i = rng.randrange(next_id[table])
                while i not in rows:
                    i = rng.randrange(next_id[table])
                deleted = rows.pop(i)
                emit(table, i, {"before": deleted, "after": None, "source": {**source, "snapshot": "false"}, "op": "d", "ts_ms": 1})
                emit(table, i, None)  # the tombstone
            events += 1
        files = columns.pop("file")
        batch = pa.table(columns, schema=KAFKA)
        for part in (0, 1):
            path = folder / f"{b:03d}-{part}.parquet"
            pq.write_table(batch.filter(pa.array([f == part for f in files])), path)
            os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
        records_total += len(columns["key"])
    return records_total


# ------------------------------------------------------------------ one side, in its own process


def _tree_cpu_seconds() -> float:
    pids = [os.getpid(), *_descendants(os.getpid())]
    return sum((t[0] if (t := _cpu_ticks(p)) else 0) for p in pids) / CLK_TCK


def run_side(side: str, work: Path) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F


    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_lakesink(spark)
    common = {"warehouse": str(work / "warehouse"), "index_dir": str(work / "index"), "progress": "false", "maintenance": "off"}

    def stream(source: Path, checkpoint: str, namespace: str):  # type: ignore[no-untyped-def]
        df = spark.readStream.schema("key binary, value binary, topic string, partition int, offset long").option("maxFilesPerTrigger", 2).parquet(str(source))
        if side == "debezium":
            writer = df.writeStream.format("lakesink").options(**common, cdc_format="debezium", namespace=namespace)
        else:
            value, key = F.col("value").cast("string"), F.col("key").cast("string")
            parsed = df.where(F.col("value").isNotNull()).select(
                F.get_json_object(value, "$.payload.source.table").alias("tbl"),
                F.get_json_object(value, "$.payload.op").alias("op"),
                F.get_json_object(value, "$.payload.source.lsn").cast("long").alias("lsn"),
                F.get_json_object(value, "$.payload.after").alias("after"),
                F.get_json_object(key, "$.payload").alias("key"),
            )
            writer = parsed.writeStream.format("lakesink").options(
                **common, table_column="tbl", namespace=namespace, payload_column="after", key_column="key", operation="cdc",
                op_column="op", sequence_column="lsn", merge_schema="true",
            )
        return writer.option("checkpointLocation", str(work / "checkpoints" / checkpoint)).trigger(availableNow=True).start()

    warm = stream(work / "warm-source", "warm", "warm")
    warm.awaitTermination()
    cpu0, started = _tree_cpu_seconds(), time.perf_counter()
    query = stream(work / "source", side.replace(" ", "-"), "db")
    query.awaitTermination()
    wall = time.perf_counter() - started
    cpu = _tree_cpu_seconds() - cpu0
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    records = sum(p["numInputRows"] for p in batches)
    spark.stop()
    return {"side": side, "wall_s": wall, "cpu_s": cpu, "batch_ms": [p["durationMs"]["triggerExecution"] for p in batches], "records": records}


def _child(side: str, work: Path) -> dict[str, Any]:
    for folder in ("warehouse", "checkpoints", "index"):
        shutil.rmtree(work / folder, ignore_errors=True)
    out = work / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "benchmarks.debezium", "--side", side, "--work", str(work), "--result", str(out)],
                   check=True, env=env, cwd=PROJECT_ROOT)
    return json.loads(out.read_text())


# ------------------------------------------------------------------ the run


def main(reps: int, out: Path, work: Path = WORKDIR, events: int = EVENTS) -> int:
    shutil.rmtree(work, ignore_errors=True)
    started_gen = time.perf_counter()
    batches = max(1, events // 100_000)
    records = make_events(work / "source", events, batches)
    log(f"{records:,} records ({events:,} change events and their tombstones) in {time.perf_counter() - started_gen:.0f} s")
    make_events(work / "warm-source", 2_000, 1, seed=1)
    probe_before = host_probe()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    sides = ["debezium", "by hand"]
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for rep in range(reps):
        for side in sides[rep % 2:] + sides[: rep % 2]:
            result = _child(side, work)
            log(f"rep {rep}: {side} {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s, {events / result['wall_s']:,.0f} events/s")
            results[side].append(result)
    report = {"started": started, "ended": time.strftime("%Y-%m-%d %H:%M:%S"), "host_before": probe_before, "host_after": host_probe(),
              "reps": reps, "events": events, "records": records, "batches": batches, "results": results}
    out.mkdir(parents=True, exist_ok=True)
    (out / "debezium.json").write_text(json.dumps(report, indent=1))
    (out / "DEBEZIUM.md").write_text(render(report))
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out / 'DEBEZIUM.md'}")
    return 0


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def render(report: dict[str, Any]) -> str:
    events = report["events"]
    lines = [f"# Debezium's change stream ({report['started']} to {report['ended']}, local[2], {report['reps']} runs per side)", "",
             f"{events:,} change events of 20 PostgreSQL tables ({report['records']:,} Kafka records with the tombstones), "
             f"JsonConverter with schemas, {report['batches']} micro-batches of {events // report['batches']:,} events.", "",
             f"Host probe before/after: {report['host_before']} / {report['host_after']}", "",
             "| side | wall s | mean micro-batch ms | CPU s | events/s | events/s per core |", "|---|---|---|---|---|---|"]
    rates: dict[str, list[float]] = {}
    for side, runs in report["results"].items():
        rates[side] = [events / r["wall_s"] for r in runs]
        lines.append(
            f"| {side} | {_spread([r['wall_s'] for r in runs], 1)} | {_spread([statistics.fmean(r['batch_ms']) for r in runs], 0)} | "
            f"{_spread([r['cpu_s'] for r in runs], 1)} | {_spread(rates[side], 0)} | {_spread([x / 2 for x in rates[side]], 0)} |"
        )
    ratios = [d / h for d, h in zip(rates["debezium"], rates["by hand"])]
    lines += ["", f"cdc_format=debezium / by hand, events per second: **{statistics.median(ratios):.2f}x** "
              f"(runs {', '.join(f'{x:.2f}' for x in ratios)}; target at least 2x). Each figure: median (min-max) over the runs.", ""]
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks debezium")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", help="where DEBEZIUM.md and debezium.json go (default ./benchmark-results/)")
    parser.add_argument("--workdir", default=str(WORKDIR), help=f"where the tables go (default {WORKDIR}); emptied first")
    parser.add_argument("--events", type=int, default=EVENTS, help="change events in all (default 1M)")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        result = run_side(args.side, Path(args.work))
        Path(args.result).write_text(json.dumps(result))
        return 0
    return main(args.reps, Path(args.out).resolve() if args.out else OUT_DIR, Path(args.workdir).resolve(), args.events)


if __name__ == "__main__":
    sys.exit(cli())
