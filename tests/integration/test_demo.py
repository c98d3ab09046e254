"""The README's first command: the demo runs on its own, says what it wrote and why, and an
independent reader (DuckDB) sees every generated row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


@pytest.mark.child
def test_the_demo_explains_its_files_and_duckdb_reads_every_row(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    run = subprocess.run([sys.executable, str(DEMO)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    out = run.stdout
    # What the demo generates: 3 files of 2000 rows, ids 0..5999, user i % 97, amount i * 0.37
    ids = range(3 * 2000)
    total = round(sum(round(i * 0.37, 2) for i in ids), 2)
    assert f"reads: {len(ids)} rows, 97 users, amount total {total}" in out
    batches = [line for line in out.splitlines() if ": append, batch" in line]
    assert [line.split("batch ")[1].split(",")[0] for line in batches] == ["0", "1", "2"]
    assert all("+2000 rows in" in line for line in batches)
    assert "Why so many files" in out and "about 24 days of events" in out
    assert "python -m lakesink_datasource.maintain compact demo.events" in out
    assert (tmp_path / "lakesink-warehouse" / "catalog.db").exists()  # ./lakesink-warehouse, where the README says
    # Progress lines (stderr) each on a line of their own, not glued to Spark's progress bar.
    progress = [line for line in run.stderr.splitlines() if "lakesink demo.events" in line]
    assert len(progress) == 3 and all(line.startswith("lakesink demo.events") for line in progress)
