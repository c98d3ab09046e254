"""The benchmark machinery shared by every scenario.

* `BenchConfig` / `BenchContext`: sizes, repetitions, directories and the one SparkSession.
* `worker_environment()`: what the JVM and its Python workers must inherit (set before
  the session starts).
* `generate_data()`: the deterministic input DataFrame (a pure function of `id`, so any
  partitioning of it holds the same rows).
* `RssSampler`: peak resident memory and CPU time of the JVM and Spark's Python processes,
  per measured run.
* `PhaseLog`: the lakesink commit log lines (per-phase seconds) of each measured run.
* `Side` / `measure()`: run two or more ways of doing the same write alternately on the
  same data, warm-up first, and keep every repetition; `summarize()` takes medians.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
HOOKS_DIR = BENCH_DIR / "_worker_hooks"
# Where a run writes its figures unless told (--out): outside the source tree (git ignores
# it). The figures the docs cite are committed in RESULTS_DIR: `--out benchmarks/results`.
OUT_DIR = PROJECT_ROOT / "benchmark-results"
RESULTS_DIR = BENCH_DIR / "results"

SCHEMA_DDL = "id long, cat long, amount double, name string, ts timestamp, flag boolean"
FIRST_DAY_MICROS = 1_767_225_600 * 1_000_000  # 2026-01-01T00:00:00Z
DAYS = 100
CATEGORIES = 1000
PARALLELISM = 2  # local[2]: two task slots


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# A fixed pure-Python loop, timed in fresh interpreters: what this host gives one process and
# two at once, so that runs on different days (a shared host's speed moved 2x between two
# full runs) and scaling figures (two tasks against one) can be read against the host.
_PROBE = "import time; t = time.perf_counter(); x = 0\nfor i in range(5_000_000): x += i\nprint(time.perf_counter() - t)"


def _probe_processes(count: int) -> list[float]:
    import subprocess

    procs = [subprocess.Popen([sys.executable, "-c", _PROBE], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    return [float(p.communicate()[0]) for p in procs]


def host_probe() -> dict[str, float]:
    """Seconds of the probe loop alone (best of 3) and with two running at once (mean of the
    pair, best of 3 pairs), and the share of two cores the pair got (1.0: two full cores)."""
    alone = min(_probe_processes(1)[0] for _ in range(3))
    pair = min(statistics.fmean(_probe_processes(2)) for _ in range(3))
    return {"alone_s": round(alone, 3), "pair_s": round(pair, 3), "two_core_share": round(alone / pair, 2)}


def bytecode_state() -> dict[str, str]:
    """Whether the Python processes Spark starts import compiled code: lakesink's own modules
    (a `.pyc` no older than each source: an editable install under PYTHONDONTWRITEBYTECODE has
    none, and every worker compiles them again) and the `pyspark.zip` Spark puts first on their
    path. A fresh process's figures move by tenths of a second with either."""
    import importlib.util
    import zipfile

    import pyspark

    sources = sorted((PROJECT_ROOT / "lakesink_datasource").rglob("*.py"))
    compiled = 0
    for source in sources:
        cached = Path(importlib.util.cache_from_source(str(source)))
        compiled += cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime
    zip_path = Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip"
    if zip_path.exists():
        with zipfile.ZipFile(zip_path) as archive:
            has_pyc = any(name.endswith(".pyc") for name in archive.namelist())
        zip_state = "with bytecode" if has_pyc else "sources only (Spark's own)"
    else:
        zip_state = "not found"
    return {"lakesink_datasource": f"{compiled} of {len(sources)} modules compiled", "pyspark.zip": zip_state}


def bytecode_sentence(state: dict[str, str]) -> str:
    """`bytecode_state()` as the sentence a results file carries."""
    return "Bytecode the Python workers import: " + "; ".join(f"{k} {v}" for k, v in state.items()) + "."


# --------------------------------------------------------------------------- configuration


