"""Keyed writes on several hosts, and other writers' row-level changes, are followed by every
host's key index without a rebuild (issue 27).

Two hosts are two index directories in one process (what two Spark workers with their own
HOME keep); a batch's keys are clustered by host (even keys on host 0, odd ones on host 1),
as `df.repartition(n, key)` makes them, and the hosts trade keys between batches, as
Spark's task placement does. Every batch runs the production path (plan_write ->
write_task per task -> commit_write) and is compared with the dict model of
`tests/keyed_model.py` through DuckDB and pyiceberg; what each task's sync did to its host's
index (`TaskResult.index_sync`) says whether it rebuilt.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from keyed_model import Change, Config, Harness, Model, arrow_schema, in_order_sequences, label_batches, micro_batches
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.index import published
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

CONFIGS = [Config("cdc", None, True), Config("cdc", "bucket(4, id)", False), Config("upsert", None, False), Config("dedupe", "days(ts)", False)]
IDS = [str(c) for c in CONFIGS]


def split_by_host(batch: list[list[list[dict]]], shift: int = 0) -> tuple[list[list[list[dict]]], list[int]]:
    """Each task's rows split in two tasks by key parity (host (id + shift) % 2): every row
    of a key stays in one task, in its order, so the model applies the batch unchanged."""
    tasks, hosts = [], []
    for task in batch:
        for host in (0, 1):
            tasks.append([[r for r in rows if (r["id"] + shift) % 2 == host] for rows in task])
            hosts.append(host)
    return tasks, hosts


def _rebuilt(results: list) -> list[str]:
    return [r.index_sync for r in results if r.index_sync.startswith(("rebuilt", "fetched"))]


def _run(harness: Harness, model: Model, batch: list, batch_id: int, shift: int, *, first: bool) -> list:
    tasks, hosts = split_by_host(batch, shift)
    outcome, results = harness.run_batch_on_hosts(tasks, batch_id, hosts)
    model.apply_batch(batch)
    harness.assert_matches(model.expected(), f"after batch {batch_id} ({outcome.skipped_reason or 'committed'})")
    if not first:
        assert _rebuilt(results) == [], f"batch {batch_id}: a host's index started over: {_rebuilt(results)}"
    return results


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_batches_made_on_two_hosts_are_caught_up_without_a_rebuild(config: Config) -> None:
    """The cause of 'keyed writes stop scaling at the second host': every host rebuilt its
    whole index after every batch another host took part in."""
    seq = config.sequence
    batches = [
        [[[Change(k, "c", seq=1, day=k % 3) for k in range(12)]]],
        [[[Change(k, "d" if k % 3 == 0 else "u", seq=2, day=1) for k in range(0, 12, 2)] + [Change(k, "u", seq=2, day=2) for k in range(1, 12, 4)]]],
        [[[Change(k, "c", seq=3, day=0) for k in range(0, 12, 3)]], [[Change(k, "d", seq=4) for k in (5, 7)]]],
        [[[Change(k, "u", seq=1 if seq else None, day=3) for k in range(12)]]],  # late (older) changes when sequenced
    ]
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            results = _run(harness, model, batch, batch_id, shift=batch_id, first=batch_id == 0)
            if batch_id:
                # Each host followed the other's part of the previous batch (and its own tokens).
                assert {r.index_sync for r in results} <= {"caught up 1 snapshot(s)", "current"}, [r.index_sync for r in results]


def _plain_write(harness: Harness, rows: list[dict], *, overwrite: bool = False, **options: str) -> None:
    """Another writer: a plain (not keyed) lakesink write, which reports no keys."""
    schema = T.StructType([f for f in harness.schema.fields if f.name != "op"])
    raw = {"table": harness.options.table, "warehouse": harness.warehouse, "progress": "false", **options}
    plan = plan_write(parse_options(raw), schema, overwrite)
    stored = pa.schema([f for f in arrow_schema(harness.config) if f.name != "op"])
    arrow = pa.RecordBatch.from_pylist([{k: v for k, v in r.items() if k != "op"} for r in rows], schema=stored)
    results = decode_messages([write_task(plan, iter([arrow]), who=TaskIdentity())])
    commit_write(plan, results, None)


@pytest.mark.parametrize("config", [Config("upsert", None, False), Config("cdc", "bucket(4, id)", True)], ids=["upsert", "cdc-seq"])
def test_another_writers_upsert_and_row_level_delete_are_followed_without_a_rebuild(config: Config) -> None:
    """Between two-host batches: another lakesink job (its own index) upserts and deletes
    keys, and a plain overwrite with replace_where deletes rows by deletion vectors (no
    keys reported: the index reads them back from the positions)."""
    first = label_batches(config, [[[[Change(k, "c", seq=1, day=0) for k in range(10)]]]])[0]
    other = label_batches(config, [[[[Change(k, "u", seq=5, day=1) for k in (1, 2, 3)] + [Change(k, "d", seq=5) for k in (4,)]]]], tag="o")[0]
    after = label_batches(config, [[[[Change(k, "u", seq=9, day=2) for k in range(10)]]]], tag="a")[0]
    with Harness(config) as harness:
        model = Model(config)
        _run(harness, model, first, 0, 0, first=True)
        # Another lakesink job with an index of its own (a third host). The two hosts then walk
        # batch 0 (the other host's part), that batch and the delete.
        harness.run_batch_on_hosts(other, 1, [2])
        model.apply_batch(other)
        # A row-level delete by a writer that reports no keys: rows 6 and 7 hidden by DVs.
        _plain_write(harness, [], overwrite=True, replace_where="id IN (6, 7)")
        for key in (6, 7):
            model.live.pop(key, None)
        harness.assert_matches(model.expected(), "after the other writers")
        results = _run(harness, model, after, 2, 1, first=False)
        assert {r.index_sync for r in results} <= {"caught up 3 snapshot(s)", "current"}, [r.index_sync for r in results]


@settings(max_examples=examples(10))
@given(data=st.data())
def test_two_hosts_and_other_writers_match_the_model(data: st.DataObject) -> None:
    """Interleavings of two-host batches (keys clustered by a parity that changes from batch
    to batch), batches of a third host, and row-level deletes of a writer reporting no keys:
    readers see the model's rows after every step, and no host rebuilds after its first."""
    config = data.draw(st.sampled_from(CONFIGS), label="config")
    raw = data.draw(micro_batches(config.operation, config.sequence, 2, 5), label="batches")
    batches = label_batches(config, in_order_sequences(raw) if config.sequence else raw)
    with Harness(config) as harness:
        model = Model(config)
        seen = {0: False, 1: False, 2: False}
        for batch_id, batch in enumerate(batches):
            step = data.draw(st.sampled_from(["two hosts", "third host", "plain delete"]) if batch_id else st.just("two hosts"), label=f"step {batch_id}")
            note(f"batch {batch_id}: {step}")
            if step == "plain delete" and model.live:
                doomed = data.draw(st.lists(st.sampled_from(sorted(model.live)), min_size=1, max_size=3, unique=True), label="deleted")
                _plain_write(harness, [], overwrite=True, replace_where=f"id IN ({', '.join(map(str, doomed))})")
                for key in doomed:
                    model.live.pop(key, None)
                harness.assert_matches(model.expected(), f"after the plain delete before batch {batch_id}")
            if step == "third host":
                _outcome, results = harness.run_batch_on_hosts(batch, batch_id, [2] * len(batch))
                model.apply_batch(batch)
                hosts = [2] * len(batch)
            else:
                shift = data.draw(st.integers(0, 1), label=f"parity {batch_id}")
                tasks, hosts = split_by_host(batch, shift)
                _outcome, results = harness.run_batch_on_hosts(tasks, batch_id, hosts)
                model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id}")
            for host, result in zip(hosts, results):
                if seen[host]:
                    assert not result.index_sync.startswith(("rebuilt", "fetched")), f"host {host}: {result.index_sync}"
                seen[host] = True


