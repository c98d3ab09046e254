"""Benchmark-only hook, imported by every Python process Spark starts for the benchmark.

`python -m benchmarks` puts this directory on PYTHONPATH (only in the environment the
JVM and its Python workers inherit, never in the benchmark's own process) and sets
LAKESINK_BENCH_LOG. The hook then sends the `lakesink` logger's INFO lines (one per
committed batch: rows, files, bytes and per-phase seconds) to that file, so the
benchmark reads the sink's own phase timings without changing the code it measures.
Without LAKESINK_BENCH_LOG it does nothing.
"""

import os

_path = os.environ.get("LAKESINK_BENCH_LOG")
if _path:
    import logging

    _handler = logging.FileHandler(_path, mode="a", delay=True)  # O_APPEND: one line per record
    _handler.setFormatter(logging.Formatter("%(created).3f %(process)d %(message)s"))
    _logger = logging.getLogger("lakesink")
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False
