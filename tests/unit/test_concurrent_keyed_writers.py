"""Keyed writes never die of a concurrent writer: a batch whose keys another commit wrote
since it was planned decides those keys at commit (commit/key_conflicts.py) and lands, with
no key ever holding two live rows:

* upsert: commit order (the later commit's row is live);
* cdc with a sequence column: the highest sequence, ties to the later commit;
* dedupe: the first row kept.

Writers are interleaved deterministically through the production path (plan_write ->
write_task -> commit_write, no Spark): both plan on the same snapshot, both write, then
they commit one after the other, which is what two concurrent jobs do in the racy order.
The property test holds it to the plain model of tests/keyed_model.py, applied in commit
order, for random batches and commit orders; every host's index must follow (later
rounds resolve keys in them).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from keyed_model import Config, Harness, Model, label_batches, micro_batches, to_arrow
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.iceberg.summary_keys import KEYS_REDECIDED
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import LakeSinkCommitMessage, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.progress import describe_batch
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
        self.schema, self.arrow = SCHEMA, ARROW

    def plan(self) -> WritePlan:
        return plan_write(parse_options(self.options), self.schema, overwrite=False)

    def write(self, plan: WritePlan, ids: Iterable[int], tag: str, **extra: object) -> LakeSinkCommitMessage:
        batch = pa.RecordBatch.from_pylist([{**r, **extra} for r in _rows(ids, tag)], schema=self.arrow)
        return write_task(plan, iter([batch]), TaskIdentity())

    def write_rows(self, plan: WritePlan, rows: list[dict]) -> LakeSinkCommitMessage:
        return write_task(plan, iter([pa.RecordBatch.from_pylist(rows, schema=self.arrow)]), TaskIdentity())

    def commit(self, plan: WritePlan, message: LakeSinkCommitMessage) -> CommitOutcome:
        return commit_write(plan, decode_messages([message]), None)


def _redecided(warehouse: str) -> int:
    snapshot = load(warehouse, IDENT).metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return int(snapshot.summary.additional_properties.get(KEYS_REDECIDED, 0))


@pytest.fixture(params=["two-hosts", "one-host"])
def writers(request: pytest.FixtureRequest, warehouse: str) -> tuple[_Writer, _Writer]:
    shared = request.param == "one-host"
    a = _Writer(warehouse, f"{warehouse}/index-a")
    b = _Writer(warehouse, f"{warehouse}/index-a" if shared else f"{warehouse}/index-b")
    return a, b


def test_two_upsert_writers_on_the_same_keys_both_land_and_the_later_commit_wins(
    warehouse: str, writers: tuple[_Writer, _Writer]
) -> None:
    a, b = writers
    a.commit(a.plan(), a.write(a.plan(), range(100), "base-"))
    live = {r["id"]: r for r in _rows(range(100), "base-")}
    for round_ in range(3):
        plan_a, plan_b = a.plan(), b.plan()  # both plan on the same snapshot ...
        message_a = a.write(plan_a, range(0, 100, 2), f"a{round_}-")
        message_b = b.write(plan_b, range(0, 100, 3), f"b{round_}-")  # ... sharing every 6th key
        first, second = ((a, plan_a, message_a, range(0, 100, 2), "a"), (b, plan_b, message_b, range(0, 100, 3), "b"))
        if round_ % 2:
            first, second = second, first
        for writer, plan, message, ids, name in (first, second):
            outcome = writer.commit(plan, message)
            assert outcome.snapshot_id is not None
            live.update({r["id"]: r for r in _rows(ids, f"{name}{round_}-")})  # commit order: the later one wins
        assert _redecided(warehouse) == 17  # keys 0, 6, ..., 96
        assert "17 keys also written by concurrent commits, decided at commit" in describe_batch(IDENT, None, outcome, None)
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
        assert _redecided(warehouse) == 0
        live.update({r["id"]: r for r in _rows(range(0, 50), f"a{round_}-") + _rows(range(50, 120), f"b{round_}-")})
        assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
        assert check_table(load(warehouse, IDENT)) == []


def test_a_plain_append_of_a_key_is_hidden_by_a_concurrent_upsert_of_it_committed_later(warehouse: str) -> None:
    keyed = _Writer(warehouse, f"{warehouse}/index")
    keyed.commit(keyed.plan(), keyed.write(keyed.plan(), range(10), "base-"))
    plan = keyed.plan()
    message = keyed.write(plan, [3], "upsert-")
    appender = _Writer(warehouse, f"{warehouse}/index", operation="append")
    appender.options.pop("primary_key")
    appender.commit(appender.plan(), appender.write(appender.plan(), [3, 11], "appended-"))
    assert keyed.commit(plan, message).snapshot_id is not None
    live = {**{r["id"]: r for r in _rows(range(10), "base-")}, 3: {"id": 3, "v": "upsert-3"}, 11: {"id": 11, "v": "appended-11"}}
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []
    # The index followed: the next upsert of key 3 leaves one row.
    again = keyed.plan()
    keyed.commit(again, keyed.write(again, [3], "again-"))
    live[3] = {"id": 3, "v": "again-3"}
    assert_readers_see(warehouse, IDENT, expected_rows(live.values(), COLUMNS), COLUMNS)


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
    assert b.commit(plan_b, message_b).snapshot_id is not None
    assert _redecided(warehouse) == 1
    # The row of key "k1" is b's (id 1 both): one live row per key.
    live = [{"id": 5, "v": "base-5"}, {"id": 1, "v": "k1"}, {"id": 123_456_789_012, "v": "k123456789012"}]
    assert_readers_see(warehouse, IDENT, expected_rows(live, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


class _Cdc(_Writer):
    def __init__(self, warehouse: str, index_dir: str) -> None:
        super().__init__(warehouse, index_dir, operation="cdc", op_column="op", sequence_column="seq")
        fields = [*SCHEMA.fields, T.StructField("seq", T.LongType()), T.StructField("op", T.StringType())]
        self.schema = T.StructType(fields)
        self.arrow = pa.schema([*ARROW, ("seq", pa.int64()), ("op", pa.string())])


def test_cdc_decides_a_shared_key_by_sequence_whichever_commits_first(warehouse: str) -> None:
    a, b = _Cdc(warehouse, f"{warehouse}/index-a"), _Cdc(warehouse, f"{warehouse}/index-b")
    a.commit(a.plan(), a.write(a.plan(), range(6), "base-", seq=10, op="u"))
    plan_a, plan_b = a.plan(), b.plan()
    # a commits first with the higher sequences on keys 0, 1 (b's rows there are late) and a
    # delete of key 2 at 30 (b's row at 20 is older); b commits second with the higher
    # sequence on keys 3 and a delete of key 4 at 40 over a's row at 30; key 5: equal
    # sequences, the later commit (b) wins.
    def rows(ids: Iterable[int], tag: str, seq: int, op: str) -> list[dict]:
        return [{"id": i, "v": f"{tag}{i}", "seq": seq, "op": op} for i in ids]

    message_a = a.write_rows(plan_a, rows([0, 1, 3, 4, 5], "a-", 30, "u") + rows([2], "a-", 30, "d"))
    assert a.commit(plan_a, message_a).snapshot_id is not None
    message_b = b.write_rows(plan_b, rows([0, 1, 2], "b-", 20, "u") + rows([3], "b-", 40, "u") + rows([4], "b-", 40, "d") + rows([5], "b-", 30, "u"))
    assert b.commit(plan_b, message_b).snapshot_id is not None
    assert _redecided(warehouse) == 6
    live = [{"id": 0, "v": "a-0"}, {"id": 1, "v": "a-1"}, {"id": 3, "v": "b-3"}, {"id": 5, "v": "b-5"}]
    assert_readers_see(warehouse, IDENT, expected_rows(live, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []
    # Both indexes followed the decision: late changes stay ignored, newer ones apply once.
    for writer in (a, b):
        plan = writer.plan()
        writer.commit(plan, writer.write(plan, [0, 2, 3, 4], "late-", seq=25, op="u"))
    assert_readers_see(warehouse, IDENT, expected_rows(live, COLUMNS), COLUMNS)
    plan = b.plan()
    b.commit(plan, b.write(plan, [0, 2, 4, 5], "new-", seq=50, op="u"))
    live = [{"id": 1, "v": "a-1"}, {"id": 3, "v": "b-3"}] + [{"id": i, "v": f"new-{i}"} for i in (0, 2, 4, 5)]
    assert_readers_see(warehouse, IDENT, expected_rows(live, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_a_decision_committed_between_a_hosts_plan_and_its_commit_does_not_undo_its_batch(warehouse: str) -> None:
    """Writer b's late batch decides key 1 at commit (writer a's row at sequence 3 wins) while
    writer a's next batch (sequence 5) is in flight; a commits after. a's host holds its batch
    already when it next walks b's snapshot: b's outcome (key 1 -> the row at 3) must not lay
    over it (it used to: a's following batch then hid the stale row and left two live rows)."""
    a, b = _Cdc(warehouse, f"{warehouse}/index-a"), _Cdc(warehouse, f"{warehouse}/index-b")

    def rows(tag: str, seq: int, ids: Iterable[int] = (1, 2)) -> list[dict]:
        return [{"id": i, "v": f"{tag}{i}", "seq": seq, "op": "u"} for i in ids]

    a.commit(a.plan(), a.write_rows(a.plan(), rows("base-", 1)))
    plan_b = b.plan()
    plan_a1 = a.plan()
    a.commit(plan_a1, a.write_rows(plan_a1, rows("a1-", 3)))
    plan_a2 = a.plan()
    message_a2 = a.write_rows(plan_a2, rows("a2-", 5))
    assert b.commit(plan_b, b.write_rows(plan_b, rows("b-", 2))).keys_redecided == 2  # a's rows at 3 win
    assert a.commit(plan_a2, message_a2).snapshot_id is not None
    assert_readers_see(warehouse, IDENT, expected_rows(rows("a2-", 5), COLUMNS), COLUMNS)
    plan_a3 = a.plan()
    a.commit(plan_a3, a.write_rows(plan_a3, rows("a3-", 7)))
    assert_readers_see(warehouse, IDENT, expected_rows(rows("a3-", 7), COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


def test_dedupe_keeps_the_row_committed_first(warehouse: str) -> None:
    a = _Writer(warehouse, f"{warehouse}/index-a", operation="dedupe")
    b = _Writer(warehouse, f"{warehouse}/index-b", operation="dedupe")
    a.commit(a.plan(), a.write(a.plan(), [0], "base-"))
    plan_a, plan_b = a.plan(), b.plan()
    message_a, message_b = a.write(plan_a, [1, 2], "a-"), b.write(plan_b, [2, 3], "b-")
    assert b.commit(plan_b, message_b).snapshot_id is not None
    assert a.commit(plan_a, message_a).snapshot_id is not None
    assert _redecided(warehouse) == 1
    live = [{"id": 0, "v": "base-0"}, {"id": 1, "v": "a-1"}, {"id": 2, "v": "b-2"}, {"id": 3, "v": "b-3"}]
    assert_readers_see(warehouse, IDENT, expected_rows(live, COLUMNS), COLUMNS)
    assert check_table(load(warehouse, IDENT)) == []


# --------------------------------------------------------------------------- against the model

SETTINGS = settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CASES = [("upsert", False, 3), ("cdc", True, 3), ("dedupe", False, 3), ("cdc", True, 2), ("upsert", False, 2)]


@pytest.mark.parametrize(("operation", "sequence", "version"), CASES, ids=[f"{o}-{'seq' if s else 'noseq'}-v{v}" for o, s, v in CASES])
@SETTINGS
@given(data=st.data())
def test_two_concurrent_writers_match_the_model_in_commit_order(operation: str, sequence: bool, version: int, data: st.DataObject) -> None:
    """Rounds of two jobs on two hosts planning on the same snapshot, each writing a batch
    of random changes (shared keys, late and tied sequences, deletes), committing in a random
    order, sometimes with a compaction between the two commits: the table is the model with
    the batches applied in commit order, after every commit, and each host's index follows
    (its later batches resolve keys in it)."""
    config = Config(operation, data.draw(st.sampled_from([None, "bucket(2, id)"]), label="partition_by"), sequence, version)
    rounds = data.draw(st.lists(st.tuples(micro_batches(operation, sequence, 2, 2), st.booleans()), min_size=1, max_size=3), label="rounds")
    # lakesink's compaction between the two commits of a round, as maintenance beside the streams runs it.
    compactions = data.draw(st.lists(st.booleans(), min_size=len(rounds), max_size=len(rounds)), label="compact")
    with Harness(config) as harness:
        model = Model(config)
        for r, (pair, b_first) in enumerate(rounds):
            batches = label_batches(config, pair, tag=f"r{r}")
            plans = [harness.on_host(harness.plan(), host) for host in (0, 1)]
            # Two queries (each its own epochs), each batch's tasks on its job's host.
            messages = [
                [
                    write_task(plans[job], iter([to_arrow(config, rows) for rows in task]), TaskIdentity(t, 0, r, f"query-{job}"))
                    for t, task in enumerate(batches[job])
                ]
                for job in (0, 1)
            ]
            for job in ((1, 0) if b_first else (0, 1)):
                outcome = harness.commit(plans[job], messages[job], r)
                model.apply_batch(batches[job])
                note(f"round {r} job {job}: {outcome.skipped_reason or 'committed'}, {outcome.keys_redecided} decided at commit")
                event("keys decided at commit" if outcome.keys_redecided else "no key decided at commit")
                harness.assert_matches(model.expected(), f"round {r}, after job {job}")
                if compactions[r] and job == (1 if b_first else 0) and harness.table().metadata.current_snapshot() is not None:
                    result = compact(harness.table(), budget_bytes=1 << 40, tiered=False)
                    note(f"round {r}: {result.describe()}")
                    harness.assert_matches(model.expected(), f"round {r}, after the compaction")