@dataclass
class BenchConfig:
    quick: bool = False
    rows: int = 5_000_000
    reps: int = 5
    warmup: int = 1
    scenarios: list[str] | None = None  # None: every registered scenario
    workdir: Path = Path("/tmp/lakesink-bench")
    out_dir: Path = OUT_DIR
    driver_memory: str = "4g"
    stream_files: int = 10
    stream_files_per_trigger: int = 2
    keep_outputs: bool = False
    spark_conf: dict[str, str] = field(default_factory=dict)  # extra --conf settings, e.g. Arrow batch size

    @classmethod
    def for_mode(cls, quick: bool, **overrides: Any) -> BenchConfig:
        base = cls(quick=True, rows=1_000_000, reps=3, warmup=1) if quick else cls()
        for key, value in overrides.items():
            if value is not None:
                setattr(base, key, value)
        return base


def worker_environment(phase_log: Path, extra: dict[str, str] | None = None) -> None:
    """Environment the JVM and every Python worker inherit. Call before the session starts."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Workers import lakesink_datasource from the venv; the project root makes `benchmarks`
    # importable too (the profiling sink), the hooks directory adds the phase-log hook.
    paths = [str(HOOKS_DIR), str(PROJECT_ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ["LAKESINK_BENCH_LOG"] = str(phase_log)
    for key, value in (extra or {}).items():
        os.environ[key] = value


def start_spark(config: BenchConfig, extra_conf: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{PARALLELISM}]")
        .appName("lakesink-benchmarks")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(PARALLELISM))
        .config("spark.default.parallelism", str(PARALLELISM))
        .config("spark.driver.memory", config.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.compression.codec", "zstd")
        .config("spark.sql.warehouse.dir", str(config.workdir / "spark-warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={config.workdir / 'derby'}")
    )
    for key, value in {**config.spark_conf, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from benchmarks.bare_sink import BareParquetSink
    from benchmarks.bare_source import BareParquetSource
    from benchmarks.noop_sink import NoopPythonSink

    register_lakesink(spark)
    spark.dataSource.register(BareParquetSink)  # the floor any Python sink runs against
    spark.dataSource.register(NoopPythonSink)  # Spark's own share of any Python sink's write
    spark.dataSource.register(BareParquetSource)  # and any Python reader
    return spark


# --------------------------------------------------------------------------- data


def stream_session(app_name: str, sources: tuple[Any, ...], warehouse_dir: Path | None = None, conf: dict[str, str] | None = None) -> Any:
    """A warm `local[2]` session of the streaming benchmarks (stream-append, minors), with
    `sources` (Python data sources) registered and `conf` set."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.compression.codec", "zstd")
    )
    if warehouse_dir is not None:
        builder = builder.config("spark.sql.warehouse.dir", str(warehouse_dir))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for source in sources:
        if source.name() == "lakesink":
            register_lakesink(spark)
        else:
            spark.dataSource.register(source)
    return spark


def register_lakesink(spark: Any) -> None:
    """`spark.dataSource.register(LakeSinkDataSource)` where the PySpark minor takes it: 4.0
    refuses to replace a source found by name (pyspark_lakesink), and finds lakesink anyway."""
    from lakesink_datasource import LakeSinkDataSource
    from lakesink_datasource.spark_version import register_replaces_found

    if register_replaces_found():
        spark.dataSource.register(LakeSinkDataSource)


