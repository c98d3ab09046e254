"""Benchmark-only hook, imported by every Python process Spark starts for the benchmark.

`python -m benchmarks` puts this directory on PYTHONPATH (only in the environment the
JVM and its Python workers inherit, never in the benchmark's own process) and sets
LAKESINK_BENCH_LOG. The hook then sends the `lakesink` logger's INFO records to that file,
one JSON object per line: a record's `lakesink_event` fields (a commit's rows, files,
bytes and per-phase seconds; a compaction's seconds) where it has them, else its message,
so the benchmark reads the sink's own timings as data, without changing the code it
measures. Without LAKESINK_BENCH_LOG it does nothing.
"""

import os

_path = os.environ.get("LAKESINK_BENCH_LOG")
if _path:
    import json
    import logging

    class _JsonLines(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            fields = getattr(record, "lakesink_event", None) or {"message": record.getMessage()}
            return json.dumps({"created": record.created, "pid": record.process, **fields})

    _handler = logging.FileHandler(_path, mode="a", delay=True)  # O_APPEND: one line per record
    _handler.setFormatter(_JsonLines())
    _logger = logging.getLogger("lakesink")
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False

# With LAKESINK_BENCH_GC_LOG set, every full collection (generation 2) of a worker is logged
# with its duration and the objects it walked: pyspark's daemon runs one after every task,
# plan and commit of a reused worker, so this is where growing Python state shows up.
_gc_path = os.environ.get("LAKESINK_BENCH_GC_LOG")
if _gc_path:
    import gc
    import time

    _gc_started = [0.0]

    def _gc_timer(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            _gc_started[0] = time.perf_counter()
            return
        took = time.perf_counter() - _gc_started[0]
        assert _gc_path is not None
        with open(_gc_path, "a") as fh:
            fh.write(f"{time.time():.3f} {os.getpid()} {took * 1000:.2f} {len(gc.get_objects(generation=2))}\n")

    gc.callbacks.append(_gc_timer)
