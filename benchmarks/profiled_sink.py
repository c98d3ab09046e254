"""A benchmark-only subclass of the lakesink data source that measures its own tasks.

Registered as format `lakesink_profiled` by `python -m benchmarks profile`. It writes
exactly what `lakesink` writes (same plan, same `write_task`, same commit); around each
task's `write()` and the driver's `commit()` it adds, depending on
the mode read from LAKESINK_BENCH_PROFILE_MODE_FILE:

* `time`: wall time of write(), and the time spent waiting for the next Arrow batch from
  the JVM (the input iterator), with no profiler overhead;
* `cprofile`: the same under cProfile, dumping one .prof file per task / commit.

The mode is read at every call from the file LAKESINK_BENCH_PROFILE_MODE_FILE (workers are
reused, so their environment cannot change between writes). Results go to
LAKESINK_BENCH_PROFILE_DIR (one JSON + optional .prof per task). Spark's
Python workers import this module (the benchmark puts the project root on PYTHONPATH).
"""

from __future__ import annotations

import cProfile
import json
import os
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from lakesink_datasource.datasource import LakeSinkBatchWriter, LakeSinkDataSource
from lakesink_datasource.messages import LakeSinkCommitMessage
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write


class TimedIterator:
    """Wraps the Arrow batch iterator; `wait_s` is the time spent inside next()."""

    def __init__(self, inner: Iterator[pa.RecordBatch]) -> None:
        self._inner = iter(inner)
        self.wait_s = 0.0
        self.batches = 0
        self.rows = 0

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> pa.RecordBatch:
        t0 = time.perf_counter()
        try:
            batch = next(self._inner)
        finally:
            self.wait_s += time.perf_counter() - t0
        self.batches += 1
        self.rows += batch.num_rows
        return batch


def _out_dir() -> str:
    path = os.environ["LAKESINK_BENCH_PROFILE_DIR"]
    os.makedirs(path, exist_ok=True)
    return path


def _run(kind: str, fn, extra) -> object:  # type: ignore[no-untyped-def]
    """Run fn (timed, maybe profiled); `extra()` adds fields once fn has returned."""
    mode = "time"
    mode_file = os.environ.get("LAKESINK_BENCH_PROFILE_MODE_FILE")
    if mode_file and os.path.exists(mode_file):
        with open(mode_file) as fh:
            mode = fh.read().strip() or "time"
    tag = f"{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    profiler = cProfile.Profile() if mode == "cprofile" else None
    started = time.time()
    t0 = time.perf_counter()
    c0 = time.process_time()
    if profiler:
        profiler.enable()
    try:
        result = fn()
    finally:
        if profiler:
            profiler.disable()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    out = _out_dir()
    if profiler:
        profiler.dump_stats(os.path.join(out, f"{tag}.prof"))
    record = {"kind": kind, "mode": mode, "pid": os.getpid(), "wall_s": wall, "cpu_s": cpu, "started": started, **extra()}
    if isinstance(result, LakeSinkCommitMessage):
        stats = result.result().stats
        record.update(rows_in=stats.rows_in, partition_s=stats.partition_seconds, write_s=stats.write_seconds, bytes=stats.bytes_written)
    with open(os.path.join(out, f"{tag}.json"), "w") as fh:
        json.dump(record, fh)
    return result


class ProfiledBatchWriter(LakeSinkBatchWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        timed = TimedIterator(iterator)
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else None

        def extra() -> dict:
            return {"partition": partition, "input_wait_s": timed.wait_s, "batches": timed.batches, "rows": timed.rows}

        return _run("task", lambda: LakeSinkBatchWriter.write(self, timed), extra)  # type: ignore[return-value]

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _run("commit", lambda: LakeSinkBatchWriter.commit(self, messages), lambda: {"tasks": len(messages)})


class ProfiledLakeSink(LakeSinkDataSource):
    @classmethod
    def name(cls) -> str:
        return "lakesink_profiled"

    def writer(self, schema: StructType, overwrite: bool) -> ProfiledBatchWriter:
        return _run("plan", lambda: ProfiledBatchWriter(plan_write(parse_options(self.options), schema, overwrite)), dict)  # type: ignore[return-value]
