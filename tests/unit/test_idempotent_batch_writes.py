"""Idempotent batch writes (`txn_app_id` + `txn_version`, Delta's txnAppId / txnVersion).

Driven through the production path without Spark (plan_write -> write_task -> commit_write);
the foreachBatch case runs through Spark in tests/integration/test_streaming_roundtrip.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.iceberg.summary_keys import TXN_APP_ID, TXN_VERSION
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]


def _rows(ids: Iterable[int], tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


def _write(warehouse: str, ids: Iterable[int], tag: str, **options: str) -> CommitOutcome:
    plan = plan_write(parse_options({"table": IDENT, "warehouse": warehouse, **options}), SCHEMA, overwrite=False)
    message = write_task(plan, iter([pa.RecordBatch.from_pylist(_rows(ids, tag), schema=ARROW)]))
    return commit_write(plan, decode_messages([message]), None)


def test_a_version_already_in_the_table_is_skipped_and_a_newer_one_lands(warehouse: str) -> None:
    first = _write(warehouse, range(5), "a", txn_app_id="etl", txn_version="7")
    again = _write(warehouse, range(5), "a", txn_app_id="etl", txn_version="7")  # a retried job
    older = _write(warehouse, range(100, 105), "old", txn_app_id="etl", txn_version="6")
    other_app = _write(warehouse, range(5, 8), "b", txn_app_id="other", txn_version="7")
    newer = _write(warehouse, range(8, 10), "c", txnAppId="etl", txnVersion="8")  # Delta's spelling

    assert first.snapshot_id is not None and other_app.snapshot_id is not None and newer.snapshot_id is not None
    assert again.snapshot_id is None and "txn_version 7 of txn_app_id 'etl' is already in the table" in (again.skipped_reason or "")
    assert older.snapshot_id is None
    assert_readers_see(warehouse, IDENT, expected_rows(_rows(range(5), "a") + _rows(range(5, 8), "b") + _rows(range(8, 10), "c"), COLUMNS), COLUMNS)
    summary = load(warehouse, IDENT).metadata.current_snapshot().summary  # type: ignore[union-attr]
    assert summary[TXN_APP_ID] == "etl" and summary[TXN_VERSION] == "8"
    # Nothing of the skipped writes stayed behind on disk.
    data = Path(warehouse, "db", "t", "data")
    assert len(list(data.rglob("*.parquet"))) == 3


def test_the_recorded_version_survives_the_expiry_of_every_snapshot_that_carried_it(warehouse: str) -> None:
    _write(warehouse, range(5), "a", txn_app_id="etl", txn_version="1")
    _write(warehouse, range(5, 7), "b")  # a write without txn options on top
    table = load(warehouse, IDENT)
    current = table.metadata.current_snapshot()
    assert current is not None
    swap_in(table, PreparedCommit(table.metadata, None, expired=[s.snapshot_id for s in table.metadata.snapshots if s != current]))
    assert all(TXN_APP_ID not in s.summary.additional_properties for s in load(warehouse, IDENT).metadata.snapshots)  # type: ignore[union-attr]

    assert _write(warehouse, range(5), "a", txn_app_id="etl", txn_version="1").snapshot_id is None
    assert_readers_see(warehouse, IDENT, expected_rows(_rows(range(5), "a") + _rows(range(5, 7), "b"), COLUMNS), COLUMNS)


@pytest.mark.child
def test_a_job_killed_right_after_its_commit_and_rerun_writes_its_rows_once(warehouse: str, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps([{"point": "after_commit", "action": "kill"}]))
    script = (
        "import sys; sys.path[:0] = ['tests', 'tests/unit']; "
        "from test_idempotent_batch_writes import _write; "
        f"_write({warehouse!r}, range(20), 'a', txn_app_id='nightly', txn_version='20261123')"
    )
    child = subprocess.run([sys.executable, "-c", script], env={**os.environ, "LAKESINK_FAULTS": str(faults)},
                           start_new_session=True, check=False)
    assert child.returncode == -signal.SIGKILL  # died after the Iceberg commit, before reporting success
    rerun = _write(warehouse, range(20), "a", txn_app_id="nightly", txn_version="20261123")
    assert rerun.snapshot_id is None
    assert_readers_see(warehouse, IDENT, expected_rows(_rows(range(20), "a"), COLUMNS), COLUMNS)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"txn_app_id": "etl"}, "option 'txn_app_id' needs 'txn_version' too"),
        ({"txn_version": "3"}, "option 'txn_version' needs 'txn_app_id' too"),
        ({"txn_app_id": "etl", "txn_version": "-1"}, "option 'txn_version' must be >= 0"),
        ({"txn_app_id": "etl", "txn_version": "v2"}, "option 'txn_version' must be an integer"),
    ],
)
def test_half_or_bad_txn_options_are_refused_before_anything_is_written(warehouse: str, options: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options({"table": IDENT, "warehouse": warehouse, **options})
    assert not Path(warehouse, "db").exists()