def generate_data(spark, rows: int, partitions: int = PARALLELISM):  # type: ignore[no-untyped-def]
    """`id long, cat long, amount double, name string, ts timestamp, flag boolean`.

    Every column is a hash of `id` (no rand()): the same rows whatever the partitioning,
    so the streaming input files hold exactly the batch scenarios' data.
    - cat: 1000 distinct values (scenario 7's partition column)
    - amount: 0.00 .. 99999.99, two decimals
    - name: 30 characters, e.g. `user_0421337@shop-0042.example`, ~10^6 distinct prefixes
    - ts: uniform over DAYS days from 2026-01-01 (microsecond precision), so every Arrow
      batch touches every day partition
    - flag: about one third true
    """
    from pyspark.sql import functions as F

    def h(seed: int):  # type: ignore[no-untyped-def]
        return F.abs(F.xxhash64(F.col("id"), F.lit(seed)))

    cat = h(1) % CATEGORIES
    return spark.range(0, rows, 1, partitions).select(
        F.col("id"),
        cat.alias("cat"),
        ((h(2) % 10_000_000) / F.lit(100.0)).alias("amount"),
        F.concat(
            F.lit("user_"),
            F.lpad((h(3) % 1_000_000).cast("string"), 7, "0"),
            F.lit("@shop-"),
            F.lpad((cat % 100).cast("string"), 4, "0"),
            F.lit(".example"),
        ).alias("name"),
        F.timestamp_micros(F.lit(FIRST_DAY_MICROS) + h(4) % F.lit(DAYS * 86_400 * 1_000_000)).alias("ts"),
        (h(5) % 3 == 0).alias("flag"),
    )


def arrow_bytes_per_row(df, sample: int = 200_000) -> float:  # type: ignore[no-untyped-def]
    table = df.limit(sample).toArrow()
    return table.nbytes / max(table.num_rows, 1)


# --------------------------------------------------------------------------- memory


