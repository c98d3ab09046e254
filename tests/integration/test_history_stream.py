"""A history stream (issue 55) through Spark, SIGKILLed at the windows that matter and
restarted: the table equals an independent SCD type 2 model (tests/scd2_model.py) in DuckDB and pyiceberg,
no batch twice, every key with one current version."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import duckdb_rows, load, pyiceberg_rows
from scd2_model import Change, history

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID

CHILD = str(Path(__file__).with_name("history_child.py"))
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("op", pa.string()), ("seq", pa.int64())])
COLUMNS = ["id", "v", "__start_at", "__end_at"]
pytestmark = pytest.mark.slow


def make_changes(folder: Path, batches: int = 5) -> Counter:
    """Changes of keys 0-19, some late (a sequence below one the key saw), one file a batch;
    returns the model's versions as rows of COLUMNS."""
    rng = random.Random(55)
    folder.mkdir(parents=True)
    changes: list[list[Change]] = []
    seq = 100
    for b in range(batches):
        rows = []
        for _ in range(30):
            key = rng.randint(0, 19)
            seq += 10
            late = rng.random() < 0.15
            at = seq - rng.randint(15, 60) if late else seq
            op = "d" if rng.random() < 0.15 else "u"
            rows.append({"id": key, "v": f"v{at}" if rng.random() < 0.8 else "same", "op": op, "seq": at})
        # Unique sequences per key: a re-sent change is its own case (tested in tests/unit).
        seen: set[tuple[int, int]] = set()
        rows = [r for r in rows if (r["id"], r["seq"]) not in seen and not seen.add((r["id"], r["seq"]))]
        changes.append([Change(r["id"], (r["seq"],), "delete", None) if r["op"] == "d" else Change(r["id"], (r["seq"],), "upsert", {"v": r["v"]})
                        for r in rows])
        path = folder / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
    return Counter((v.key, v.values["v"], v.start[0], None if v.end is None else v.end[0]) for v in history(changes))


def run(tmp_path: Path, warehouse: str, faults: list[dict] | None) -> int:
    env = dict(os.environ)
    env.pop("LAKESINK_FAULTS", None)
    if faults is not None:
        path = tmp_path / "child-faults.json"
        path.write_text(json.dumps(faults))
        env["LAKESINK_FAULTS"] = str(path)
    proc = subprocess.run(
        [sys.executable, CHILD, str(tmp_path / "source"), str(tmp_path / "checkpoint"), warehouse],
        env=env, start_new_session=True, capture_output=True, timeout=600,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr.decode()[-3000:])
    return proc.returncode


def test_a_history_stream_survives_sigkills_with_every_version_exact(tmp_path: Path, warehouse: str) -> None:
    expected = make_changes(tmp_path / "source")
    assert run(tmp_path, warehouse, [{"point": "after_commit", "batch": 1, "action": "kill"}]) == -signal.SIGKILL
    assert run(tmp_path, warehouse, [{"point": "before_commit", "batch": 3, "action": "kill"}]) == -signal.SIGKILL
    assert run(tmp_path, warehouse, None) == 0
    table = load(warehouse, "db.hist")
    assert pyiceberg_rows(table, COLUMNS) == expected
    assert duckdb_rows(table.metadata_location, COLUMNS) == expected
    assert check_table(table) == []
    epochs = Counter(s.summary[EPOCH_ID] for s in table.metadata.snapshots if EPOCH_ID in s.summary.additional_properties)
    assert sorted(epochs) == ["0", "1", "2", "3", "4"] and set(epochs.values()) == {1}