def test_an_attempt_lost_with_its_executor_is_undone_on_its_host() -> None:
    """Task 0's first attempt ran on host 0 and its executor died before reporting; Spark ran
    it again on host 1. Host 0's index holds the lost attempt's changes under its undo
    token: the batch's summary lists the attempts it committed, so host 0 rolls the lost
    one back instead of taking it as its part of the batch."""
    config = Config("upsert", None, False)
    labelled = label_batches(config, [[[[Change(k, "c") for k in range(6)]]], [[[Change(k, "u") for k in (0, 2, 4)]]], [[[Change(k, "u") for k in range(6)]]]])
    with Harness(config) as harness:
        model = Model(config)
        _run(harness, model, labelled[0], 0, 0, first=True)
        plan = harness.plan()
        harness.write(harness.on_host(plan, 0), labelled[1][0], 1, partition_id=0, attempt=0)  # lost: never reported
        retried = harness.write(harness.on_host(plan, 1), labelled[1][0], 1, partition_id=0, attempt=1)
        other = harness.write(harness.on_host(plan, 0), [[]], 1, partition_id=1)
        harness.commit(plan, [retried, other], 1)
        model.apply_batch(labelled[1])
        harness.assert_matches(model.expected(), "after the batch with a lost attempt")
        results = _run(harness, model, labelled[2], 2, 0, first=False)
        assert all(not r.index_sync.startswith("rebuilt") for r in results)