def _read_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:", "PPid:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: int) -> tuple[int, int] | None:
    """(utime + stime of a process and all its threads, its start time since boot), in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12]), int(fields[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def _uptime_ticks() -> int:
    with open("/proc/uptime") as fh:
        return int(float(fh.read().split()[0]) * _CLK_TCK)


def _descendants(root: int) -> list[int]:
    parents: dict[int, int | None] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parents[int(entry)] = _ppid(int(entry))
    found, frontier = [], [root]
    while frontier:
        current = frontier.pop()
        for pid, parent in parents.items():
            if parent == current:
                found.append(pid)
                frontier.append(pid)
    return found


@dataclass
class ProcInfo:
    pid: int
    role: str
    cmd: str


def classify(pid: int, cmd: str, parent_cmd: str) -> str | None:
    """Role of one of our Spark processes, or None when it is not one we track.

    Spark's Python processes are `python -m pyspark.daemon <worker module>`: the daemon is
    a child of the JVM and forks the actual workers (same command line). Task workers run
    the data source's write(); `write_into_data_source` plans the write (calls writer()),
    `commit_data_source_write` / `python_streaming_sink_runner` run commit(). Other Spark
    Python helpers (data source lookup/creation) are "other python"; fork servers "daemon".
    """
    if "java" in cmd.split(" ", 1)[0]:
        return "jvm"
    if "pyspark.daemon" not in cmd:
        return None
    module = cmd.rsplit(" ", 1)[-1]
    forked = "pyspark.daemon" in parent_cmd
    short = {
        "pyspark.worker": "task worker",
        "pyspark.sql.worker.write_into_data_source": "write planner",
        "pyspark.sql.worker.commit_data_source_write": "batch commit",
        "pyspark.sql.worker.python_streaming_sink_runner": "stream commit",
    }.get(module, "other python")
    return short if forked else "daemon"


class RssSampler:
    """Peak RSS (VmHWM) and CPU time of the JVM and Spark's Python processes, per measured run.

    Spark reuses its Python workers, so a process's VmHWM alone would carry the peak of
    earlier runs. `begin()` therefore resets VmHWM of every tracked process (writing "5"
    to /proc/<pid>/clear_refs, Linux >= 4.0); processes born during the run start at zero
    anyway. A background thread reads VmHWM of all descendants of the JVM every
    `interval` seconds (so workers that exit mid-run are not lost) and `end()` reads them
    one last time. The figure per process is therefore its true kernel-tracked peak RSS
    within the run, not a sampled RSS that could miss short spikes.

    CPU: utime + stime of the same processes (all threads), from the start of the run to
    their last sample. On a shared machine this is steadier than wall time: it is the work
    done, whatever else competed for the cores. (A worker that exits between two samples
    loses up to `interval` seconds of CPU; Spark's workers are long-lived.)
    """

    def __init__(self, interval: float = 0.2) -> None:
        # One scan of /proc takes ~4 ms here: at 5 Hz the sampler costs ~2% of one core.
        self.interval = interval
        self._lock = threading.Lock()
        self._window: dict[int, dict[str, Any]] | None = None
        self._stop = threading.Event()
        self._jvm: int | None = None
        self._reset_ok: bool | None = None
        self._window_start_ticks = 0
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def start(self) -> None:
        me = os.getpid()
        for pid in _descendants(me):
            if "java" in _cmdline(pid).split(" ", 1)[0]:
                self._jvm = pid
                break
        if self._jvm is None:
            raise RuntimeError("no JVM child process found: start Spark before the sampler")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _tracked(self) -> list[ProcInfo]:
        assert self._jvm is not None
        procs = [ProcInfo(self._jvm, "jvm", "java")]
        cmds = {self._jvm: _cmdline(self._jvm)}
        for pid in _descendants(self._jvm):
            cmds[pid] = _cmdline(pid)
        for pid, cmd in cmds.items():
            if pid == self._jvm:
                continue
            parent = _ppid(pid)
            role = classify(pid, cmd, cmds.get(parent, "") if parent else "")
            if role and role != "jvm":
                procs.append(ProcInfo(pid, role, cmd))
        return procs

    def _sample(self) -> None:
        procs = self._tracked()
        with self._lock:
            if self._window is None:
                return
            for proc in procs:
                status = _read_status(proc.pid)
                if "VmHWM" not in status:
                    continue
                cpu = _cpu_ticks(proc.pid)
                ticks = cpu[0] if cpu else 0
                entry = self._window.get(proc.pid)
                if entry is None:  # first sight in this window: just reset, or born during the run
                    born_during_run = cpu is not None and cpu[1] >= self._window_start_ticks
                    entry = self._window[proc.pid] = {
                        "pid": proc.pid, "role": proc.role, "start_kb": status.get("VmRSS", 0), "peak_kb": 0,
                        "start_ticks": 0 if born_during_run else ticks, "last_ticks": ticks,
                    }
                entry["peak_kb"] = max(entry["peak_kb"], status["VmHWM"])
                entry["last_ticks"] = max(entry["last_ticks"], ticks)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - the sampler must never break a run
                pass

    def begin(self) -> None:
        ok = True
        for proc in self._tracked():
            try:
                with open(f"/proc/{proc.pid}/clear_refs", "w") as fh:
                    fh.write("5")
            except OSError:
                ok = False
        self._reset_ok = ok if self._reset_ok is None else (self._reset_ok and ok)
        with self._lock:
            self._window_start_ticks = _uptime_ticks()
            self._window = {}
        self._sample()

    def end(self) -> dict[str, Any]:
        self._sample()
        with self._lock:
            window, self._window = self._window or {}, None
        procs = sorted(window.values(), key=lambda e: (e["role"], e["pid"]))
        by_role: dict[str, int] = {}
        for entry in procs:
            by_role[entry["role"]] = max(by_role.get(entry["role"], 0), entry["peak_kb"])
        workers = [e["peak_kb"] for e in procs if e["role"] == "task worker"]
        growth = [e["peak_kb"] - e["start_kb"] for e in procs if e["role"] == "task worker"]
        cpu: dict[str, float] = {}
        for e in procs:
            cpu[e["role"]] = cpu.get(e["role"], 0.0) + (e["last_ticks"] - e["start_ticks"]) / _CLK_TCK
        return {
            "cpu_s": round(sum(cpu.values()), 2),
            "cpu_s_by_role": {role: round(v, 2) for role, v in sorted(cpu.items())},
            "peak_task_worker_mb": round(max(workers) / 1024, 1) if workers else None,
            "task_worker_growth_mb": round(max(growth) / 1024, 1) if growth else None,
            "task_worker_start_mb": round(max(e["start_kb"] for e in procs if e["role"] == "task worker") / 1024, 1) if workers else None,
            "task_workers_seen": len(workers),
            "peak_by_role_mb": {role: round(kb / 1024, 1) for role, kb in sorted(by_role.items())},
            "processes": procs,
            "hwm_reset_ok": self._reset_ok,
        }


# --------------------------------------------------------------------------- lakesink phase log

_PHASE_KEYS = ("rows_in", "rows_written", "data_files", "bytes", "partition_s", "index_s", "write_s", "commit_s")


def log_events(text: str) -> list[dict[str, Any]]:
    """The JSON records of a log the worker hook wrote (benchmarks/_worker_hooks)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


class PhaseLog:
    """The sink's log events (JSON lines) written by the worker hook: one per commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        self._offset = 0

    def mark(self) -> None:
        self._offset = self.path.stat().st_size

    def read_new(self) -> dict[str, Any]:
        with open(self.path) as fh:
            fh.seek(self._offset)
            text = fh.read()
        self._offset += len(text.encode())
        totals: dict[str, float] = dict.fromkeys(_PHASE_KEYS, 0.0)
        commits = 0
        for event in log_events(text):
            if event.get("event") != "commit":
                continue
            commits += 1
            for key in _PHASE_KEYS:
                totals[key] += float(event.get(key) or 0)
        out: dict[str, Any] = {"commits": commits}
        for key, value in totals.items():
            out[key] = int(value) if key in ("rows_in", "rows_written", "data_files", "bytes") else round(value, 3)
        return out


# --------------------------------------------------------------------------- output inspection


def parquet_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if p.is_file() and not p.name.startswith((".", "_")))


def inspect_parquet_dir(root: Path) -> dict[str, Any]:
    """Files, bytes and rows of a Spark Parquet output directory (footers only)."""
    import pyarrow.parquet as pq

    files = parquet_files(root)
    sizes = [p.stat().st_size for p in files]
    rows = sum(pq.read_metadata(p).num_rows for p in files)
    return _file_stats(sizes) | {"rows": rows}


def inspect_lakesink(warehouse: Path, identifier: str) -> dict[str, Any]:
    """Files, bytes and rows of a lakesink table, from its snapshot summary and its files."""
    from pyiceberg.catalog.sql import SqlCatalog

    import lakesink_datasource  # noqa: F401  (v3 metadata support for pyiceberg)

    catalog = SqlCatalog("lakesink", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    try:
        table = catalog.load_table(identifier)
        snapshots = table.metadata.snapshots
        current = table.metadata.current_snapshot()
        summary = dict(current.summary.additional_properties) if current and current.summary else {}
        listed = [Path(t.file.file_path.removeprefix("file://")) for t in table.scan().plan_files()]
        metadata_dir = Path(table.location().removeprefix("file://")) / "metadata"
        metadata_bytes = sum(p.stat().st_size for p in metadata_dir.iterdir() if p.is_file())
    finally:
        engine = getattr(catalog, "engine", None)
        if engine is not None:
            engine.dispose()
    sizes = [p.stat().st_size for p in listed]
    return _file_stats(sizes) | {
        "rows": int(summary.get("total-records", -1)),
        "snapshots": len(snapshots),
        "metadata_bytes": metadata_bytes,
        "summary_rows_in": sum(int(s.summary.additional_properties.get("lakesink.rows-in", 0)) for s in snapshots if s.summary),
    }


def _file_stats(sizes: list[int]) -> dict[str, Any]:
    return {
        "files": len(sizes),
        "bytes": sum(sizes),
        "avg_file_bytes": int(sum(sizes) / len(sizes)) if sizes else 0,
        "min_file_bytes": min(sizes) if sizes else 0,
        "max_file_bytes": max(sizes) if sizes else 0,
    }


# --------------------------------------------------------------------------- measuring


@dataclass
class Side:
    """One way of doing a scenario's write. `run` is the only timed call."""

    name: str
    run: Callable[[Path], dict[str, Any] | None]  # gets a fresh, empty directory; may return extra figures
    inspect: Callable[[Path], dict[str, Any]]  # after timing: files, bytes, rows
    is_lakesink: bool = False
    # A side too slow to repeat (Spark's writer at 10,000 partitions takes minutes): at most
    # this many timed runs and no warm-up. None: the run's --reps and --warmup.
    max_reps: int | None = None


@dataclass
class BenchContext:
    config: BenchConfig
    spark: Any
    rss: RssSampler
    phases: PhaseLog
    data: Any = None  # the cached input DataFrame
    bytes_per_row: float = 0.0
    cache: dict[str, Any] = field(default_factory=dict)  # per-session lazily built inputs


def cache_status(spark) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Where Spark's cached input lives: all in memory, or partly evicted to disk."""
    try:
        infos = list(spark.sparkContext._jsc.sc().getRDDStorageInfo())
        return {
            "mem_mb": round(sum(i.memSize() for i in infos) / 2**20, 1),
            "disk_mb": round(sum(i.diskSize() for i in infos) / 2**20, 1),
            "cached_partitions": sum(i.numCachedPartitions() for i in infos),
        }
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return {"error": str(exc)[:200]}


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def run_once(ctx: BenchContext, scenario: str, side: Side, index: int, rows: int, warm: bool) -> dict[str, Any]:
    run_dir = _fresh(ctx.config.workdir / "runs" / f"{scenario}-{side.name}-{index}")
    gc.collect()
    ctx.phases.mark()
    ctx.rss.begin()
    started = time.perf_counter()
    error = None
    extra = None
    try:
        extra = side.run(run_dir)
    except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
        error = f"{type(exc).__name__}: {str(exc)[:500]}"
    seconds = time.perf_counter() - started
    memory = ctx.rss.end()
    record: dict[str, Any] = {
        "side": side.name,
        "index": index,
        "warmup": warm,
        "seconds": round(seconds, 4),
        "rows_per_s": round(rows / seconds, 1),
        "memory": memory,
        "load_avg": os.getloadavg()[0],
    }
    record["cache"] = cache_status(ctx.spark)
    if extra:
        record["extra"] = extra
    if side.is_lakesink:
        record["phases"] = ctx.phases.read_new()
    if error is None:
        try:
            record["output"] = side.inspect(run_dir)
            if record["output"].get("rows") != rows:
                error = f"expected {rows} rows in the output, found {record['output'].get('rows')}"
        except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
            error = f"inspect failed: {type(exc).__name__}: {exc}"
    if error:
        record["error"] = error
    if not ctx.config.keep_outputs:
        shutil.rmtree(run_dir, ignore_errors=True)
    tag = "warm-up" if warm else "rep"
    log(
        f"  {scenario} {side.name:<16} {tag} {index}: {seconds:7.2f} s  {rows / seconds / 1e6:6.3f} M rows/s"
        f"  worker peak {memory['peak_task_worker_mb']} MB" + (f"  ERROR {error}" if error else "")
    )
    return record


def measure(ctx: BenchContext, scenario: str, sides: list[Side], rows: int) -> dict[str, list[dict[str, Any]]]:
    """Warm-up then repetitions; in each round every side runs once, order alternating."""
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in sides}
    total = ctx.config.warmup + ctx.config.reps
    for i in range(total):
        order = sides if i % 2 == 0 else list(reversed(sides))
        warm = i < ctx.config.warmup
        for side in order:
            if side.max_reps is not None and (warm or len(runs[side.name]) >= side.max_reps):
                continue
            runs[side.name].append(run_once(ctx, scenario, side, i, rows, warm=warm))
    return runs


