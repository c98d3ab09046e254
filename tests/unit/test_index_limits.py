"""The key index inside the limits production sets: an address-space limit (`ulimit -v`,
spark.executor.pyspark.memory) and an index directory on a file system that fills up.

Keyed writes run through the production path without Spark (plan_write -> write_task ->
commit_write); the tables are compared with a plain model through DuckDB and pyiceberg.
The address-space runs happen in processes of their own (tests/unit/address_space_child.py)
that set RLIMIT_AS as Spark's Python workers do; the full directory is an 8 MiB tmpfs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from address_space_child import rows
from keyed_model import Config, Harness, Model
from lakesink_testing import assert_readers_see, expected_rows, load

from lakesink_datasource.index import environment
from lakesink_datasource.index.no_room import IndexDirFull

CHILD = str(Path(__file__).with_name("address_space_child.py"))
KEYS = 30_000


def _child(root: Path, limit: str, operation: str, batches: int, keys: int, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, CHILD, str(root), limit, operation, str(batches), str(keys), *extra],
        capture_output=True, text=True, timeout=600, cwd=str(Path(__file__).parent),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _model(operation: str, batches: range, keys: int, last_keys: int | None = None) -> Counter:
    """What the child's batches leave: the last row of each key (cdc: unless deleted).
    `last_keys`: the last batch had that many rows (a later run of the child)."""
    live: dict[int, dict] = {}
    for batch in batches:
        count = last_keys if last_keys is not None and batch == batches[-1] else keys
        for row in rows(operation, batch, count):
            if row.get("op") == "d":
                live.pop(row["id"], None)
            else:
                live[row["id"]] = {"id": row["id"], "v": row["v"]}
    return expected_rows(list(live.values()), ["id", "v"])


@pytest.mark.child
@pytest.mark.parametrize("operation", ["upsert", "cdc"])
def test_keyed_writes_under_a_1g_address_space_limit_are_exact(tmp_path: Path, operation: str) -> None:
    """`ulimit -v 1g` set before anything is imported (as Spark's workers get it): every map
    fits, grows as the index does (`min_map` makes the first maps small), and the table is
    exactly the model's."""
    report = _child(tmp_path, "1024", operation, 4, KEYS, f"min_map={256 << 10}")
    assert report["error"] is None, report["error"]
    assert report["committed"] == 4 and report["limit"] == 1 << 30
    maps = report["maps"]
    assert len(maps) == 9  # eight shards and the file table
    # Each map grew past its first size, and together they stay far inside the limit.
    assert all(size > 256 << 10 for path, size in maps.items() if "shard-" in path), maps
    assert sum(maps.values()) < (1 << 30) // 4, maps
    assert_readers_see(str(tmp_path / "warehouse"), "db.k", _model(operation, range(4), KEYS), ["id", "v"])


@pytest.mark.child
def test_an_index_the_limit_cannot_hold_is_refused_naming_the_setting(tmp_path: Path) -> None:
    """An index written without a limit, then a batch in a process whose limit leaves its
    maps too little room: the batch fails with IndexTooLarge naming
    spark.executor.pyspark.memory and a value, nothing changes, and a process given that
    value writes the batch exactly."""
    assert _child(tmp_path, "none", "upsert", 1, 300_000)["committed"] == 1
    before = load(str(tmp_path / "warehouse"), "db.k").metadata.current_snapshot()
    refused = _child(tmp_path, "+40", "upsert", 1, 10, "first=1")
    error = refused["error"]
    assert refused["committed"] == 0 and error["type"] == "IndexTooLarge" and error["lakesink"], error
    assert "spark.executor.pyspark.memory" in error["message"] and "Nothing of this batch was committed" in error["message"]
    suggested = int(error["message"].split("to at least ", 1)[1].split("m", 1)[0])
    table = load(str(tmp_path / "warehouse"), "db.k")
    assert table.metadata.current_snapshot() == before
    assert_readers_see(str(tmp_path / "warehouse"), "db.k", _model("upsert", range(1), 300_000), ["id", "v"])
    # The value the message names is enough (the limit set before imports, as Spark sets it).
    assert _child(tmp_path, str(suggested), "upsert", 1, 10, "first=1")["committed"] == 1
    assert_readers_see(str(tmp_path / "warehouse"), "db.k", _model("upsert", range(2), 300_000, last_keys=10), ["id", "v"])


# ------------------------------------------------------------------- a full index directory


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB file system (tmpfs; mounting needs root)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _rows(first: int, count: int, tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}", "ts": None} for i in range(first, first + count)]


def test_a_full_index_directory_fails_the_batch_naming_index_dir_and_changes_nothing(small_fs: Path, tmp_path: Path) -> None:
    config = Config("upsert")
    with Harness(config, root=str(tmp_path / "root")) as h:
        h.index_dir = str(small_fs / "index")
        h.options = msgspec.structs.replace(h.options, index_dir=h.index_dir)
        model = Model(config)
        first = [[_rows(0, 2_000, "a")]]
        h.run_batch(first, 0)
        model.apply_batch(first)
        snapshot = h.table().metadata.current_snapshot()
        # Leave the file system a few pages: the next batch's keys cannot fit.
        ballast = small_fs / "ballast"
        free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
        ballast.write_bytes(b"\0" * max(0, free - 64 * 1024))
        second = [[_rows(1_000, KEYS, "b")]]
        with pytest.raises(IndexDirFull, match=r"option 'index_dir'.*has no room left.*Free space there, or set option 'index_dir'"):
            h.write(h.plan(), second[0], 1, partition_id=0)
        # The batch never reached the table: the same snapshot, the same rows.
        assert h.table().metadata.current_snapshot() == snapshot
        h.assert_matches(model.expected(), "after the full directory")
        # Room again: the batch runs again (a new task attempt, as Spark's retry or a
        # restarted query) in this process, whose environments saw the failure, and lands.
        ballast.unlink()
        plan = h.plan()
        h.commit(plan, [h.write(plan, second[0], 1, partition_id=0, attempt=1)], 1)
        model.apply_batch(second)
        h.assert_matches(model.expected(), "after freeing space")
        # And in a new process (the environments opened afresh), the next batch too.
        environment.close_cached(list(environment.cached_paths()))
        third = [[_rows(500, 5_000, "c")]]
        h.run_batch(third, 2)
        model.apply_batch(third)
        h.assert_matches(model.expected(), "in a new process")
