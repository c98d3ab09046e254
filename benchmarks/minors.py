"""lakesink on every supported PySpark minor beside dropping sinks: `python -m benchmarks minors`.

On each minor (scripts/spark_minors.sh), in a process of its own with that minor's venv (the
newest is `.venv`, the others `scripts/compat_venv.sh MINOR`), one `local[2]` session runs
streams over a folder of Parquet files, one file per micro-batch (`maxFilesPerTrigger=1`,
`trigger(availableNow=True)`), rows of (id, ts, cat, amount, name), into each side in turn:

- `drop-rows`: a row stream sink that drops every Row (`DataSourceStreamWriter`): the floor of
  a row-based Python stream sink, the only kind PySpark 4.0 has;
- `drop-arrow`: the Arrow stream sink that drops every batch (`null_stream`), on 4.1 and newer
  (4.0 has no `DataSourceStreamArrowWriter`);
- `drop-foreach`: `foreachBatch` writing each micro-batch to a batch Arrow sink that drops it
  (`noop_python`): the floor of the `foreachBatch` route;
- `lakesink`: `writeStream.format("lakesink")` (on 4.0 through its row writer);
- `lakesink-foreach`: `foreachBatch(batch_sink(...))`, Arrow on every minor.

Both lakesink sides use maintenance=off (the figures are about the write path) and a fresh
table per run. Cases: appends of 5 x 1M and 30 x 10K rows, and upserts of 5 x 1M (each batch
after the first updates half its rows' keys among earlier batches' and inserts the rest; the
dropping sides see the same rows). Per minor, case and side: the median wall time of the query
over `--reps` runs (sides interleaved, each rep in a rotated order, after a warm-up), its
spread and rows/s; the dropping sides' time over lakesink's (1.00 = at the floor) and each
side's time against the same side on the newest minor. Writes MINORS.md and minors.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT_DIR, PROJECT_ROOT, host_probe, log, stream_session, worker_environment

WORKDIR = Path("/tmp/lakesink-minors")
SIDES = ("drop-rows", "drop-arrow", "drop-foreach", "lakesink", "lakesink-foreach")
LAKESINK_SIDES = ("lakesink", "lakesink-foreach")
# (lakesink side, the floor it is read against): the ratio is floor time / lakesink time.
RATIOS = (("lakesink", "drop-rows"), ("lakesink", "drop-arrow"), ("lakesink-foreach", "drop-foreach"))
# The targets, printed beside the ratios (not asserted): (minor, side, floor) -> ratio.
TARGETS = {("4.0", "lakesink-foreach", "drop-foreach"): 0.75, ("4.0", "lakesink", "drop-rows"): 0.75}
TABLE = "bench.events"
TXN_APP_ID = "minors-bench"
QUICK_DIVISOR = 10
MEMORY_GIB = 8


@dataclass(frozen=True)
class Case:
    operation: str  # append or upsert
    batches: int
    rows: int  # per micro-batch

    @property
    def name(self) -> str:
        return f"{self.operation} {self.batches} x {_short(self.rows)}"

    @property
    def table_rows(self) -> int:
        """Rows of the lakesink table after the stream: each upsert batch after the first adds
        only its inserted half."""
        if self.operation == "append":
            return self.batches * self.rows
        return self.rows + (self.batches - 1) * (self.rows - self.rows // 2)


CASES = (Case("append", 5, 1_000_000), Case("append", 30, 10_000), Case("upsert", 5, 1_000_000))
# Not reported: the first streams of a session (Spark's, the workers' imports, the keyed path's).
WARM_CASES = (Case("append", 3, 10_000), Case("upsert", 3, 10_000))


def _short(rows: int) -> str:
    return f"{rows // 1_000_000}M" if rows % 1_000_000 == 0 else f"{rows // 1000}K" if rows % 1000 == 0 else str(rows)


# --------------------------------------------------------------------------- parent: venvs and data


def supported_minors() -> list[str]:
    done = subprocess.run(["bash", str(PROJECT_ROOT / "scripts/spark_minors.sh")], capture_output=True, text=True, check=True)
    return done.stdout.split()


def venv_python(minor: str, newest: str) -> Path:
    """The newest minor is the project's own venv; the others come from compat_venv.sh, which
    makes the venv on a fresh machine and reuses (and refreshes) it on later runs."""
    if minor == newest:
        return PROJECT_ROOT / ".venv/bin/python"
    done = subprocess.run(["bash", str(PROJECT_ROOT / "scripts/compat_venv.sh"), minor], cwd=PROJECT_ROOT,
                          stdout=subprocess.PIPE, text=True)
    existing = PROJECT_ROOT / f".venv-spark{minor}/bin/python"
    if done.returncode != 0:
        if not existing.exists():
            raise RuntimeError(f"scripts/compat_venv.sh {minor} failed ({done.returncode}) and there is no {existing}")
        # Offline, pip cannot refresh the venv: the one already there still measures its minor.
        log(f"scripts/compat_venv.sh {minor} failed ({done.returncode}); using the existing {existing}")
        return existing
    return PROJECT_ROOT / done.stdout.strip().splitlines()[-1] / "bin/python"


def make_sources(workdir: Path, cases: tuple[Case, ...]) -> dict[str, Path]:
    """stream-append's files for the appends; an upsert case gets the same files with its ids
    replaced by keys that update earlier batches' rows."""
    from benchmarks import stream_append

    sources: dict[str, Path] = {}
    for case in cases:
        base = stream_append.make_source(workdir, stream_append.Case(case.name, case.batches, case.rows))
        sources[case.name] = base if case.operation == "append" else _keyed_copy(base, workdir / f"upsert-{case.batches}x{case.rows}")
    return sources