@pytest.fixture
def publish_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(published, "MIN_KEYS", 0)
    monkeypatch.setattr(published, "MIN_CHANGED_ROWS", 0)
    monkeypatch.setattr(published, "CHANGED_FRACTION", 0)


def test_a_cold_host_starts_from_a_published_copy_and_catches_up(publish_often: None) -> None:
    config = Config("cdc", "bucket(4, id)", True)
    labelled = label_batches(config, [
        [[[Change(k, "c", seq=1) for k in range(20)]]],
        [[[Change(k, "d" if k % 4 == 0 else "u", seq=2) for k in range(0, 20, 2)]]],
        [[[Change(k, "u", seq=3) for k in range(20)] + [Change(k, "c", seq=1) for k in (0, 4)]]],  # late inserts of deleted keys
    ])
    with Harness(config) as harness:
        model = Model(config)
        _run(harness, model, labelled[0], 0, 0, first=True)
        _run(harness, model, labelled[1], 1, 0, first=False)
        published.wait_for_publishing()
        table = harness.table()
        copies = published.complete_copies(table.io, published.copies_root(table.metadata))
        assert copies, "no copy was published"
        # Host 2 has never seen the table: it starts from the copy and walks what followed.
        tasks, hosts = [labelled[2][0]], [2]
        _outcome, results = harness.run_batch_on_hosts(tasks, 2, hosts)
        model.apply_batch(labelled[2])
        harness.assert_matches(model.expected(), "after the cold host's batch")
        assert results[0].index_sync.startswith("fetched"), results[0].index_sync


def test_a_damaged_published_copy_is_skipped_and_the_host_rebuilds(publish_often: None) -> None:
    config = Config("upsert", None, False)
    labelled = label_batches(config, [[[[Change(k, "c") for k in range(10)]]], [[[Change(k, "u") for k in range(5)]]], [[[Change(k, "u") for k in range(3, 8)]]]])
    with Harness(config) as harness:
        model = Model(config)
        _run(harness, model, labelled[0], 0, 0, first=True)
        _run(harness, model, labelled[1], 1, 0, first=False)  # its syncs publish a copy of batch 0's snapshot
        published.wait_for_publishing()
        table = harness.table()
        root = published.copies_root(table.metadata)
        (name,) = published.complete_copies(table.io, root)
        shard = f"{root}/{name}/shard-00.mdb".removeprefix("file://")
        with open(shard, "r+b") as f:
            f.seek(4096)
            f.write(b"\x00" * 64)  # one page overwritten: its SHA-256 no longer matches
        _outcome, results = harness.run_batch_on_hosts(labelled[2], 2, [2])
        model.apply_batch(labelled[2])
        harness.assert_matches(model.expected(), "after the batch on the cold host")
        assert results[0].index_sync.startswith("rebuilt from the table in "), results[0].index_sync
        assert results[0].index_sync.endswith("(no index on this host yet (or one whose shards disagree))"), results[0].index_sync
