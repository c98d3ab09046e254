"""One stream, a whole database (issue 47): a CDC stream of 20 tables through one query,
killed with SIGKILL at the windows that matter and restarted, every table equal to its
model in DuckDB and pyiceberg, no batch twice in any table.

The events: inserts, updates and deletes of keys 0-9 in each table, late changes (a
sequence below one the key already saw), table t07 gaining a column from batch 2 on, table
t19 first seen in batch 3. Each row names its table bare (`t07`; option namespace=cdc) and
carries its row as JSON (`after`), the op and sequence as shared columns.
"""

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
from lakesink_testing import duckdb_rows, expected_rows, load, pyiceberg_rows

from lakesink_datasource.iceberg.summary_keys import EPOCH_ID
from lakesink_datasource.index.key_shards import file_shard, shard_of_key_texts

CHILD = str(Path(__file__).with_name("routed_child.py"))
TABLES = [f"t{i:02d}" for i in range(20)]
SCHEMA = pa.schema([("tbl", pa.string()), ("op", pa.string()), ("seq", pa.int64()), ("after", pa.string())])
BATCHES = 6
pytestmark = pytest.mark.slow


def make_events(folder: Path) -> list[list[dict]]:
    """The micro-batches' events, one Parquet file each; sequences are unique per key."""
    rng = random.Random(47)
    folder.mkdir(parents=True)
    counter = 0
    seen: dict[tuple[str, int], list[int]] = {}  # sequences a key's changes had, in earlier batches
    batches = []
    for b in range(BATCHES):
        events = []
        late_done: set[tuple[str, int]] = set()
        for table in TABLES if b >= 3 else TABLES[:19]:
            for _ in range(rng.randint(3, 7)):
                key = rng.randint(0, 9)
                earlier = seen.get((table, key), [])
                if earlier and (table, key) not in late_done and rng.random() < 0.2:
                    late_done.add((table, key))
                    seq = max(earlier) - 5  # older than what the key already saw: ignored
                else:
                    counter += 10
                    seq = counter
                if rng.random() < 0.2:
                    events.append({"tbl": table, "op": "d", "seq": seq, "after": json.dumps({"id": key})})
                else:
                    row = {"id": key, "name": f"{table}-{key}-{seq}", "amount": seq / 10}
                    if table == "t07" and b >= 2:
                        row["extra"] = f"x{seq}"
                    events.append({"tbl": table, "op": "u" if earlier else "c", "seq": seq, "after": json.dumps(row)})
        for e in events:
            after = json.loads(e["after"])
            seen.setdefault((e["tbl"], after["id"]), []).append(e["seq"])
        rng.shuffle(events)
        path = folder / f"{b:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(events, schema=SCHEMA), path)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))  # file b is batch b
        batches.append(events)
    return batches


def model(batches: list[list[dict]]) -> dict[str, list[dict]]:
    """Per table the live rows: each key's change with the highest sequence, absent when it
    is a delete (a delete's sequence keeps older changes out)."""
    winners: dict[tuple[str, int], dict] = {}
    for events in batches:
        for e in events:
            key = (e["tbl"], json.loads(e["after"])["id"])
            if key not in winners or winners[key]["seq"] < e["seq"]:
                winners[key] = e
    tables: dict[str, list[dict]] = {}
    for (table, _), e in winners.items():
        tables.setdefault(table, [])
        if e["op"] != "d":
            tables[table].append(json.loads(e["after"]))
    return tables


def run(tmp_path: Path, warehouse: str, faults: list[dict] | None, *extra: str) -> int:
    env = dict(os.environ)
    env.pop("LAKESINK_FAULTS", None)
    if faults is not None:
        path = tmp_path / "child-faults.json"
        path.write_text(json.dumps(faults))
        env["LAKESINK_FAULTS"] = str(path)
    proc = subprocess.run(
        [sys.executable, CHILD, str(tmp_path / "source"), str(tmp_path / "checkpoint"), warehouse, *extra],
        env=env, start_new_session=True, capture_output=True, timeout=600,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr.decode()[-3000:])
    return proc.returncode


