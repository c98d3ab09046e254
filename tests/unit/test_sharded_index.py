"""The key index split into shards, against real LMDB environments: the same undo contract
as one environment, keys spread over shards, and tasks of several processes changing the
same keys at once without losing a change."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from index_model import check_against_model, operation, run_workers

from lakesink_datasource.index.environment import IndexState
from lakesink_datasource.index.key_encoding import encode_keys, key_hashes
from lakesink_datasource.index.location_codec import Found, Location, pack_positions
from lakesink_datasource.index.sharded_index import SHARDS, drop_sharded, open_sharded


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, max_size=25))
def test_random_applies_commits_and_rollbacks_match_dict_model(tmp_path_factory: pytest.TempPathFactory, ops: list) -> None:
    ix = open_sharded(str(tmp_path_factory.mktemp("sharded")))
    try:
        check_against_model(ix, ops, pending_in_order=False)
    finally:
        drop_sharded(ix.path)


def test_keys_spread_over_every_shard_and_overwrite_round_trips(tmp_path: Path) -> None:
    ix = open_sharded(str(tmp_path / "idx"))
    keys = [b"key-%06d" % i for i in range(4_000)]
    ordinal = ix.file_ordinal("data/a.parquet")
    ix.overwrite_packed(keys, pack_positions(ordinal, np.arange(len(keys), dtype=np.uint64)))
    per_shard = [shard.count() for shard in ix.shards]
    assert len(per_shard) == SHARDS and sum(per_shard) == len(keys)
    assert min(per_shard) > len(keys) / SHARDS / 2  # a hash, not a range: no shard is left out
    assert ix.lookup([keys[7], b"absent", keys[3_999]]) == [Location(ordinal, 7), None, Location(ordinal, 3_999)]
    assert ix.file_path(ordinal) == "data/a.parquet" and ix.file_count() == 1
    drop_sharded(ix.path)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=30))
def test_shard_hash_ignores_only_the_last_byte(keys: list[bytes]) -> None:
    assert key_hashes(keys, drop_last_byte=True).tolist() == key_hashes([k[:-1] for k in keys]).tolist()


def test_neighbouring_integer_keys_share_a_shard(tmp_path: Path) -> None:
    """Runs of 256 consecutive integer keys (the encoding's last byte) land in one shard, so a
    chunk's rows, written shard after shard, stay mostly in key order."""
    ix = open_sharded(str(tmp_path / "idx"))
    keys = encode_keys([pa.array(np.arange(4096, dtype=np.int64))], names=["id"])
    ix.overwrite_packed(keys, pack_positions(0, np.arange(len(keys), dtype=np.uint64)))
    holders = [next(s for s, shard in enumerate(ix.shards) if shard.lookup([k])[0] is not None) for k in keys]
    runs = [set(holders[i : i + 256]) for i in range(0, 4096, 256)]
    assert all(len(run) == 1 for run in runs)
    assert len({next(iter(run)) for run in runs}) >= 4  # the 16 runs still spread over shards
    drop_sharded(ix.path)


def test_state_is_reported_only_when_every_shard_agrees(tmp_path: Path) -> None:
    ix = open_sharded(str(tmp_path / "idx"))
    new, old = IndexState("t", snapshot_id=2), IndexState("t", snapshot_id=1)
    ix.set_state(old)
    assert ix.get_state() == old
    ix.shards[3].set_state(new)  # what a crash between two shards' state writes leaves
    assert ix.get_state() is None
    ix.set_state(new)
    assert ix.get_state() == new
    ix.files.clear()  # a damaged file table that open_index replaced with an empty one
    assert ix.get_state() is None
    ix.commit_tokens([], new)
    assert ix.get_state() == new
    ix.shards[0].begin_catch_up("t/9")
    assert ix.catch_up_under_way() == "t/9"
    ix.clear()
    assert ix.get_state() is None and ix.count() == 0 and ix.catch_up_under_way() is None
    drop_sharded(ix.path)


def test_the_one_environment_layout_is_replaced(tmp_path: Path) -> None:
    from lakesink_datasource.index.environment import drop_index, open_index
    from lakesink_datasource.index.key_shard import KeyShard

    path = str(tmp_path / "idx")
    old = open_index(KeyShard, path)
    old.apply("t", [(b"k", Location(1, 2))], [])
    old.close()
    ix = open_sharded(path)
    assert not os.path.exists(os.path.join(path, "data.mdb"))
    assert ix.count() == 0 and ix.get_state() is None  # no state: the next sync rebuilds
    drop_sharded(path)
    drop_index(path)


# ------------------------------------------------------------------------ multi-process

ROUNDS = 40
KEY_COUNT = 2_000


def _increment(which: np.ndarray, found: Found, ordinal_of: object) -> tuple[np.ndarray, list[bytes | None]]:
    """Every key's position counts the changes made to it: a lost update shows as a short count."""
    return np.arange(len(which)), list(pack_positions(0, (found.position + 1).astype(np.uint64)))


def _child_increments(path: str, worker: int) -> None:
    ix = open_sharded(path)
    keys = [b"key-%05d" % i for i in range(KEY_COUNT)]
    for round_ in range(ROUNDS):
        ix.transact(f"w/{worker}/{round_}", keys, _increment)


@pytest.mark.child
def test_tasks_of_two_processes_change_the_same_keys_without_losing_one(tmp_path: Path) -> None:
    path = str(tmp_path / "idx")
    parent = open_sharded(path)
    run_workers(_child_increments, path)
    try:
        keys = [b"key-%05d" % i for i in range(KEY_COUNT)]
        counts = Counter(loc.position for loc in parent.lookup(keys) if loc is not None)
        assert counts == Counter({2 * ROUNDS: KEY_COUNT})
        assert len(parent.pending_tokens()) == 2 * ROUNDS
        # Undo per shard, however the two workers' writes interleaved: rolling back every
        # token restores the committed state (no key at all).
        parent.rollback_tokens(parent.pending_tokens())
        assert parent.count() == 0 and parent.pending_tokens() == []
    finally:
        drop_sharded(path)
