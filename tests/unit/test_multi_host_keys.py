"""A key changed on two hosts in one batch is refused at commit: never silent duplicates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from lakesink_testing import current_snapshot_id
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import CommitError, commit_write
from lakesink_datasource.messages import TaskResult, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.changes import KeyedInputError
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


def _task(plan, ids: list[int], partition_id: int, host: str) -> TaskResult:  # type: ignore[no-untyped-def]
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids])})
    result = decode_messages([write_task(plan, iter([batch]), who=TaskIdentity(partition_id=partition_id))])[0]
    # The same task as if it had run on another machine (its own key index).
    return TaskResult(**{f: getattr(result, f) for f in TaskResult.__struct_fields__ if f != "host"}, host=host)


@pytest.fixture
def plan(warehouse: str, tmp_path):  # type: ignore[no-untyped-def]
    options = parse_options({"table": "db.k", "warehouse": warehouse, "operation": "upsert", "primary_key": "id", "index_dir": str(tmp_path / "idx")})
    return plan_write(options, SCHEMA, overwrite=False)


def test_a_key_on_two_hosts_refuses_the_batch(plan, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    a = _task(plan, [1, 2, 3], 0, "host-a")
    b = _task(plan, [3, 4], 1, "host-b")
    with pytest.raises(CommitError, match=r"1 key\(s\) of this batch reached more than one host .*repartition"):
        commit_write(plan, [a, b], None)
    assert current_snapshot_id(warehouse, "db.k") is None


def test_keys_clustered_by_host_commit(plan, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    a = _task(plan, [1, 2, 3], 0, "host-a")
    b = _task(plan, [4, 5], 1, "host-b")
    assert commit_write(plan, [a, b], None).snapshot_id is not None
    hashes = np.frombuffer(a.key_hashes, dtype="<u8")
    assert len(hashes) == 3 and (np.diff(hashes.astype(np.float64)) > 0).all()  # sorted, unique


def test_a_keyed_task_under_speculation_refuses_before_writing(plan, warehouse: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", "b"])})
    with pytest.raises(KeyedInputError, match=r"spark\.speculation=true.*Set spark\.speculation=false"):
        write_task(plan, iter([batch]), who=TaskIdentity(partition_id=0, speculation=True))
    assert list(Path(warehouse).rglob("*.parquet")) == []
    assert not (tmp_path / "idx").exists() or not any((tmp_path / "idx").iterdir())
    assert current_snapshot_id(warehouse, "db.k") is None
