"""The key index's environments (a key shard, the file table) against real LMDB
environments in temporary directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from index_model import KEYS, TOKENS, check_against_model, operation, run_workers

from lakesink_datasource.index.environment import IndexState, drop_index, open_index
from lakesink_datasource.index.file_table import FileTable
from lakesink_datasource.index.key_shard import KeyShard
from lakesink_datasource.index.location_codec import (
    Found,
    Location,
    decode_locations,
    pack_location,
    pack_positions,
    unpack_location,
)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[KeyShard]:
    ix = open_index(KeyShard, str(tmp_path / "table-uuid"))
    yield ix
    drop_index(ix.path)


def key(i: int) -> bytes:
    return b"key-%06d" % i


def snapshot(ix: KeyShard, keys: list[bytes]) -> dict[bytes, Location]:
    """The mapping restricted to `keys` (the index has no full scan API)."""
    return {k: loc for k, loc in zip(keys, ix.lookup(keys)) if loc is not None}


# ----------------------------------------------------------------------- basic mapping


def test_lookup_after_apply_returns_input_order(index: KeyShard) -> None:
    puts = [(key(i), Location(i % 3, i * 10)) for i in range(50)]
    index.apply("q/0/0", puts, [])
    probe = [key(7), b"missing", key(0), key(7), key(49)]
    assert index.lookup(probe) == [Location(1, 70), None, Location(0, 0), Location(1, 70), Location(1, 490)]
    assert index.count() == 50
    assert index.lookup([]) == []


def test_sequence_round_trips_and_empty_differs_from_none(index: KeyShard) -> None:
    index.apply("t", [(b"a", Location(1, 2, None)), (b"b", Location(1, 3, b"")), (b"c", Location(4, 2**63, b"\x00\xff"))], [])
    assert index.lookup([b"a", b"b", b"c"]) == [Location(1, 2, None), Location(1, 3, b""), Location(4, 2**63, b"\x00\xff")]


def _columns(found: Found) -> tuple[list[bool], list[int], list[int], list[bytes | None] | None]:
    return found.present.tolist(), found.ordinal.tolist(), found.position.tolist(), found.sequence


def test_decode_locations_matches_one_by_one_unpacking() -> None:
    plain = [pack_location(Location(3, 7)), None, pack_location(Location(0xFFFF_FFFF, 2**40))]
    assert _columns(decode_locations(plain)) == ([True, False, True], [3, 0, 0xFFFF_FFFF], [7, 0, 2**40], None)
    mixed = [None, pack_location(Location(1, 2, b"")), pack_location(Location(4, 5)), pack_location(Location(6, 8, b"\x00\xff\x00"))]
    assert _columns(decode_locations(mixed)) == ([False, True, True, True], [0, 1, 4, 6], [0, 2, 5, 8], [None, b"", None, b"\x00\xff\x00"])
    assert _columns(decode_locations([None, None])) == ([False, False], [0, 0], [0, 0], None)
    assert _columns(decode_locations([])) == ([], [], [], None)


@settings(max_examples=examples(200), deadline=None)
@given(
    entries=st.lists(
        st.one_of(st.none(), st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**63 - 1), st.one_of(st.none(), st.binary(max_size=10)))),
        max_size=30,
    ),
    width=st.one_of(st.none(), st.integers(1, 10)),
)
def test_decode_locations_matches_unpacking_one_at_a_time(entries: list, width: int | None) -> None:
    """Bulk decoding gives each stored value's `unpack_location` (absent keys as absent),
    whether the sequences have one width (cut out in bulk) or not, and when some keys lack one."""
    if width is not None:  # the sequences present are all of one width (an encoded number)
        entries = [e if e is None or e[2] is None else (e[0], e[1], e[2].ljust(width, b"\x00")[:width]) for e in entries]
    raw = [None if e is None else pack_location(Location(*e)) for e in entries]
    present, ordinals, positions, sequences = _columns(decode_locations(raw))
    expected = [None if r is None else unpack_location(r) for r in raw]
    assert present == [loc is not None for loc in expected]
    assert ordinals == [loc.file_ordinal if loc else 0 for loc in expected]
    assert positions == [loc.position if loc else 0 for loc in expected]
    if any(loc is not None and loc.sequence is not None for loc in expected):
        assert sequences == [loc.sequence if loc else None for loc in expected]
    else:
        assert sequences is None


def test_deletes_and_last_put_wins_within_one_apply(index: KeyShard) -> None:
    index.apply("t1", [(b"a", Location(0, 1)), (b"b", Location(0, 2))], [])
    index.apply("t2", [(b"a", Location(1, 1)), (b"a", Location(1, 9)), (b"b", Location(1, 2))], [b"b", b"never"])
    assert index.lookup([b"a", b"b", b"never"]) == [Location(1, 9), None, None]
    assert index.count() == 1


def test_long_keys_beyond_lmdb_limit_are_distinct(index: KeyShard) -> None:
    prefix = b"x" * 2000
    long_keys = [prefix + bytes([i]) for i in range(5)] + [b"y" * 511, b"y" * 510]
    index.apply("t", [(k, Location(0, i)) for i, k in enumerate(long_keys)], [])
    assert index.lookup(long_keys) == [Location(0, i) for i in range(len(long_keys))]
    index.rollback_tokens(["t"])
    assert index.lookup(long_keys) == [None] * len(long_keys)
    with pytest.raises(ValueError, match="empty"):
        index.lookup([b""])


# ------------------------------------------------------------------------- file ordinals


def test_file_ordinals_are_idempotent_and_persist(tmp_path: Path) -> None:
    path = str(tmp_path / "idx")
    ix = open_index(FileTable, path)
    assert ix.file_ordinal("s3://b/f0.parquet") == 0
    assert ix.file_ordinals(["s3://b/f1.parquet", "s3://b/f0.parquet", "s3://b/f1.parquet", "s3://b/f2.parquet"]) == [1, 0, 1, 2]
    long_path = "s3://b/" + "p=" * 400 + "f.parquet"
    assert ix.file_ordinal(long_path) == 3
    assert ix.file_path(2) == "s3://b/f2.parquet"
    with pytest.raises(KeyError):
        ix.file_path(99)
    ix.close()
    reopened = open_index(FileTable, path)
    assert reopened is not ix
    assert reopened.file_ordinals([long_path, "s3://b/f1.parquet", "s3://b/new"]) == [3, 1, 4]
    assert reopened.file_path(3) == long_path
    drop_index(path)
    assert not os.path.exists(path)


def test_open_index_is_cached_per_process(tmp_path: Path) -> None:
    path = tmp_path / "idx"
    ix = open_index(KeyShard, str(path))
    assert open_index(KeyShard, str(path / ".." / "idx")) is ix  # keyed by absolute path
    drop_index(str(path))
    assert ix.closed


# ----------------------------------------------------------------------- undo / tokens


def test_rollback_restores_previous_mapping(index: KeyShard) -> None:
    keys = [key(i) for i in range(20)]
    index.apply("q/0/0", [(k, Location(0, i)) for i, k in enumerate(keys[:10])], [])
    index.commit_tokens(["q/0/0"])
    before = snapshot(index, keys)

    index.apply("q/1/0", [(k, Location(1, i)) for i, k in enumerate(keys[5:15])], keys[:3])
    index.apply("q/1/1", [(keys[19], Location(2, 0))], [keys[9]])
    assert snapshot(index, keys) != before
    assert index.pending_tokens() == ["q/1/0", "q/1/1"]

    index.rollback_tokens(["q/1/0", "q/1/1"])
    assert snapshot(index, keys) == before
    assert index.count() == 10
    assert index.pending_tokens() == []


def test_key_touched_twice_under_one_token_rolls_back_to_pre_token_value(index: KeyShard) -> None:
    index.apply("old", [(b"k", Location(0, 0)), (b"gone", Location(0, 1))], [])
    index.commit_tokens(["old"])
    # Two Arrow batches of one task share the token.
    index.apply("q/1/7", [(b"k", Location(1, 0)), (b"new", Location(1, 1))], [b"gone"])
    index.apply("q/1/7", [(b"k", Location(2, 0)), (b"gone", Location(2, 1))], [b"new"])
    assert index.pending_tokens() == ["q/1/7"]
    index.rollback_tokens(["q/1/7"])
    assert index.lookup([b"k", b"gone", b"new"]) == [Location(0, 0), Location(0, 1), None]


def test_commit_drops_undo_so_rollback_is_a_no_op(index: KeyShard) -> None:
    index.apply("a", [(b"k", Location(0, 0))], [])
    index.apply("b", [(b"k", Location(1, 0))], [])
    index.commit_tokens(["a", "b", "unknown"])
    assert index.pending_tokens() == []
    index.rollback_tokens(["a", "b"])
    assert index.lookup([b"k"]) == [Location(1, 0)]
    # Only the token bookkeeping stays in the undo db after commit: nothing at all.
    with index._env.begin() as txn:
        assert txn.stat(index._undo)["entries"] == 0


def test_rollback_does_not_clobber_a_later_surviving_write(index: KeyShard) -> None:
    # A failed attempt's token is rolled back after a retry overwrote the same key and
    # was committed: the retry's value must survive.
    index.apply("attempt-0", [(b"k", Location(1, 0))], [])
    index.apply("attempt-1", [(b"k", Location(2, 0))], [])
    index.commit_tokens(["attempt-1"])
    index.rollback_tokens(["attempt-0"])
    assert index.lookup([b"k"]) == [Location(2, 0)]


def test_large_apply_spans_several_undo_chunks(index: KeyShard) -> None:
    n = 60_000  # more records than fit in one undo chunk
    keys = [key(i) for i in range(n)]
    index.apply("base", [(k, Location(0, i)) for i, k in enumerate(keys[::2])], [])
    index.commit_tokens(["base"])
    before = snapshot(index, keys)
    index.apply("big", [(k, Location(1, i, b"seq")) for i, k in enumerate(keys)], [])
    with index._env.begin() as txn:
        assert txn.stat(index._undo)["entries"] > 2
    index.rollback_tokens(["big"])
    assert snapshot(index, keys) == before


def test_empty_apply_still_registers_the_token(index: KeyShard) -> None:
    index.apply("noop", [], [b"absent"])
    assert index.pending_tokens() == ["noop"]
    index.commit_tokens(["noop"])
    assert index.pending_tokens() == []


# ------------------------------------------------------------- model-based undo check

@settings(max_examples=examples(150), deadline=None)
@given(ops=st.lists(operation, max_size=25))
def test_random_applies_commits_and_rollbacks_match_dict_model(tmp_path_factory: pytest.TempPathFactory, ops: list) -> None:
    ix = open_index(KeyShard, str(tmp_path_factory.mktemp("model")))
    try:
        check_against_model(ix, ops)
    finally:
        drop_index(ix.path)


@settings(max_examples=examples(100), deadline=None)
@given(
    base=st.dictionaries(st.sampled_from(KEYS), st.integers(0, 100), max_size=8),
    batches=st.lists(
        st.tuples(st.sampled_from(TOKENS), st.lists(st.sampled_from(KEYS), max_size=5), st.lists(st.sampled_from(KEYS), max_size=3)),
        max_size=8,
    ),
)
def test_rolling_back_every_pending_token_restores_the_committed_state(
    tmp_path_factory: pytest.TempPathFactory, base: dict[bytes, int], batches: list
) -> None:
    # The operational case: a failed batch rolls back everything it applied, however
    # its tokens interleaved, and the index is exactly as it was before the batch.
    ix = open_index(KeyShard, str(tmp_path_factory.mktemp("batch")))
    try:
        ix.apply("base", [(k, Location(0, v)) for k, v in base.items()], [])
        ix.commit_tokens(["base"])
        for step, (token, put_keys, delete_keys) in enumerate(batches, start=1):
            ix.apply(token, [(k, Location(step, i)) for i, k in enumerate(put_keys)], delete_keys)
        ix.rollback_tokens(ix.pending_tokens())
        assert snapshot(ix, KEYS) == {k: Location(0, v) for k, v in base.items()}
    finally:
        drop_index(ix.path)


# -------------------------------------------------------------------------------- state


def test_state_round_trips_and_commits_with_tokens(index: KeyShard) -> None:
    assert index.get_state() is None
    state = IndexState(table_uuid="3f0c", snapshot_id=42, query_id=None, batch_id=None)
    index.set_state(state)
    assert index.get_state() == state
    index.apply("q/7/0", [(b"k", Location(0, 0))], [])
    streaming = IndexState(table_uuid="3f0c", snapshot_id=43, query_id="q", batch_id=7)
    index.commit_tokens(["q/7/0"], state=streaming)
    assert index.get_state() == streaming
    assert index.pending_tokens() == []


def test_clear_drops_everything(index: KeyShard, tmp_path: Path) -> None:
    index.apply("t", [(b"k", Location(0, 0))], [])
    index.set_state(IndexState(table_uuid="u", snapshot_id=1))
    index.clear()
    assert index.count() == 0
    assert index.lookup([b"k"]) == [None]
    assert index.pending_tokens() == []
    assert index.get_state() is None
    files = open_index(FileTable, str(tmp_path / "files"))
    try:
        assert files.file_ordinals(["f", "g"]) == [0, 1]
        files.clear()
        assert files.file_ordinal("other") == 0  # counters restart too
        with pytest.raises(KeyError):
            files.file_path(1)
    finally:
        drop_index(files.path)


# -------------------------------------------------------------------------- map growth


def test_map_grows_when_full(tmp_path: Path) -> None:
    ix = open_index(KeyShard, str(tmp_path / "tiny"), map_size=64 * 1024)
    try:
        start = ix._env.info()["map_size"]
        n = 20_000
        for batch in range(4):
            keys = [b"%08d" % i + b"-" * 40 for i in range(batch * n // 4, (batch + 1) * n // 4)]
            ix.apply(f"t{batch}", [(k, Location(batch, i)) for i, k in enumerate(keys)], [])
        assert ix.count() == n
        assert ix._env.info()["map_size"] > start
        ix.rollback_tokens([f"t{b}" for b in range(4)])
        assert ix.count() == 0
    finally:
        drop_index(ix.path)


# ------------------------------------------------------------------------ multi-process

SHARED_PATHS = [f"s3://bucket/shared-{i}.parquet" for i in range(20)]


def _child_writes(path: str, n: int, worker: int) -> None:
    """Runs in a spawned process: its own LMDB handle on the shared directory."""
    files = open_index(FileTable, f"{path}/files", map_size=64 * 1024)  # small: forces map growth across processes
    ix = open_index(KeyShard, f"{path}/keys", map_size=64 * 1024)
    own = files.file_ordinal(f"s3://bucket/own-{worker}.parquet")
    shared = files.file_ordinals(SHARED_PATHS[worker::2] + SHARED_PATHS)
    for chunk in range(4):
        puts = [(b"w%d-%06d" % (worker, i), Location(own, i)) for i in range(chunk * n // 4, (chunk + 1) * n // 4)]
        ix.apply(f"q/0/{worker}", puts, [])
        ix.lookup([k for k, _ in puts])
    ix.apply(f"q/0/{worker}", [(b"ordinal-%d" % worker, Location(shared[0], 0))], [])
    ix.close()
    files.close()


@pytest.mark.child
def test_two_processes_write_the_same_index(tmp_path: Path) -> None:
    path = str(tmp_path / "shared")
    os.makedirs(path)
    parent = open_index(KeyShard, f"{path}/keys")  # the parent keeps handles open the whole time too
    files = open_index(FileTable, f"{path}/files")
    n = 8_000
    run_workers(_child_writes, path, n, timeout=120)
    try:
        assert parent.count() == 2 * n + 2
        assert sorted(parent.pending_tokens()) == ["q/0/0", "q/0/1"]
        for worker in range(2):
            locations = parent.lookup([b"w%d-%06d" % (worker, i) for i in range(n)])
            own = files.file_ordinal(f"s3://bucket/own-{worker}.parquet")
            assert locations == [Location(own, i) for i in range(n)]
        # Ordinals were assigned atomically: 22 distinct paths, 22 distinct ordinals.
        ordinals = files.file_ordinals(SHARED_PATHS + [f"s3://bucket/own-{w}.parquet" for w in range(2)])
        assert sorted(ordinals) == list(range(22))
        assert [files.file_path(o) for o in ordinals[:20]] == SHARED_PATHS
        first_shared = parent.lookup([b"ordinal-0", b"ordinal-1"])
        assert first_shared[0].file_ordinal == files.file_ordinal(SHARED_PATHS[0])
        assert first_shared[1].file_ordinal == files.file_ordinal(SHARED_PATHS[1])
        parent.rollback_tokens(["q/0/0"])
        assert parent.count() == n + 1
    finally:
        drop_index(f"{path}/keys")
        drop_index(f"{path}/files")


def test_a_sequence_too_long_for_the_undo_log_is_refused_by_every_packer(index: KeyShard) -> None:
    """Undo records store value lengths as u16: one sequence value too long must fail the
    write, whether it comes one at a time, in bulk from a task, or from a catch-up."""
    import numpy as np

    too_long = b"x" * 70_000
    with pytest.raises(ValueError, match="sequence value of 70000 bytes is too long for the index"):
        pack_location(Location(1, 0, too_long))
    with pytest.raises(ValueError, match="sequence value of 70000 bytes is too long for the index"):
        pack_positions(1, np.array([0, 1], dtype=np.uint64), [b"ok", too_long])
    with pytest.raises(ValueError, match="too long for the index"):
        index.apply("t", [(key(1), Location(1, 0, too_long))], [])
    assert index.lookup([key(1)]) == [None]
    assert pack_positions(1, np.array([5], dtype=np.uint64), [None]) == [pack_location(Location(1, 5))]


@settings(max_examples=examples(200), deadline=None)
@given(
    ordinal=st.integers(0, 2**32 - 1),
    rows=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.one_of(st.none(), st.binary(max_size=12))), min_size=1, max_size=20),
    width=st.one_of(st.none(), st.integers(1, 12)),
)
def test_pack_positions_matches_packing_one_location_at_a_time(ordinal: int, rows: list, width: int | None) -> None:
    """Bulk packing gives exactly the bytes of `pack_location`, with and without sequences,
    with some rows lacking one or all of one width."""
    import numpy as np

    if width is not None:  # every row a sequence of one width (an encoded number)
        rows = [(p, (s or b"").ljust(width, b"\x00")[:width]) for p, s in rows]
    positions = np.array([p for p, _ in rows], dtype=np.uint64)
    sequences = [s for _, s in rows]
    expected = [pack_location(Location(ordinal, p, s)) for p, s in rows]
    assert pack_positions(ordinal, positions, sequences) == expected
    assert pack_positions(ordinal, positions) == [pack_location(Location(ordinal, p)) for p, _ in rows]


# ------------------------------------------------------------------ on-disk compatibility

# The last commit before key_index.py was split into location_codec, lmdb_env, undo_log and
# damage: hosts keep indexes this code wrote, which must open as they are (no rebuild).
_BEFORE_SPLIT = "965ce97cb7819e2d38b85a73396f71faf807c4ab"
_REPO = Path(__file__).resolve().parents[2]

# Runs in a child process against either version; prints the module it used and every
# sub-database's entries. Imports what both versions have under these names.
_WRITE_SAMPLE = """
import json, sys
import lmdb
import numpy as np
path = sys.argv[1]
paths = ["s3://b/t/data/a.parquet", "s3://b/t/data/b.parquet", "s3://b/t/data/c.parquet"]
try:  # since the split by role: the file table and a key shard, one environment here
    from lakesink_datasource.index import environment as module, location_codec as codec
    from lakesink_datasource.index.file_table import FileTable
    from lakesink_datasource.index.key_shard import KeyShard
    files = module.open_index(FileTable, path)
    files.file_ordinals(paths)  # c too: the old code assigned it inside transact
    files.put_move_maps({0: np.array([(1 << 32) | 3, -1], dtype=np.int64)}, map_only=[1])
    files.close()
    ix = module.open_index(KeyShard, path)
    ordinal_of = paths.index
