"""Keyed writes under spark.executor.pyspark.memory=1g (issue 53): PySpark sets RLIMIT_AS in
every Python worker, and each key index environment used to map 64 GiB of address space,
so every keyed write failed at once (`lmdb.MemoryError ... Cannot allocate memory`).

One Spark session of its own with the setting (tests/integration/pyspark_memory_child.py)
runs an upsert, a cdc, a write routed to 100 keyed tables, a cluster_by_key stream and a
keyed stream of 100 micro-batches. Each table is then read with DuckDB and pyiceberg and
compared with a plain model of the rows the child wrote; the key index's maps, read from
the LMDB files' meta pages, are the few MiB its data needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from lakesink_testing import assert_readers_see, expected_rows
from pyspark_memory_child import BATCHES, ROUTED_TABLES, rows

from lakesink_datasource.index.damage import _META, _META_MAGIC, _PAGE, _PAGE_HEADER

CHILD = str(Path(__file__).with_name("pyspark_memory_child.py"))
SCENARIOS = ("upsert", "cdc", "routed", "clustered", "stream")
COLUMNS = ["id", "name"]
pytestmark = pytest.mark.child


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("pyspark-memory")
    out = root / "report.json"
    done = subprocess.run(
        [sys.executable, CHILD, str(root), str(out), *SCENARIOS], capture_output=True, text=True, timeout=1200,
        cwd=str(Path(CHILD).parent),
    )
    assert done.returncode == 0, done.stderr[-5000:]
    report = json.loads(out.read_text())
    print(f"spark.executor.pyspark.memory=1g: seconds per scenario {report['seconds']}")
    return root, report


def _model(scenario: str, table: str | None = None) -> Counter:
    """The live rows after the scenario's batches: each key's last row (cdc: the highest
    sequence, which is the last one written; a delete removes the key)."""
    live: dict[int, dict] = {}
    for batch in range(BATCHES[scenario]):
        for row in rows(scenario, batch):
            if table is not None and row["tbl"] != table:
                continue
            if row.get("op") == "d":
                live.pop(row["id"], None)
            else:
                live[row["id"]] = {"id": row["id"], "name": row["name"]}
    return expected_rows(list(live.values()), COLUMNS)


def _map_sizes(index_dir: Path) -> list[int]:
    """The map size every environment under `index_dir` was last committed with (its meta
    page's), as LMDB records it."""
    sizes = []
    for data in index_dir.rglob("data.mdb"):
        head = data.read_bytes()[: 2 * _PAGE]
        metas = [_META.unpack(head[p * _PAGE + _PAGE_HEADER : p * _PAGE + _PAGE_HEADER + _META.size]) for p in (0, 1)]
        newest = max((m for m in metas if m[0] == _META_MAGIC), key=lambda m: m[5])
        sizes.append(newest[3])
    return sizes


def test_the_workers_run_under_the_limit_and_the_maps_fit_it(run: tuple[Path, dict]) -> None:
    root, report = run
    assert report["worker_limit"] == 1 << 30  # PySpark set RLIMIT_AS in the worker (worker_util.setup_memory_limits)
    sizes = _map_sizes(root / "index")
    # Every table's index (100 routed tables among them): 8 shards and a file table, or a
    # key shard's one shard and file table; each map a few MiB, not 64 GiB.
    assert len(sizes) >= 9 * (ROUTED_TABLES + 3)
    assert max(sizes) <= 64 << 20, max(sizes)
    print(f"key index maps under 1g: {len(sizes)} environments, largest {max(sizes) >> 20} MiB, all {sum(sizes) >> 20} MiB")


@pytest.mark.parametrize("scenario", ["upsert", "cdc"])
def test_batch_writes_are_exact(run: tuple[Path, dict], scenario: str) -> None:
    root, _ = run
    assert_readers_see(str(root / "warehouse"), f"db.{scenario}", _model(scenario), COLUMNS)


def test_a_write_routed_to_100_keyed_tables_is_exact(run: tuple[Path, dict]) -> None:
    root, _ = run
    for t in range(ROUTED_TABLES):
        assert_readers_see(str(root / "warehouse"), f"routed.t{t:03d}", _model("routed", f"t{t:03d}"), COLUMNS)


def test_a_stream_clustered_by_key_is_exact(run: tuple[Path, dict]) -> None:
    root, _ = run
    assert_readers_see(str(root / "warehouse"), "db.clustered", _model("clustered"), COLUMNS)


def test_a_keyed_stream_of_100_batches_is_exact(run: tuple[Path, dict]) -> None:
    root, report = run
    assert_readers_see(str(root / "warehouse"), "db.stream", _model("stream"), COLUMNS)
    print(f"100 keyed micro-batches under spark.executor.pyspark.memory=1g: {report['seconds']['stream']} s")
