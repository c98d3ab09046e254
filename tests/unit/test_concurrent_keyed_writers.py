"""Keyed writes stay serialisable with other writers: a batch whose keys another writer wrote
since it was planned is refused (no key ever gets two live rows), writers on disjoint keys
both land, and the refused batch lands when replayed.

Two writers are interleaved deterministically through the production path (plan_write ->
write_task -> commit_write, no Spark): both plan on the same snapshot, both write, then they
commit one after the other, which is what two concurrent jobs do in the racy order.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitError, CommitOutcome, commit_write
from lakesink_datasource.commit.validation import ConflictKind
from lakesink_datasource.messages import LakeSinkCommitMessage, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])
COLUMNS = ["id", "v"]


def _rows(ids: Iterable[int], tag: str) -> list[dict]:
    return [{"id": i, "v": f"{tag}{i}"} for i in ids]


class _Writer:
    """One job: its own options (and index directory, unless shared)."""

    def __init__(self, warehouse: str, index_dir: str, **options: str) -> None:
        self.options = {"table": IDENT, "warehouse": warehouse, "operation": "upsert", "primary_key": "id",
                        "index_dir": index_dir, "partition_by": "bucket(2, id)", **options}

    def plan(self) -> WritePlan:
        return plan_write(parse_options(self.options), SCHEMA, overwrite=False)

    def write(self, plan: WritePlan, ids: Iterable[int], tag: str) -> LakeSinkCommitMessage:
        batch = pa.RecordBatch.from_pylist(_rows(ids, tag), schema=ARROW)
        return write_task(plan, iter([batch]), TaskIdentity())

    def commit(self, plan: WritePlan, message: LakeSinkCommitMessage) -> CommitOutcome:
        return commit_write(plan, decode_messages([message]), None)


@pytest.fixture(params=["two-hosts", "one-host"])
def writers(request: pytest.FixtureRequest, warehouse: str) -> tuple[_Writer, _Writer]:
    shared = request.param == "one-host"
    a = _Writer(warehouse, f"{warehouse}/index-a")
    b = _Writer(warehouse, f"{warehouse}/index-a" if shared else f"{warehouse}/index-b")
    return a, b


def test_two_writers_on_the_same_keys_never_leave_two_live_rows(warehouse: str, writers: tuple[_Writer, _Writer]) -> None:
    a, b = writers
    a.commit(a.plan(), a.write(a.plan(), range(100), "base-"))
    live = {r["id"]: r for r in _rows(range(100), "base-")}
    for round_ in range(3):
        plan_a, plan_b = a.plan(), b.plan()  # both plan on the same snapshot ...
        message_a = a.write(plan_a, range(0, 100, 2), f"a{round_}-")
        message_b = b.write(plan_b, range(0, 100, 3), f"b{round_}-")  # ... sharing every 6th key
        assert a.commit(plan_a, message_a).snapshot_id is not None
        live.update({r["id"]: r for r in _rows(range(0, 100, 2), f"a{round_}-")})
        with pytest.raises(CommitError, match="committed concurrently, also wrote") as refused:
            b.commit(plan_b, message_b)
        assert refused.value.conflict is ConflictKind.KEY_WRITTEN_CONCURRENTLY
        assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
        assert check_table(load(warehouse, IDENT)) == []
        # The refused batch, replayed (planned again), lands on top of the other writer's.
        replay = b.plan()
        assert b.commit(replay, b.write(replay, range(0, 100, 3), f"b{round_}-")).snapshot_id is not None
        live.update({r["id"]: r for r in _rows(range(0, 100, 3), f"b{round_}-")})
        assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
        assert check_table(load(warehouse, IDENT)) == []


def test_two_writers_on_disjoint_keys_both_land(warehouse: str, writers: tuple[_Writer, _Writer]) -> None:
    a, b = writers
    a.commit(a.plan(), a.write(a.plan(), range(100), "base-"))
    live = {r["id"]: r for r in _rows(range(100), "base-")}
    for round_ in range(3):
        plan_a, plan_b = a.plan(), b.plan()
        message_a = a.write(plan_a, range(0, 50), f"a{round_}-")
        message_b = b.write(plan_b, range(50, 120), f"b{round_}-")
        assert a.commit(plan_a, message_a).snapshot_id is not None
        assert b.commit(plan_b, message_b).snapshot_id is not None
        live.update({r["id"]: r for r in _rows(range(0, 50), f"a{round_}-") + _rows(range(50, 120), f"b{round_}-")})
        assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
        assert check_table(load(warehouse, IDENT)) == []


def test_a_plain_append_of_a_key_refuses_a_concurrent_upsert_of_it(warehouse: str) -> None:
    keyed = _Writer(warehouse, f"{warehouse}/index")
    keyed.commit(keyed.plan(), keyed.write(keyed.plan(), range(10), "base-"))
    plan = keyed.plan()
    message = keyed.write(plan, [3], "upsert-")
    appender = _Writer(warehouse, f"{warehouse}/index", operation="append", primary_key="")
    appender.options.pop("primary_key")
    appender.commit(appender.plan(), appender.write(appender.plan(), [3], "appended-"))
    with pytest.raises(CommitError, match="committed concurrently") as refused:
        keyed.commit(plan, message)
    assert refused.value.conflict is ConflictKind.KEY_WRITTEN_CONCURRENTLY
    assert pickle.loads(pickle.dumps(refused.value)).conflict is ConflictKind.KEY_WRITTEN_CONCURRENTLY  # as Spark ships it


@pytest.mark.parametrize("writers", ["two-hosts", "one-host"], indirect=True)
def test_string_keys_of_different_lengths_are_recognised_as_the_same_key(warehouse: str, writers: tuple[_Writer, _Writer]) -> None:
    """Key hashes must not depend on the other keys of a batch: here writer b's batch also
    holds a much longer key than the one both writers change."""
    a, b = (_Writer(warehouse, w.options["index_dir"], primary_key="v") for w in writers)
    a.commit(a.plan(), a.write(a.plan(), [5], "base-"))
    plan_a, plan_b = a.plan(), b.plan()
    message_a = a.write(plan_a, [1], "k")
    message_b = b.write(plan_b, [1, 123_456_789_012], "k")  # keys "k1" and "k123456789012"
    assert a.commit(plan_a, message_a).snapshot_id is not None
    with pytest.raises(CommitError, match="committed concurrently, also wrote"):
        b.commit(plan_b, message_b)
    live = [{"id": 5, "v": "base-5"}, {"id": 1, "v": "k1"}]
    assert_readers_see(warehouse, IDENT, expected_rows(live, COLUMNS), COLUMNS)