except ImportError:  # the one KeyIndex of both roles
    import lakesink_datasource.index.key_index as module
    codec = module
    ix = module.open_index(path)
    ix.file_ordinals(paths[:2])
    ordinal_of = None
ix.apply("q/0/0", [(b"k1", codec.Location(0, 1)), (b"k2", codec.Location(1, 2, b"\\x00\\x01"))], [])
ix.apply("q/0/1", [(b"k1", codec.Location(1, 7, b""))], [b"k2"])
ix.apply_packed("q/1/0", [b"k3", b"x" * 600], codec.pack_positions(1, np.array([3, 4], dtype=np.uint64), [b"s1", None]))
ix.commit_tokens(["q/0/0"], module.IndexState("uuid", snapshot_id=5, sequence_number=2))
def decide(found, ordinal_of):
    return np.array([1, 0]), [codec.pack_location(codec.Location(ordinal_of("s3://b/t/data/c.parquet"), 9)), None]
if ordinal_of is None:
    ix.transact("w" * 600, [b"k1", b"k4"], decide)
    ix.put_move_maps({0: np.array([(1 << 32) | 3, -1], dtype=np.int64)}, map_only=[1])
else:
    ix.transact("w" * 600, [b"k1", b"k4"], decide, ordinal_of)
ix.set_last_published(2)
ix.begin_catch_up("snap-9")
ix.close()
env = lmdb.open(path, max_dbs=8, readonly=True, lock=False)
dump = {}
with env.begin() as txn:
    for name, _ in txn.cursor():
        db = env.open_db(name, txn=txn, create=False)
        dump[name.hex()] = [[k.hex(), v.hex()] for k, v in txn.cursor(db=db)]