def summarize(records: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """Median (and spread) of the timed repetitions; warm-ups and failed runs excluded."""
    good = [r for r in records if not r["warmup"] and "error" not in r]
    errors = [r["error"] for r in records if "error" in r]
    if not good:
        return {"ok": False, "errors": errors}
    seconds = [r["seconds"] for r in good]
    median_s = statistics.median(seconds)
    out: dict[str, Any] = {
        "ok": True,
        "reps": len(good),
        "median_s": round(median_s, 4),
        "min_s": round(min(seconds), 4),
        "max_s": round(max(seconds), 4),
        "rows_per_s": round(rows / median_s, 1),
        "rows_per_s_min": round(rows / max(seconds), 1),
        "rows_per_s_max": round(rows / min(seconds), 1),
        "errors": errors,
    }
    workers = [r["memory"]["peak_task_worker_mb"] for r in good if r["memory"]["peak_task_worker_mb"] is not None]
    out["peak_task_worker_mb"] = max(workers) if workers else None
    growth = [r["memory"].get("task_worker_growth_mb") for r in good if r["memory"].get("task_worker_growth_mb") is not None]
    out["task_worker_growth_mb"] = max(growth) if growth else None
    out["median_peak_task_worker_mb"] = statistics.median(workers) if workers else None
    roles: dict[str, float] = {}
    for r in good:
        for role, mb in r["memory"]["peak_by_role_mb"].items():
            roles[role] = max(roles.get(role, 0.0), mb)
    out["peak_by_role_mb"] = roles
    out["cache_disk_mb_max"] = max((r.get("cache", {}).get("disk_mb") or 0) for r in good)
    last = good[-1].get("output", {})
    out["output"] = {k: last.get(k) for k in ("files", "bytes", "avg_file_bytes", "min_file_bytes", "max_file_bytes", "rows", "snapshots", "metadata_bytes") if k in last}
    cpu = [r["memory"]["cpu_s"] for r in good if r["memory"].get("cpu_s") is not None]
    if cpu:
        out["median_cpu_s"] = round(statistics.median(cpu), 2)
        out["rows_per_cpu_s"] = round(rows / out["median_cpu_s"], 1) if out["median_cpu_s"] else None
        roles_cpu: dict[str, list[float]] = {}
        for r in good:
            for role, v in r["memory"].get("cpu_s_by_role", {}).items():
                roles_cpu.setdefault(role, []).append(v)
        out["cpu_s_by_role_median"] = {role: round(statistics.median(v), 2) for role, v in roles_cpu.items()}
    starts = [r["memory"].get("task_worker_start_mb") for r in good if r["memory"].get("task_worker_start_mb") is not None]
    out["task_worker_start_mb"] = max(starts) if starts else None
    extras = [r["extra"] for r in good if r.get("extra")]
    if extras:
        numeric = [k for k, v in extras[0].items() if isinstance(v, (int, float))]
        out["extra_median"] = {k: statistics.median(e.get(k, 0) for e in extras) for k in numeric}
    phase_runs = [r["phases"] for r in good if r.get("phases")]
    if phase_runs:
        keys = [k for k in phase_runs[0] if k.endswith("_s")]
        out["phases_median"] = {k: round(statistics.median(p[k] for p in phase_runs), 3) for k in keys}
        out["commits"] = phase_runs[-1]["commits"]
    return out


def tests_module(name: str) -> Any:
    """A helper module of the tests (`tests/<name>.py`), for a benchmark that runs what a test
    runs (the standalone cluster: `tests_module("standalone_cluster").Cluster`)."""
    import importlib

    tests = str(PROJECT_ROOT / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    return importlib.import_module(name)