def test_a_cdc_stream_of_20_tables_survives_sigkills_with_every_table_exact(tmp_path: Path, warehouse: str) -> None:
    batches = make_events(tmp_path / "source")
    # Batch 1 landed in every table (one transaction), Spark never logged it: replayed.
    assert run(tmp_path, warehouse, [{"point": "after_commit", "batch": 1, "table": "cdc.t05", "action": "kill"}]) == -signal.SIGKILL
    # Batch 3 killed before one table's swap: none of its tables changed.
    assert run(tmp_path, warehouse, [{"point": "before_commit", "batch": 3, "table": "cdc.t12", "action": "kill"}]) == -signal.SIGKILL
    assert all(
        "3" not in [s.summary[EPOCH_ID] for s in load(warehouse, f"cdc.{t}").metadata.snapshots if EPOCH_ID in s.summary.additional_properties]
        for t in TABLES[:19]
    )
    # One table after another: the driver dies between two tables' commits of batch 4.
    assert run(tmp_path, warehouse, [{"point": "after_commit", "batch": 4, "table": "cdc.t03", "action": "kill"}], "commit_tables=in_turn") == -signal.SIGKILL
    assert run(tmp_path, warehouse, None) == 0
    assert_every_table_matches(warehouse, batches)


def test_a_cdc_stream_of_20_tables_clustered_by_key_survives_sigkills(tmp_path: Path, warehouse: str) -> None:
    """The same stream through cluster_by_key: each table's keys in two shards, each shard's
    task writing its part of every table, the tables committed together."""
    batches = make_events(tmp_path / "source")
    assert run(tmp_path, warehouse, [{"point": "after_commit", "batch": 1, "table": "cdc.t05", "action": "kill"}], "route=2") == -signal.SIGKILL
    assert run(tmp_path, warehouse, [{"point": "before_commit", "batch": 3, "table": "cdc.t12", "action": "kill"}], "route=2") == -signal.SIGKILL
    assert run(tmp_path, warehouse, None, "route=2") == 0
    assert_every_table_matches(warehouse, batches)
    for table in TABLES:
        current = load(warehouse, f"cdc.{table}")
        for task in current.scan().plan_files():
            route = file_shard(task.file.file_path)
            assert route is not None and route.by_text and route.shards == 2, task.file.file_path
            ids = pq.read_table(task.file.file_path.removeprefix("file://"), columns=["id"]).column("id")
            assert set(shard_of_key_texts([ids], 2).tolist()) == {route.shard}


def assert_every_table_matches(warehouse: str, batches: list[list[dict]]) -> None:
    expected = model(batches)
    assert sorted(expected) == TABLES
    for table in TABLES:
        current = load(warehouse, f"cdc.{table}")
        for reader, got in (("DuckDB", duckdb_rows(current.metadata_location, ["id", "name", "amount"])), ("pyiceberg", pyiceberg_rows(current, ["id", "name", "amount"]))):
            want = expected_rows(expected[table], ["id", "name", "amount"])
            assert got == want, f"{table} ({reader}): missing {dict(want - got)}, unexpected {dict(got - want)}"
        epochs = [s.summary[EPOCH_ID] for s in current.metadata.snapshots if EPOCH_ID in s.summary.additional_properties]
        assert len(epochs) == len(set(epochs)), f"{table}: a batch committed twice: {epochs}"
    t07 = load(warehouse, "cdc.t07")
    assert duckdb_rows(t07.metadata_location, ["id", "extra"]) == expected_rows([{"id": r["id"], "extra": r.get("extra")} for r in expected["t07"]], ["id", "extra"])
    assert Counter(len(expected[t]) > 0 for t in TABLES)[True] >= 18  # the stream left rows in nearly every table
