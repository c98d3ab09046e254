"""Key shards (issue 36): a host holds and updates only the shards its tasks get.

Rows are routed as `cluster_by_key` routes them (the route value Spark would compute,
here from the Python replica of its hash, which tests/integration/test_key_clustering.py
checks against Spark itself), each shard's task runs the production path (plan_write ->
write_task -> commit_write) on a host (an index directory) that may change from batch to
batch, as when an executor is lost, and the table is compared with the dict model of
tests/keyed_model.py through DuckDB and pyiceberg. Unrouted writes (a batch job, another
stream) and compactions land between routed batches; every shard's index must follow them
and hold no key of another shard.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from keyed_model import Change, Config, Harness, Model, arrow_schema, label_batches, micro_batches, spark_schema
from pyspark.sql import types as T

from lakesink_datasource.index import published
from lakesink_datasource.index.for_write import index_location
from lakesink_datasource.index.key_columns import KeyColumns
from lakesink_datasource.index.key_shards import (
    NO_SHARD,
    SHARD_COLUMN,
    SHARD_NAME_PREFIXES,
    KeyShard,
    decode_shard,
    file_shard,
    key_fingerprint,
    shard_of_key_texts,
    shard_of_keys,
    shard_values,
    text_misclustered,
)
from lakesink_datasource.index.sharded_index import open_sharded
from lakesink_datasource.index.spark_hash import xxhash64
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.changes import KeyedInputError
from lakesink_datasource.write.task import TaskIdentity, write_task

SHARDS = 3
ROUTED_QUERY = "routed-query"  # the streaming query the routed batches run as (it keeps its own indexes)


# --------------------------------------------------------------------------- the route


@pytest.mark.parametrize("shards, partitions", [(1, 1), (2, 2), (3, 8), (16, 16), (200, 200)])
def test_route_values_name_their_shard_and_key(shards: int, partitions: int) -> None:
    values = shard_values(shards, partitions, ["Tenant", "id"])
    assert len(set(values)) == shards
    for shard, value in enumerate(values):
        route, fingerprint = decode_shard(value)
        assert route == KeyShard(shard, shards)
        assert fingerprint == key_fingerprint(["tenant", "ID"]) != key_fingerprint(["id", "tenant"])
        assert 0 < value < 1 << 63


@pytest.mark.parametrize("shards, partitions", [(1, 1), (3, 8), (200, 200)])
def test_a_text_routes_values_say_so_and_its_shards_are_apart_from_a_typed_routes(shards: int, partitions: int) -> None:
    """A write routed to many tables: its route values decode to text shards, whose index
    directories and file tags differ from a typed route's, so neither reads the other's."""
    for shard, value in enumerate(shard_values(shards, partitions, None)):
        route, fingerprint = decode_shard(value)
        assert route == KeyShard(shard, shards, by_text=True) != KeyShard(shard, shards)
        assert fingerprint == 0 and 0 < value < 1 << 63
        typed = KeyShard(shard, shards)
        assert route.name() != typed.name() and route.file_tag() != typed.file_tag()
        path = f"s3://b/t/data/00000-0-abc-{route.file_tag()}-00000.parquet"
        assert file_shard(path) == route
        other = KeyShard((shard + 1) % shards, shards)
        assert not typed.skips(path) and not other.skips(path)  # another kind's file: read, then filtered by key
        assert KeyShard((shard + 1) % shards, shards, by_text=True).skips(path) == (shards > 1)


def test_a_text_shards_index_and_published_copies_are_named_as_a_shards() -> None:
    """Published copies of a text shard's index live in a shard folder (not taken for a copy
    of the whole index, which pruning and orphan removal count), and its owner names it."""
    from lakesink_datasource.index.owner import index_owner

    for route in (KeyShard(3, 8), KeyShard(3, 8, by_text=True)):
        assert route.name().startswith(SHARD_NAME_PREFIXES)
        owner = index_owner(f"/idx/0a1b.query-abc.{route.name()}")
        assert owner.endswith(f"#{route.name().removeprefix('key-')}")
    assert "#" not in index_owner("/idx/0a1b.query-abc")


def test_a_text_shard_keeps_the_keys_whose_texts_hash_to_it_whatever_the_key_order() -> None:
    table = pa.table({"b_id": pa.array(range(1000), pa.int32()), "A": [f"k{i}" for i in range(1000)]})
    seen = np.zeros(1000, dtype=int)
    for shard in range(3):
        kept, mask = KeyColumns(("b_id", "A"), (), KeyShard(shard, 3, by_text=True)).own_rows(table)
        assert mask is not None
        seen += mask
        # Hashed by name order (A before b_id) over the texts of the values, as Spark hashes the key's JSON fields.
        texts = [kept["A"], pa.array([str(i) for i in kept["b_id"].to_pylist()])]
        assert (np.mod(xxhash64(texts), 3) == shard).all()
    assert (seen == 1).all()
    routes = pa.array(shard_values(3, 3, None), pa.int64())
    wrong = text_misclustered(pa.array([routes[0].as_py(), routes[1].as_py(), NO_SHARD]), [pa.array(["k1", "k1", "k1"])])
    right = int(shard_of_key_texts([pa.array(["k1"])], 3)[0])
    assert wrong.tolist() == [right != 0, right != 1, True]


def test_a_key_belongs_to_exactly_one_shard() -> None:
    ids = pa.array(np.arange(-5000, 5000, dtype=np.int64))
    names = pa.array([f"name-{i}" for i in range(10_000)])
    table = pa.table({"id": ids, "name": names})
    seen = np.zeros(len(ids), dtype=int)
    for shard in range(4):
        columns = KeyColumns(("id", "name"), (), KeyShard(shard, 4))
        kept, mask = columns.own_rows(table)
        assert mask is not None and kept.num_rows == int(mask.sum())
        seen += mask
        # Rows are kept in their order, and what is kept is exactly the shard's.
        assert (shard_of_keys([kept["id"], kept["name"]], 4) == shard).all()
    assert (seen == 1).all()
    counts = np.bincount(shard_of_keys([ids, names], 4), minlength=4)
    assert counts.min() > 2000, f"shards are uneven: {counts}"  # 10,000 keys, 4 shards
    assert KeyColumns(("id",)).own_rows(table) == (table, None)


# --------------------------------------------------------------------------- routed batches


def routed_schema(config: Config) -> T.StructType:
    return T.StructType([*spark_schema(config).fields, T.StructField(SHARD_COLUMN, T.LongType(), False)])


def route_batch(batch: list[list[list[dict]]], shards: int) -> dict[int, list[list[dict]]]:
    """A batch's rows as cluster_by_key hands them to tasks: shard -> the shard's task
    (its rows of each incoming Arrow batch, in order; a key's rows all in one task)."""
    tasks: dict[int, list[list[dict]]] = {}
    for task in batch:
        for rows in task:
            ids = pa.array([r["id"] for r in rows], type=pa.int64())
            shard_of = shard_of_keys([ids], shards).tolist() if rows else []
            for shard in range(shards):
                part = [r for r, s in zip(rows, shard_of) if s == shard]
                if part:
                    tasks.setdefault(shard, []).append(part)
    return tasks


def run_routed(harness: Harness, batch: list[list[list[dict]]], batch_id: int, hosts: list[int]) -> list:
    """Write a batch routed by key shard, shard r's task on host hosts[r]; commit it."""
    plan, messages = write_routed(harness, batch, batch_id, hosts)
    harness.commit(plan, messages, batch_id)
    return decode_messages(messages)


def write_routed(harness: Harness, batch: list[list[list[dict]]], batch_id: int, hosts: list[int]) -> tuple[WritePlan, list]:
    """Plan a batch routed by key shard and run its tasks, shard r's on host hosts[r]."""
    plan = plan_write(harness.options, routed_schema(harness.config), overwrite=False)
    assert plan.keyed is not None and plan.keyed.clustered
    values = shard_values(SHARDS, SHARDS, ["id"])
    messages = []
    for partition, (shard, task) in enumerate(sorted(route_batch(batch, SHARDS).items())):
        batches = [
            pa.RecordBatch.from_pylist(rows, schema=arrow_schema(harness.config)).append_column(
                SHARD_COLUMN, pa.array([values[shard]] * len(rows), type=pa.int64())
            )
            for rows in task
        ]
        who = TaskIdentity(partition_id=partition, batch_id=batch_id, query_id=ROUTED_QUERY)
        messages.append(write_task(harness.on_host(plan, hosts[shard]), iter(batches), who=who))
        # Each shard's task runs in its own executor process, which publishes on its own: one
        # process here, so a copy in flight must not make the next shard's task skip its turn.
        published.wait_for_publishing()
    return plan, messages


def shard_index_path(harness: Harness, host: int, shard: int) -> str:
    return index_location(harness.host_dir(host), harness.table().metadata, KeyShard(shard, SHARDS), writer=ROUTED_QUERY)


def assert_shards_hold_only_their_keys(harness: Harness, keys: range) -> None:
    ids = pa.array(list(keys), type=pa.int64())
    shard_of = shard_of_keys([ids], SHARDS)
    from lakesink_datasource.index.key_encoding import encode_keys

    encoded = encode_keys([ids])
    for host in (0, 1):
        for shard in range(SHARDS):
            path = shard_index_path(harness, host, shard)
            if not os.path.isdir(path):
                continue
            index = open_sharded(path, 1)
            found = [loc is not None for loc in index.lookup(encoded)]
            strays = [k for k, hit, s in zip(keys, found, shard_of.tolist()) if hit and s != shard]
            assert strays == [], f"host {host}'s index of shard {shard} holds keys of other shards: {strays}"


CONFIGS = [Config("cdc", "bucket(2, id)", True), Config("upsert", None, False), Config("dedupe", "days(ts)", False), Config("cdc", None, True, 2)]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
@settings(max_examples=examples(12), deadline=None)
@given(data=st.data())
def test_routed_batches_on_moving_shards_match_the_model(config: Config, data: st.DataObject) -> None:
    """Shards run on two hosts and move between them; unclustered writes and compactions land
    between routed batches, or an unrouted batch on the same keys commits beside a routed one
    (either first). The table matches the model (in commit order) after every batch, and no
    shard's index holds another shard's key."""
    batches = data.draw(micro_batches(config.operation, config.sequence, 2, 5), label="batches")
    labelled = label_batches(config, batches)
    with Harness(config) as harness:
        model = Model(config)
        for batch_id, batch in enumerate(labelled):
            kind = data.draw(st.sampled_from(["routed", "routed", "unrouted", "concurrent"]), label=f"batch {batch_id}")
            if kind == "concurrent":
                # A routed batch and an unrouted one on the same keys (the same changes, other
                # labels), both planned on this snapshot, committed in either order: the later
                # decides the shared keys at commit, and the shard indexes follow.
                hosts = data.draw(st.lists(st.integers(0, 1), min_size=SHARDS, max_size=SHARDS), label=f"hosts of batch {batch_id}")
                routed_first = data.draw(st.booleans(), label=f"routed commits first in batch {batch_id}")
                other = label_batches(config, [batches[batch_id]], tag="u")[0]
                routed_plan, routed_messages = write_routed(harness, batch, batch_id, hosts)
                plain_plan = harness.plan()
                plain_messages = [harness.write(plain_plan, task, batch_id, partition_id=i) for i, task in enumerate(other)]
                sides = [
                    (routed_plan, routed_messages, [t for _s, t in sorted(route_batch(batch, SHARDS).items())]),
                    (plain_plan, plain_messages, other),
                ]
                for plan, messages, applied in sides if routed_first else sides[::-1]:
                    outcome = harness.commit(plan, messages, batch_id)
                    event("keys decided at commit" if outcome.keys_redecided else "no key decided at commit")
                    model.apply_batch(applied)
                note(f"batch {batch_id}: routed (hosts {hosts}) and unrouted at once, routed first: {routed_first}")
            elif kind == "routed":
                hosts = data.draw(st.lists(st.integers(0, 1), min_size=SHARDS, max_size=SHARDS), label=f"hosts of batch {batch_id}")
                note(f"batch {batch_id}: routed, shards on hosts {hosts}")
                results = run_routed(harness, batch, batch_id, hosts)
                assert all(r.host for r in results)
                model.apply_batch([task for _shard, task in sorted(route_batch(batch, SHARDS).items())])
            else:
                note(f"batch {batch_id}: unrouted, on host 0's whole index")
                harness.run_batch(batch, batch_id)
                model.apply_batch(batch)
            harness.assert_matches(model.expected(), f"after batch {batch_id} ({kind})")
            if data.draw(st.booleans(), label=f"compact after {batch_id}") and harness.table().metadata.current_snapshot() is not None:
                result = compact(harness.table(), budget_bytes=1 << 40, tiered=False)
                event("compacted" if result.snapshot_id is not None else "nothing to compact")
        assert_shards_hold_only_their_keys(harness, range(16))


def test_a_task_given_rows_of_two_shards_refuses_before_writing() -> None:
    config = Config("upsert")
    with Harness(config) as harness:
        plan = plan_write(harness.options, routed_schema(config), overwrite=False)
        values = shard_values(2, 1, ["id"])  # two shards, one partition: both land in it
        batch = pa.RecordBatch.from_pylist(
            [{"id": 1, "v": "a", "ts": None}, {"id": 2, "v": "b", "ts": None}], schema=arrow_schema(config)
        ).append_column(SHARD_COLUMN, pa.array(values, type=pa.int64()))
        with pytest.raises(KeyedInputError, match=r"rows of key shards 0, 1 of 2: a task must hold one key shard.*shards=") as info:
            write_task(plan, iter([batch]), who=TaskIdentity(batch_id=0, query_id="q"))
        assert "Nothing was written" in str(info.value)
        assert harness.table().metadata.current_snapshot() is None


def test_rows_routed_by_other_columns_than_the_key_are_refused() -> None:
    config = Config("upsert")
    with Harness(config) as harness:
        plan = plan_write(harness.options, routed_schema(config), overwrite=False)
        value = shard_values(1, 1, ["v"])[0]  # routed by v, the key is id
        batch = pa.RecordBatch.from_pylist([{"id": 1, "v": "a", "ts": None}], schema=arrow_schema(config)).append_column(
            SHARD_COLUMN, pa.array([value], type=pa.int64())
        )
        with pytest.raises(KeyedInputError, match=r"routed by cluster_by_key on other columns than the write's primary key \(id\)"):
            write_task(plan, iter([batch]), who=TaskIdentity(batch_id=0, query_id="q"))


# --------------------------------------------------------------------------- shards that move


@pytest.fixture
def publish_often(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(published, "MIN_KEYS", 0)
    monkeypatch.setattr(published, "MIN_CHANGED_ROWS", 0)
    monkeypatch.setattr(published, "CHANGED_FRACTION", 0)


def _copies_by_shard(harness: Harness) -> dict[int, list[str]]:
    table = harness.table()
    return {s: published.complete_copies(table.io, published.copies_root(table.metadata, KeyShard(s, SHARDS))) for s in range(SHARDS)}


@pytest.mark.parametrize("damaged", [False, True], ids=["copy", "damaged-copy"])
def test_a_shard_that_moves_starts_from_its_own_published_copy(publish_often: None, damaged: bool) -> None:
    """Shard copies are published per shard; a host that gets a shard it never held fetches
    that shard's copy (or, when it is damaged, rebuilds that shard alone from the table)
    and walks that shard's changes since."""
    config = Config("cdc", "bucket(2, id)", True)
    batches = label_batches(config, [
        [[[Change(k, "c", seq=1) for k in range(16)]]],
        [[[Change(k, "d" if k % 5 == 0 else "u", seq=2) for k in range(0, 16, 2)]]],
        [[[Change(k, "u", seq=3) for k in range(16)]]],
        [[[Change(k, "u", seq=4) for k in range(1, 16, 3)]]],
    ])
    with Harness(config) as harness:
        model = Model(config)
        for batch_id in (0, 1, 2):  # every shard on host 0; batch 1's and 2's syncs publish copies
            run_routed(harness, batches[batch_id], batch_id, [0] * SHARDS)
            model.apply_batch([task for _s, task in sorted(route_batch(batches[batch_id], SHARDS).items())])
        published.wait_for_publishing()
        copies = _copies_by_shard(harness)
        assert all(copies.values()), f"a shard published no copy: {copies}"
        table = harness.table()
        top = published.copies_root(table.metadata)
        # The whole index's folder holds none of them: a host of the whole index never takes a shard's copy.
        assert published.complete_copies(table.io, top) == []
        kept = published.kept_files(table.io, table.metadata)
        assert {p.split("/_lakesink_index/")[1].split("/")[0] for p in kept} == {KeyShard(s, SHARDS).name() for s in range(SHARDS)}
        if damaged:  # every copy of every shard: a page overwritten, its SHA-256 no longer matches
            for shard in range(SHARDS):
                for name in copies[shard]:
                    path = f"{published.copies_root(table.metadata, KeyShard(shard, SHARDS))}/{name}/shard-00.mdb".removeprefix("file://")
                    with open(path, "r+b") as f:
                        f.seek(4096)
                        f.write(b"\x00" * 64)
        # Shard 1 moves to host 1 (its executor was lost); the others stay.
        results = run_routed(harness, batches[3], 3, [0, 1, 0])
        model.apply_batch([task for _s, task in sorted(route_batch(batches[3], SHARDS).items())])
        harness.assert_matches(model.expected(), "after shard 1 moved")
        moved = [r for r in results if r.host.endswith(_digest_of(harness, 1, 1))]
        stayed = [r for r in results if r not in moved]
        assert len(moved) == 1
        expected_start = "rebuilt from the table" if damaged else "fetched from a published copy"
        assert moved[0].index_sync.startswith(expected_start), moved[0].index_sync
        assert all(r.index_sync.startswith("caught up") or r.index_sync == "current" for r in stayed), [r.index_sync for r in stayed]
        # Host 1 holds shard 1 alone.
        assert not os.path.isdir(shard_index_path(harness, 1, 0)) and not os.path.isdir(shard_index_path(harness, 1, 2))
        assert_shards_hold_only_their_keys(harness, range(16))


def _digest_of(harness: Harness, host: int, shard: int) -> str:
    from lakesink_datasource.index.owner import index_owner

    return index_owner(shard_index_path(harness, host, shard)).split(":", 1)[1]


def test_routed_files_and_their_compactions_hold_one_shard_each() -> None:
    """A routed task's files carry its shard in their names, and lakesink's compaction
    merges one shard's files only: another shard's index skips them unread."""
    import pyarrow.parquet as pq

    from lakesink_datasource.iceberg.live_files import live_data_files
    from lakesink_datasource.index.key_shards import file_shard

    config = Config("upsert", "bucket(2, id)", False)
    batches = label_batches(config, [[[[Change(k) for k in range(b, 16)]]] for b in range(4)])
    with Harness(config) as harness:
        for batch_id, batch in enumerate(batches):
            run_routed(harness, batch, batch_id, [0, 1, 0])
        before = live_data_files(harness.table().io, harness.table().metadata.current_snapshot())
        result = compact(harness.table(), budget_bytes=1 << 40, tiered=False)
        assert result.snapshot_id is not None
        table = harness.table()
        after = live_data_files(table.io, table.metadata.current_snapshot())
        assert result.files_written and len(after) < len(before)
        for entry in after:
            route = file_shard(entry.data_file.file_path)
            assert route is not None and route.shards == SHARDS, entry.data_file.file_path
            ids = pq.read_table(entry.data_file.file_path.removeprefix("file://"), columns=["id"])["id"]
            assert (shard_of_keys([ids], SHARDS) == route.shard).all()
        # The next routed batch follows the compaction on every host without a rebuild.
        model = Model(config)
        for batch in batches:
            model.apply_batch([task for _s, task in sorted(route_batch(batch, SHARDS).items())])
        more = label_batches(config, [[[[Change(k) for k in range(0, 16, 3)]]]], tag="x")[0]
        results = run_routed(harness, more, 4, [0, 1, 0])
        model.apply_batch([task for _s, task in sorted(route_batch(more, SHARDS).items())])
        harness.assert_matches(model.expected(), "after the compaction and one more batch")
        assert not any(r.index_sync.startswith(("rebuilt", "fetched")) for r in results), [r.index_sync for r in results]