def _keyed_copy(base: Path, folder: Path) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if folder.exists():
        return folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(47)
    for batch, path in enumerate(sorted(base.glob("*.parquet"))):
        table = pq.read_table(path)
        ids = upsert_ids(batch, table.num_rows, rng)
        table = table.set_column(table.schema.get_field_index("id"), "id", pa.array(ids, pa.int64()))
        pq.write_table(table, folder / path.name, compression="snappy")
    return folder


def upsert_ids(batch: int, rows: int, rng: Any) -> Any:
    """Batch 0 inserts keys 0..rows-1; every later one updates rows // 2 distinct keys drawn from
    all earlier batches' and inserts the rest as new keys, shuffled so both tasks get both."""
    import numpy as np

    if batch == 0:
        return np.arange(rows, dtype=np.int64)
    known = rows + (batch - 1) * (rows - rows // 2)
    updates = rng.choice(known, rows // 2, replace=False)
    inserts = np.arange(known, known + rows - rows // 2, dtype=np.int64)
    ids = np.concatenate([updates.astype(np.int64), inserts])
    rng.shuffle(ids)
    return ids


# --------------------------------------------------------------------------- parent: the run


def main(minors: list[str] | None = None, reps: int = 3, quick: bool = False, out: Path = OUT_DIR,
         workdir: Path = WORKDIR) -> int:
    supported = supported_minors()
    chosen = [m for m in supported if minors is None or m in minors]
    unknown = sorted(set(minors or ()) - set(supported))
    if unknown or not chosen:
        log(f"minors: {', '.join(unknown) or 'none chosen'} not among the supported {', '.join(supported)}")
        return 2
    reps = 1 if quick else reps
    cases = tuple(_scaled(c, quick) for c in CASES)
    started = time.perf_counter()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "quick": quick, "reps": reps, "reference": supported[-1],
                               "cases": [asdict(c) | {"name": c.name} for c in cases], "host_probe": {"start": host_probe()},
                               "load_avg": {"start": os.getloadavg()[0]}, "minors": {}}
    try:
        sources = make_sources(workdir, cases + WARM_CASES)
        if not quick:
            from benchmarks.stream_append import touch_memory

            log(f"touching memory: {touch_memory(MEMORY_GIB):.1f} s for {MEMORY_GIB} GiB")
        for minor in chosen:
            spec = {"minor": minor, "reps": reps, "workdir": str(workdir / f"spark{minor}"),
                    "cases": [_case_spec(c, sources) for c in cases], "warm": [_case_spec(c, sources) for c in WARM_CASES]}
            results["minors"][minor] = run_minor_process(minor, supported[-1], spec, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["host_probe"]["end"] = host_probe()
    results["load_avg"]["end"] = os.getloadavg()[0]
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "minors.json").write_text(json.dumps(results, indent=2))
    (out / "MINORS.md").write_text(render(results))
    log(f"wrote {out / 'MINORS.md'} in {results['total_seconds'] / 60:.1f} min")
    return 0


def _scaled(case: Case, quick: bool) -> Case:
    return Case(case.operation, case.batches, case.rows // QUICK_DIVISOR) if quick else case


def _case_spec(case: Case, sources: dict[str, Path]) -> dict[str, Any]:
    return asdict(case) | {"name": case.name, "source": str(sources[case.name]), "table_rows": case.table_rows}


def run_minor_process(minor: str, newest: str, spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One minor's sides in a process of its own with that minor's venv: the JSON it writes,
    or why it has none."""
    started = time.perf_counter()
    try:
        python = venv_python(minor, newest)
    except RuntimeError as exc:
        return {"error": str(exc)}
    spec_path, result_path = workdir / f"spec-{minor}.json", workdir / f"result-{minor}.json"
    spec_path.write_text(json.dumps(spec))
    # The child's PySpark is its venv's: nothing of this process's Spark set-up may leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(PROJECT_ROOT)  # `benchmarks` (lakesink is installed in every venv)
    log(f"PySpark {minor}: {python}")
    done = subprocess.run([str(python), "-m", "benchmarks.minors", "--one-minor", minor, "--spec", str(spec_path),
                           "--result", str(result_path)], cwd=workdir, env=env)
    seconds = round(time.perf_counter() - started, 1)
    log(f"PySpark {minor}: {seconds:.0f} s")
    if done.returncode != 0 or not result_path.exists():
        return {"error": f"the {minor} process failed (exit {done.returncode}; its log is above)", "seconds": seconds}
    result = dict(json.loads(result_path.read_text()))
    if not result["versions"]["pyspark"].startswith(f"{minor}."):
        result["error"] = f"{python} has PySpark {result['versions']['pyspark']}, not {minor}"
    return result | {"python": str(python), "seconds": seconds}


# --------------------------------------------------------------------------- child: one minor


def run_minor(spec: dict[str, Any]) -> dict[str, Any]:
    """Every case's sides on this process's PySpark, in one session."""
    workdir = Path(spec["workdir"])
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    worker_environment(workdir / "events.jsonl")  # the workers run this venv's Python, find `benchmarks`
    sides, skipped = available_sides()
    spark = _spark(workdir)
    try:
        for case in spec["warm"]:
            for side in sides:
                try:
                    _run_logged(spark, side, case, workdir / "run", "warm-up")
                except Exception:  # noqa: BLE001 - logged; the timed runs record the side's failure
                    pass
        cases = {case["name"]: run_case(spark, sides, case, spec["reps"], workdir) for case in spec["cases"]}
        versions = _versions(spark)
    finally:
        spark.stop()
    return {"versions": versions, "sides": sides, "skipped": skipped, "cases": cases}


def available_sides() -> tuple[list[str], dict[str, str]]:
    from benchmarks.stream_sinks import STREAM_ARROW

    if STREAM_ARROW:
        return list(SIDES), {}
    return [s for s in SIDES if s != "drop-arrow"], {"drop-arrow": "not run: this PySpark has no DataSourceStreamArrowWriter"}


def _spark(workdir: Path) -> Any:
    from benchmarks.noop_sink import NoopPythonSink
    from benchmarks.stream_sinks import STREAM_ARROW, DropRowsStreamSink, NullStreamSink
    from lakesink_datasource import LakeSinkDataSource

    sources = (LakeSinkDataSource, DropRowsStreamSink, NoopPythonSink) + ((NullStreamSink,) if STREAM_ARROW else ())
    return stream_session("minors", sources, workdir / "spark-warehouse")


def run_case(spark: Any, sides: list[str], case: dict[str, Any], reps: int, workdir: Path) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    first: dict[str, list[float]] = {side: [] for side in sides}
    errors: dict[str, list[str]] = {}
    for rep in range(reps):
        order = sides[rep % len(sides):] + sides[:rep % len(sides)]
        for side in order:
            try:
                r = _run_logged(spark, side, case, workdir / "run", f"rep {rep}")
            except Exception as exc:  # noqa: BLE001 - reported in MINORS.md, the other sides go on
                errors.setdefault(side, []).append(f"{type(exc).__name__}: {str(exc)[:300]}")
                continue
            seconds[side].append(r["seconds"])
            first[side].append(r["first_batch_s"])
    return {"seconds": seconds, "first_batch_s": first, "errors": errors}


def _run_logged(spark: Any, side: str, case: dict[str, Any], work: Path, tag: str) -> dict[str, Any]:
    try:
        r = run_side(spark, side, case, work)
    except Exception as exc:
        log(f"  {case['name']} {tag}: {side} FAILED {type(exc).__name__}: {str(exc)[:300]}")
        raise
    log(f"  {case['name']} {tag}: {side} {r['seconds']:.2f} s")
    return r


def run_side(spark: Any, side: str, case: dict[str, Any], work: Path) -> dict[str, Any]:
    """One stream over the case's whole folder into `side`, in a fresh directory (checkpoint,
    table, key index); the query's wall time from its start to its end."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = Path(case["source"])
    schema = from_arrow_schema(pq.read_schema(next(source.glob("*.parquet"))))
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
    writer = _into(stream.writeStream.trigger(availableNow=True).option("checkpointLocation", str(work / "checkpoint")),
                   side, case, work)
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    _check(side, case, progress, work)
    return {"seconds": seconds, "first_batch_s": progress[0].durationMs.get("triggerExecution", 0) / 1000}


def _into(writer: Any, side: str, case: dict[str, Any], work: Path) -> Any:
    from lakesink_datasource import batch_sink

    if side == "drop-rows":
        return writer.format("drop_rows_stream")
    if side == "drop-arrow":
        return writer.format("null_stream")
    if side == "drop-foreach":
        return writer.foreachBatch(_drop_batch)
    options = _lakesink_options(case, work)
    if side == "lakesink":
        return writer.format("lakesink").option("table", TABLE).options(**options)
    if side == "lakesink-foreach":
        return writer.foreachBatch(batch_sink(TABLE, TXN_APP_ID, **options))
    raise ValueError(side)


def _drop_batch(df: Any, batch_id: int) -> None:
    df.write.format("noop_python").mode("append").save()


def _lakesink_options(case: dict[str, Any], work: Path) -> dict[str, str]:
    # progress off: a console line per micro-batch is the user's choice, not the write path.
    options = {"warehouse": str(work / "warehouse"), "maintenance": "off", "progress": "false"}
    if case["operation"] == "upsert":
        options |= {"operation": "upsert", "primary_key": "id", "index_dir": str(work / "index")}
    return options


def _check(side: str, case: dict[str, Any], progress: list[Any], work: Path) -> None:
    """Every micro-batch ran with all its rows, and a lakesink table holds what it should:
    a fast run that lost rows must not count. Outside the timed region."""
    rows = sum(p.numInputRows for p in progress)
    if len(progress) != case["batches"] or rows != case["batches"] * case["rows"]:
        raise RuntimeError(f"{side}: {len(progress)} micro-batches of {rows} rows in all, expected {case['batches']} x {case['rows']}")
    if side in LAKESINK_SIDES:
        found = live_rows(work / "warehouse")
        if found != case["table_rows"]:
            raise RuntimeError(f"{side}: the table holds {found} rows, expected {case['table_rows']}")


def live_rows(warehouse: Path) -> int:
    """The table's rows less those its deletes hide (an upsert's updates), from the current
    snapshot's summary totals."""
    from pyiceberg.catalog.sql import SqlCatalog

    import lakesink_datasource  # noqa: F401  (v3 metadata support for pyiceberg)

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    try:
        snapshot = catalog.load_table(TABLE).metadata.current_snapshot()
    finally:
        catalog.engine.dispose()
    totals = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary is not None else {}
    return int(totals.get("total-records", 0)) - int(totals.get("total-position-deletes", 0)) - int(totals.get("total-equality-deletes", 0))


def _versions(spark: Any) -> dict[str, str]:
    import pyarrow
    import pyspark

    return {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "python": platform.python_version(),
            "java": str(spark.sparkContext._jvm.System.getProperty("java.version"))}


# --------------------------------------------------------------------------- report


def summary(runs: list[float], rows: int) -> dict[str, float] | None:
    if not runs:
        return None
    median = statistics.median(runs)
    return {"median_s": median, "min_s": min(runs), "max_s": max(runs), "rows_per_s": rows / median}


def _median(result: dict[str, Any], case: str, side: str) -> float | None:
    runs = result.get("cases", {}).get(case, {}).get("seconds", {}).get(side)
    return statistics.median(runs) if runs else None


def render(results: dict[str, Any]) -> str:
    ref = results["reference"]
    lines = [
        "# lakesink on every supported PySpark minor",
        "",
        f"`python -m benchmarks minors{' --quick' if results['quick'] else ''}` (benchmarks/minors.py), {results['date']}"
        + (f", quick: sizes / {QUICK_DIVISOR}, 1 rep, not figures to cite" if results["quick"] else "") + ".",
        "Each minor runs in a process of its own with its own venv: one `local[2]` session, a warm-up, then every case's",
        "sides interleaved (each rep in a rotated order). A stream reads a folder of Parquet files, one per micro-batch",
        "(`maxFilesPerTrigger=1`, `trigger(availableNow=True)`); lakesink with maintenance=off, a fresh table per run.",
        f"Medians of {results['reps']} run(s). `time vs {ref}`: the side's time over the same side's on {ref} (above 1 = slower).",
        "Ratios: the dropping sink's time over lakesink's (1.00 = at the floor of that kind of Python sink).",
        "",
        "Sides: `drop-rows` a row stream sink (`DataSourceStreamWriter`) dropping every Row; `drop-arrow` the Arrow stream",
        "sink (`DataSourceStreamArrowWriter`, 4.1 and newer) dropping every batch; `drop-foreach` `foreachBatch` into a",
        "batch Arrow sink (`DataSourceArrowWriter`) dropping every batch; `lakesink` `writeStream.format(\"lakesink\")`",
        "(on 4.0 through its row writer); `lakesink-foreach` `foreachBatch(batch_sink(...))`.",
        "",
    ]
    failed = {m: r["error"] for m, r in results["minors"].items() if r.get("error")}
    lines += [f"- **{m}**: {e}" for m, e in failed.items()] + ([""] if failed else [])
    for case in results["cases"]:
        lines += _case_tables(results, case, ref)
    lines += _environment(results)
    return "\n".join(lines)


def _case_tables(results: dict[str, Any], case: dict[str, Any], ref: str) -> list[str]:
    name, rows = case["name"], case["batches"] * case["rows"]
    what = "upserts (half the keys of each batch after the first update earlier rows)" if case["operation"] == "upsert" else "appends"
    lines = [f"## {name}: {case['batches']} micro-batches of {case['rows']:,} rows, {what}", "",
             f"| minor | side | seconds (median) | min-max | rows/s | first micro-batch, s | time vs {ref} |",
             "|---|---|---|---|---|---|---|"]
    minors = results["minors"]
    for minor, result in minors.items():
        if result.get("error") and "cases" not in result:
            continue
        for side in SIDES:
            lines.append(_side_row(result, minor, side, name, rows, minors.get(ref)))
    lines += ["", "| minor | " + " | ".join(f"`{s}` vs `{f}`" for s, f in RATIOS)
              + " | " + " | ".join(f"`{s}` time vs {ref}" for s in LAKESINK_SIDES) + " |",
              "|---" * (1 + len(RATIOS) + len(LAKESINK_SIDES)) + "|"]
    for minor, result in minors.items():
        if "cases" not in result:
            continue
        ratios = [_ratio_cell(result, minor, name, side, floor) for side, floor in RATIOS]
        against = [_against_ref(result, minors.get(ref), name, side) for side in LAKESINK_SIDES]
        lines.append(f"| {minor} | " + " | ".join(ratios + against) + " |")
    if case["operation"] == "upsert":
        lines += ["", "No target here: an upsert does the key index's work (lookups, deletion vectors), which no dropping "
                  "sink does; read these ratios across minors, and the `time vs` columns."]
    return [*lines, ""]


def _side_row(result: dict[str, Any], minor: str, side: str, case: str, rows: int, ref: dict[str, Any] | None) -> str:
    if side in result.get("skipped", {}):
        return f"| {minor} | {side} | {result['skipped'][side]} | | | | |"
    data = result["cases"][case]
    s = summary(data["seconds"].get(side, []), rows)
    if s is None:
        return f"| {minor} | {side} | failed: {'; '.join(data['errors'].get(side, ['no runs']))[:200]} | | | | |"
    firsts = data["first_batch_s"].get(side) or []
    return (f"| {minor} | {side} | {s['median_s']:.2f} | {s['min_s']:.2f}-{s['max_s']:.2f} | {s['rows_per_s']:,.0f} "
            f"| {statistics.median(firsts):.2f} | {_against_ref(result, ref, case, side)} |")


def _ratio_cell(result: dict[str, Any], minor: str, case: str, side: str, floor: str) -> str:
    if floor in result.get("skipped", {}):
        return "not run (no Arrow stream writer)"
    lake, drop = _median(result, case, side), _median(result, case, floor)
    if lake is None or drop is None:
        return "n/a"
    cell = f"{drop / lake:.2f}"
    # The targets bound a sink's own overhead, read on appends: an upsert does the key index's
    # work, which no dropping sink does.
    target = TARGETS.get((minor, side, floor)) if case.startswith("append") else None
    if target is not None:
        cell += f" (target >= {target}: {'met' if drop / lake >= target else 'below'})"
    return cell


def _against_ref(result: dict[str, Any], ref: dict[str, Any] | None, case: str, side: str) -> str:
    mine = _median(result, case, side)
    theirs = _median(ref, case, side) if ref else None
    return f"{mine / theirs:.2f}" if mine is not None and theirs is not None else ""


def _environment(results: dict[str, Any]) -> list[str]:
    lines = ["## Versions and host", "", "| minor | pyspark | pyarrow | python | java | process, s |", "|---|---|---|---|---|---|"]
    for minor, result in results["minors"].items():
        v = result.get("versions", {})
        lines.append(f"| {minor} | {v.get('pyspark', '')} | {v.get('pyarrow', '')} | {v.get('python', '')} | {v.get('java', '')} "
                     f"| {result.get('seconds', '')} |")
    probe = results["host_probe"]
    lines += ["", f"Host: {os.cpu_count()} cores, {platform.machine()}; load average {results['load_avg']['start']:.2f} at the start, "
              f"{results['load_avg']['end']:.2f} at the end.",
              "Host probe (a fixed pure-Python loop, s: alone / two at once / share of two cores the pair got): "
              + "; ".join(f"{when} {p['alone_s']} / {p['pair_s']} / {p['two_core_share']}" for when, p in probe.items()) + ".",
              f"Total {results['total_seconds'] / 60:.1f} min.", ""]
    return lines


# --------------------------------------------------------------------------- entry points


def main_args(minors: str | None, reps: int, quick: bool, out: str | None, workdir: str | None) -> int:
    return main(minors=minors.split(",") if minors else None, reps=reps, quick=quick,
                out=Path(out).resolve() if out else OUT_DIR, workdir=Path(workdir).resolve() if workdir else WORKDIR)


def _child(argv: list[str]) -> int:
    """`python -m benchmarks.minors --one-minor MINOR --spec FILE --result FILE`: one minor's
    runs in this process (its venv's Python), JSON into the result file."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.minors")
    parser.add_argument("--one-minor", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text())
    if spec["minor"] != args.one_minor:
        parser.error(f"the spec is for PySpark {spec['minor']}, not {args.one_minor}")
    result = run_minor(spec)
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
