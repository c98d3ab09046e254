"""Command line: `python -m benchmarks run [--quick] ...`, `python -m benchmarks profile append`, `... list`."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path


def _run(args: argparse.Namespace) -> int:
    from benchmarks import harness, report, scenarios

    config = harness.BenchConfig.for_mode(
        args.quick,
        rows=args.rows,
        reps=args.reps,
        warmup=args.warmup,
        scenarios=args.scenarios.split(",") if args.scenarios else None,
        workdir=Path(args.workdir).resolve() if args.workdir else None,
        out_dir=Path(args.out).resolve() if args.out else None,
        keep_outputs=args.keep or None,
        spark_conf=dict(c.split("=", 1) for c in args.conf) if args.conf else None,
    )
    chosen = scenarios.select(config.scenarios)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    probe_start = harness.host_probe()
    shutil.rmtree(config.workdir, ignore_errors=True)
    config.workdir.mkdir(parents=True)
    phase_log = harness.PhaseLog(config.workdir / "lakesink-phases.log")
    harness.worker_environment(phase_log.path)
    harness.log(f"{'quick' if config.quick else 'full'} run: {config.rows:,} rows, {config.warmup} warm-up + {config.reps} reps, "
                f"scenarios {', '.join(s.id for s in chosen)}; workdir {config.workdir}")
    spark = harness.start_spark(config)
    rss = harness.RssSampler()
    rss.start()
    ctx = harness.BenchContext(config=config, spark=spark, rss=rss, phases=phase_log)
    try:
        t0 = time.perf_counter()
        ctx.data = harness.generate_data(spark, config.rows).cache()
        assert ctx.data.count() == config.rows
        data_seconds = time.perf_counter() - t0
        ctx.bytes_per_row = harness.arrow_bytes_per_row(ctx.data)
        harness.log(f"data cached in {data_seconds:.1f} s, {ctx.bytes_per_row:.1f} Arrow bytes/row")
        env = report.environment(spark)
        results_list = []
        for sc in chosen:
            harness.log(f"scenario {sc.id}: {sc.title}")
            results_list.append(sc.run(ctx))
            for t in results_list[-1]["targets"]:
                harness.log(f"  -> {t['name']}: {t['value']} (target {t['op']} {t['target']}) {'PASS' if t['passed'] else 'FAIL'}")
        results = {
            "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(config).items()},
            "environment": env,
            "bytes_per_row": round(ctx.bytes_per_row, 2),
            "data_seconds": round(data_seconds, 2),
            "load_avg_start": load_start,
            "load_avg_end": os.getloadavg()[0],
            "host_probe_start": probe_start,
            "host_probe_end": harness.host_probe(),
            "total_seconds": round(time.perf_counter() - started, 1),
            "hwm_reset_ok": rss._reset_ok,
            "scenarios": results_list,
        }
        for path in report.write_all(results, config.out_dir):
            harness.log(f"wrote {path}")
    finally:
        rss.stop()
        spark.stop()
        if not config.keep_outputs:
            shutil.rmtree(config.workdir, ignore_errors=True)
    harness.log(f"done in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


def _stream_append(args: argparse.Namespace) -> int:
    from benchmarks import stream_append
    from benchmarks.harness import OUT_DIR

    stream_append.EXTRA.update(dict(o.split("=", 1) for o in args.lakesink_option))
    return stream_append.main(reps=args.reps, java=not args.no_java, out=Path(args.out).resolve() if args.out else OUT_DIR,
                              fresh=args.fresh, long=args.long)


def _report(args: argparse.Namespace) -> int:
    """Rebuild RESULTS.md and results.png from a results.json (no benchmark is run)."""
    import json

    from benchmarks import harness, report

    source = Path(args.json).resolve() if args.json else harness.RESULTS_DIR / "results.json"
    results = json.loads(source.read_text())
    for path in report.write_all(results, Path(args.out).resolve() if args.out else source.parent):
        harness.log(f"wrote {path}")
    return 0


def _slow_trigger(args: argparse.Namespace) -> int:
    from benchmarks import slow_trigger
    from benchmarks.harness import OUT_DIR

    return slow_trigger.main(args.trigger, args.batches, Path(args.out).resolve() if args.out else OUT_DIR)


def _profile(args: argparse.Namespace) -> int:
    from benchmarks import profiling

    return profiling.main(args)


def _keyed_large(args: argparse.Namespace) -> int:
    from benchmarks import harness, keyed_large

    out = Path(args.out).resolve() if args.out else harness.OUT_DIR
    keyed_large.run(args.rows, args.chunk, args.reps, Path(args.workdir).resolve(), out, with_delta=not args.no_delta)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the scenarios, write RESULTS.md, results.json, results.png")
    run.add_argument("--quick", action="store_true", help="1M rows, 1 warm-up + 3 reps (a few minutes)")
    run.add_argument("--rows", type=int, help="rows of generated data (default 5M, quick 1M)")
    run.add_argument("--reps", type=int, help="timed repetitions per side (default 5, quick 3)")
    run.add_argument("--warmup", type=int, help="warm-up runs per side (default 1)")
    run.add_argument("--scenarios", help="comma-separated ids or names, e.g. 1,2 or append,streaming (default: all)")
    run.add_argument("--workdir", help="scratch directory, deleted first and at the end (default /tmp/lakesink-bench)")
    run.add_argument("--out", help="where RESULTS.md, results.json, results.png go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    run.add_argument("--keep", action="store_true", help="keep the scratch directory and every written table")
    run.add_argument("--conf", action="append", metavar="KEY=VALUE",
                     help="extra Spark setting for the session (repeatable), e.g. spark.sql.execution.arrow.maxRecordsPerBatch=100000")
    run.set_defaults(func=_run)
    prof = sub.add_parser("profile", help="profile lakesink's Python side, write PROFILE.md")
    prof.add_argument("target", choices=["append", "partitioned", "fanout"],
                      help="which scenario's lakesink side to profile (append -> PROFILE.md, others -> PROFILE-<target>.md)")
    prof.add_argument("--rows", type=int, default=5_000_000)
    prof.add_argument("--workdir", default="/tmp/lakesink-bench-profile")
    prof.add_argument("--out", help="where PROFILE.md goes (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    prof.add_argument("--top", type=int, default=25, help="functions listed per table")
    prof.set_defaults(func=_profile)
    rep = sub.add_parser("report", help="rebuild RESULTS.md and results.png from results.json (no run)")
    rep.add_argument("--json", help="results.json to read (default benchmarks/results.json)")
    rep.add_argument("--out", help="output directory (default: the JSON's directory)")
    rep.set_defaults(func=_report)
    long = sub.add_parser("long-stream", help="thousands of upsert micro-batches, maintenance on vs off -> LONG-STREAM.md")
    long.add_argument("--batches", type=int, default=2000, help="micro-batches per side (default 2,000)")
    long.add_argument("--rows-per-batch", type=int, default=2000)
    long.add_argument("--workdir", help="scratch directory (default /tmp/lakesink-long-stream)")
    long.add_argument("--out", help="where LONG-STREAM.md, long_stream.json, long_stream.png go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    long.add_argument("--sides", default="auto,off", help="auto, off or auto,off (default: both)")
    long.set_defaults(func=lambda a: __import__("benchmarks.long_stream", fromlist=["x"]).main_args(
        a.batches, a.rows_per_batch, a.workdir, a.out, a.sides))
    large = sub.add_parser("keyed-large", help="upserts into 1M and into --rows rows (default 100M), with delta-rs -> KEYED-LARGE.md")
    large.add_argument("--rows", type=int, default=100_000_000)
    large.add_argument("--chunk", type=int, default=10_000_000, help="rows per base-building write (default 10M)")
    large.add_argument("--reps", type=int, default=5)
    large.add_argument("--no-delta", action="store_true", help="lakesink alone (no delta-rs side)")
    large.add_argument("--workdir", default="/tmp/lakesink-keyed-large")
    large.add_argument("--out", help="where KEYED-LARGE.md and keyed_large.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    large.set_defaults(func=_keyed_large)
    scale = sub.add_parser("scale-out", help="keyed streams through key shards on a standalone cluster of 1, 2 and 4 workers -> SCALE-OUT.md")
    scale.add_argument("--sizes", default="1000000,10000000", help="table sizes, comma-separated (default 1M,10M)")
    scale.add_argument("--reps", type=int, default=4, help="timed batches per side (default 4)")
    scale.add_argument("--batch-rows", type=int, default=100_000)
    scale.add_argument("--workdir", help="scratch directory (default /tmp/lakesink-scale-out)")
    scale.add_argument("--out", help="where SCALE-OUT.md and scale_out.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    scale.set_defaults(func=lambda a: __import__("benchmarks.scale_out", fromlist=["x"]).main_args(
        a.sizes, a.reps, a.batch_rows, a.workdir, a.out))
    moved = sub.add_parser("shard-moves", help="do key shards stay on their executor? runs on two one-core workers -> SHARD-MOVES.md")
    moved.add_argument("--runs", type=int, default=10, help="runs, each on a new cluster (default 10)")
    moved.add_argument("--workdir", help="scratch directory (default /tmp/lakesink-shard-moves)")
    moved.add_argument("--out", help="where SHARD-MOVES.md and shard_moves.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    moved.set_defaults(func=lambda a: __import__("benchmarks.shard_moves", fromlist=["x"]).main_args(a.runs, a.workdir, a.out))
    red = sub.add_parser("redecide", help="what deciding shared keys at commit costs a keyed batch -> REDECIDE.md")
    red.add_argument("--rows", type=int, default=1_000_000, help="keys in the table (default 1M)")
    red.add_argument("--batch", type=int, default=100_000, help="keys a batch upserts (default 100K)")
    red.add_argument("--reps", type=int, default=6, help="timed rounds (default 6)")
    red.add_argument("--workdir", help="scratch directory (default /tmp/lakesink-redecide)")
    red.add_argument("--out", help="where REDECIDE.md and redecide.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    red.set_defaults(func=lambda a: __import__("benchmarks.redecide_cost", fromlist=["x"]).main_args(a.rows, a.batch, a.reps, a.workdir, a.out))
    req = sub.add_parser("requests", help="S3 requests per batch on SeaweedFS, REST and SQL catalogs -> OBJECT-STORE.md")
    req.add_argument("--batches", type=int, default=8)
    req.add_argument("--rows", type=int, default=10_000)
    req.add_argument("--out", help="where OBJECT-STORE.md and object_store.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    req.set_defaults(func=lambda a: __import__("benchmarks.object_store_requests", fromlist=["x"]).main_args(a.batches, a.rows, a.out))
    sa = sub.add_parser("stream-append", help="streaming appends beside the floor of a Python sink -> STREAM-APPEND.md")
    sa.add_argument("--reps", type=int, default=3, help="runs per sink and case (default 3)")
    sa.add_argument("--no-java", action="store_true", help="without Iceberg Java's sink (Spark 3.5)")
    sa.add_argument("--lakesink-option", action="append", default=[], help="key=value added to both lakesink sides")
    sa.add_argument("--fresh", action="store_true", help="each run in a process of its own (a scheduled availableNow job's cost)")
    sa.add_argument("--long", action="store_true", help="also 200 x 10K and 20 x 1M rows with the defaults: write amplification")
    sa.add_argument("--out", help="where STREAM-APPEND.md and stream_append.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    sa.set_defaults(func=_stream_append)
    mi = sub.add_parser("minors", help="lakesink beside dropping sinks on every supported PySpark minor -> MINORS.md")
    mi.add_argument("--minors", help="comma-separated minors, e.g. 4.0,4.3 (default: every one scripts/spark_minors.sh prints)")
    mi.add_argument("--reps", type=int, default=3, help="runs per minor, case and side (default 3)")
    mi.add_argument("--quick", action="store_true", help="a smoke test: sizes divided by 10, 1 rep")
    mi.add_argument("--workdir", help="scratch directory, deleted first and at the end (default /tmp/lakesink-minors)")
    mi.add_argument("--out", help="where MINORS.md and minors.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    mi.set_defaults(func=lambda a: __import__("benchmarks.minors", fromlist=["x"]).main_args(a.minors, a.reps, a.quick, a.out, a.workdir))
    ro = sub.add_parser("routed", help="one stream routed to many tables against a stream per table -> ROUTED.md")
    ro.add_argument("--reps", type=int, default=3, help="runs per side and case (default 3)")
    ro.add_argument("--cases", default="replicate,wide,thousand", help="comma-separated: replicate, wide, thousand")
    ro.add_argument("--out", help="where ROUTED.md and routed.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    ro.add_argument("--workdir", help="where the tables go (default /tmp/lakesink-routed); emptied first")
    ro.set_defaults(func=lambda a: __import__("benchmarks.routed_tables", fromlist=["x"]).cli(
        ["--reps", str(a.reps), "--cases", a.cases, *(["--out", a.out] if a.out else []),
         *(["--workdir", a.workdir] if a.workdir else [])]))
    dbz = sub.add_parser("debezium", help="a Debezium change stream of 20 tables, cdc_format=debezium against parsing by hand -> DEBEZIUM.md")
    dbz.add_argument("--reps", type=int, default=3)
    dbz.add_argument("--events", type=int, default=1_000_000)
    dbz.add_argument("--out", help="where DEBEZIUM.md and debezium.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    dbz.add_argument("--workdir", help="where the tables go (default /tmp/lakesink-debezium); emptied first")
    dbz.set_defaults(func=lambda a: __import__("benchmarks.debezium", fromlist=["x"]).cli(
        ["--reps", str(a.reps), "--events", str(a.events), *(["--out", a.out] if a.out else []), *(["--workdir", a.workdir] if a.workdir else [])]))
    his = sub.add_parser("history", help="100K upserts into 1M keys with history=true and without -> HISTORY.md")
    his.add_argument("--reps", type=int, default=3)
    his.add_argument("--out", help="where HISTORY.md and history.json go (default ./benchmark-results/; benchmarks/results holds the committed ones)")
    his.add_argument("--workdir", help="where the tables go (default /tmp/lakesink-history); emptied first")
    his.set_defaults(func=lambda a: __import__("benchmarks.history", fromlist=["x"]).cli(
        ["--reps", str(a.reps), *(["--out", a.out] if a.out else []), *(["--workdir", a.workdir] if a.workdir else [])]))
    slow = sub.add_parser("slow-trigger", help="streams triggered a minute apart: each batch re-forks Spark's Python workers -> SLOW-TRIGGER.md")
    slow.add_argument("--trigger", type=int, default=65, help="seconds between batches (Spark closes workers idle for 60 s)")
    slow.add_argument("--batches", type=int, default=11, help="batches per side (the first, a cold start, is reported apart)")
    slow.add_argument("--out", help="where SLOW-TRIGGER.md and slow_trigger.json go (default benchmark-results)")
    slow.set_defaults(func=_slow_trigger)
    lst = sub.add_parser("list", help="list the scenarios")
    lst.set_defaults(func=lambda a: [print(f"{s.id}\t{s.key}\t{s.title}") for s in __import__("benchmarks.scenarios", fromlist=["x"]).SCENARIOS] and 0)
    args = parser.parse_args(argv)
    # `minors` (and the others named) need neither (no plot, no delta-rs) and must run where they are not installed.
    if args.command not in ("list", "minors", "routed", "debezium", "history", "slow-trigger") and (missing := _missing_bench_packages()):
        # Checked before measuring: a run would otherwise fail at its plot or its delta-rs
        # side after many minutes.
        print(f"benchmarks: {', '.join(missing)} not installed; run: .venv/bin/python -m pip install -e '.[bench]'",
              file=sys.stderr)
        return 2
    return int(args.func(args) or 0)


def _missing_bench_packages() -> list[str]:
    import importlib.util

    return [name for name in ("matplotlib", "deltalake") if importlib.util.find_spec(name) is None]


if __name__ == "__main__":
    sys.exit(main())