print(json.dumps({"module": module.__file__, "dump": dump}))
"""


def _write_sample(pythonpath: Path, path: Path) -> tuple[str, dict[str, list[list[str]]]]:
    child = subprocess.run(
        [sys.executable, "-c", _WRITE_SAMPLE, str(path)],
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
        cwd=path.parent,  # not the checkout: `-c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    out = json.loads(child.stdout)
    return out["module"], out["dump"]


def test_an_index_written_before_the_split_opens_without_a_rebuild(tmp_path: Path) -> None:
    old = tmp_path / "old" / "lakesink_datasource"
    for name in ("arrays.py", "index/key_index.py"):  # all the old key_index imported
        shown = subprocess.run(
            ["git", "-C", str(_REPO), "show", f"{_BEFORE_SPLIT}:lakesink_datasource/{name}"], capture_output=True
        )
        if shown.returncode != 0:
            pytest.skip(f"commit {_BEFORE_SPLIT} is not in this checkout's history")
        (old / name).parent.mkdir(parents=True, exist_ok=True)
        (old / name).write_bytes(shown.stdout)
    # Empty package files: the real lakesink_datasource/__init__.py imports far more.
    (old / "__init__.py").write_text("")
    (old / "index" / "__init__.py").write_text("")

    old_module, before = _write_sample(old.parent, tmp_path / "before")
    new_module, after = _write_sample(_REPO, tmp_path / "after")
    assert Path(old_module).is_relative_to(old) and Path(new_module).is_relative_to(_REPO / "lakesink_datasource")
    assert after == before  # byte for byte: the same sub-databases, keys and values

    path = str(tmp_path / "before")
    inode = os.stat(os.path.join(path, "data.mdb")).st_ino
    files = open_index(FileTable, path)  # each role in turn: one handle per process
    try:
        assert files.inode == inode  # opened as it is, not removed and started empty
        assert [files.file_path(o) for o in range(3)] == [f"s3://b/t/data/{n}.parquet" for n in "abc"]
        assert files.file_ordinal("s3://b/t/data/d.parquet") == 3  # the ordinal counter carried over
        with files.move_maps() as maps:
            assert {o: m.tolist() for o, m in maps.items()} == {0: [(1 << 32) | 3, -1]}
        assert files.map_only_ordinals([0, 1]) == {1}
        files.close()
        ix = open_index(KeyShard, path)
        assert ix.get_state() == IndexState("uuid", snapshot_id=5, sequence_number=2)
        assert ix.catch_up_under_way() == "snap-9"
        assert ix.last_published() == 2
        probe = [b"k1", b"k2", b"k3", b"x" * 600, b"k4"]
        assert ix.lookup(probe) == [None, None, Location(1, 3, b"s1"), Location(1, 4), Location(2, 9)]
        # The old undo records (a hashed token key among them) roll back under the new code.
        assert ix.pending_tokens() == ["q/0/1", "q/1/0", "w" * 600]
        ix.rollback_tokens(ix.pending_tokens())
        assert ix.pending_tokens() == []
        assert ix.lookup(probe) == [Location(0, 1), Location(1, 2, b"\x00\x01"), None, None, None]
    finally:
        drop_index(path)


def test_the_on_disk_encoding_is_the_one_before_the_split(index: KeyShard) -> None:
    """The bytes below were printed by the code of commit 965ce97 (before key_index.py was
    split) for the same calls; this holds where that commit's history is not at hand."""
    assert pack_location(Location(3, 2**40 + 5, b"\x80\x00")) == b"\x03\x00\x00\x00\x05\x00\x00\x00\x00\x01\x00\x00\x01\x80\x00"
    index.apply("q/0/0", [(b"k1", Location(0, 1)), (b"k2", Location(1, 2, b"\x00\x01"))], [b"k0"])
    index.apply("q/0/0", [(b"k1", Location(1, 7, b""))], [b"k2"])
    with index._env.begin() as txn:
        assert [name for name, _ in txn.cursor()] == [b"files", b"keys", b"meta", b"moves", b"undo"]
        assert list(txn.cursor(db=index._keys)) == [(b"k1", b"\x01\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x01")]
        assert list(txn.cursor(db=index._undo)) == [
            (
                b"c\x00\x00\x00\x00\x00\x00\x00\x00",
                b"\x02\x00\x00\x00\x02\x00\x02\x00\xff\xff\xff\xff\x0c\x00\x0f\x00k1k2"
                b"\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
                b"\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01",
            ),
            (
                b"c\x00\x00\x00\x00\x00\x00\x00\x01",
                b"\x02\x00\x00\x00\x02\x00\x02\x00\x0c\x00\x0f\x00\r\x00\xff\xffk1k2"
                b"\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
                b"\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01"
                b"\x01\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x01",
            ),
            (b"tq/0/0", b"\x05\x00q/0/0" + b"\x00" * 16 + b"\x01\x00\x00\x00\x00\x00\x00\x00"),
        ]
        assert list(txn.cursor(db=index._meta)) == [(b"next_undo_seq", b"\x02\x00\x00\x00\x00\x00\x00\x00")]
