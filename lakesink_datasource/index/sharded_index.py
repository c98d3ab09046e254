"""The key index split by key hash into shards, so that the tasks of one host write keys
concurrently.

LMDB lets one writer at a time into an environment, and a keyed change must hold a host
lock from its lookup to its write: with one environment, all keyed tasks of a host queue
for it (two tasks measured 1.41x one task, 42% of a task was that wait). A key lives in
exactly one shard (a hash of the key without its last byte, modulo the shard count), so
each shard is its own environment with its own lock, undo and state, and a task takes a
chunk's shards one at a time, free ones first: two tasks only wait for each other when
both want the same shard.

Why not the plain key hash: a task writes a chunk's rows shard after shard, and rows in
hash order compress worse than rows in key order (a task upserting 100K rows into 1M: +42%
file bytes). Hashing without the last byte keeps runs of up to 256 neighbouring keys
together (+11%), and still spreads keys evenly once a chunk spans a few thousand of them.

Layout under the table's index directory::

    files/        the `FileTable` of all shards (ordinals packed into key locations), move maps
    shard-NN/     a `KeyShard` per shard: keys, undo, state
    writers-NN.lock

What spans shards is not atomic, and need not be: committing or rolling back tokens and
catch-up writes are idempotent per shard, and every shard (and the file table) records
the state it reflects. A crash between two shards leaves different states, which
`get_state` reports as no state at all: the next sync rebuilds from the table (a cache, never the
truth). File ordinals are assigned in their own environment, outside the shard's
transaction; an ordinal assigned for a task attempt that then fails stays behind until
the next rebuild (a few per failed attempt).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from lakesink_datasource.arrays import take_items, unique_sorted
from lakesink_datasource.faults import fault_point
from lakesink_datasource.index.damage import damage, remove_environment
from lakesink_datasource.index.environment import IndexEnvironment, IndexState, drop_index, open_index, reopen_empty
from lakesink_datasource.index.file_table import FileTable
from lakesink_datasource.index.host_lock import host_lock, host_locks
from lakesink_datasource.index.key_encoding import key_hashes
from lakesink_datasource.index.key_shard import KeyShard
from lakesink_datasource.index.location_codec import Found, Location
from lakesink_datasource.index.row_moves import NO_ROW, MoveMaps, compose, moved_rows, place_ordinals, translate

__all__ = ["SHARDS", "IndexSnapshot", "ShardedIndex", "drop_sharded", "lock_paths", "make_index_dir", "open_sharded", "reopen_empty_sharded"]

# Shards per table and host: enough for the cores of a typical executor host, few enough
# that a chunk's keys still fill each shard's B-tree pages (a chunk has 100K keys).
SHARDS = 8

# Room left in the file table's map before a keyed transaction: its new files' ordinals
# (a few hundred bytes each; a chunk's rows go to at most a few hundred files).
FILE_TABLE_ROOM = 1 << 20

# decide(which, found, ordinal_of): `which` are the indices (into the keys given to
# `transact`) of one shard's keys, `found` their current locations; returns the indices
# into `which` that change and their new packed locations (None deletes the key).
ShardDecision = Callable[[np.ndarray, Found, Callable[[str], int]], tuple[np.ndarray, list[bytes | None]]]


def _shard_dir(path: str, shard: int) -> str:
    return os.path.join(path, f"shard-{shard:02d}")


def _files_dir(path: str) -> str:
    return os.path.join(path, "files")


def lock_paths(path: str, shards: int = SHARDS) -> list[str]:
    return [os.path.join(os.path.abspath(path), f"writers-{shard:02d}.lock") for shard in range(shards)]


class ShardedIndex:
    """A table's key index on this host: `KeyShard`s behind one `FileTable`. Use
    `open_sharded`. Key methods mirror `KeyShard`'s and route keys to their shard."""

    def __init__(self, path: str, shards: Sequence[KeyShard], files: FileTable):
        self.path = os.path.abspath(path)
        self.shards = list(shards)
        self.files = files
        self.lock_paths = lock_paths(self.path, len(self.shards))

    # -- routing ---------------------------------------------------------------------------

    def _split(self, keys: Sequence[bytes]) -> list[np.ndarray]:
        """Indices of `keys` per shard, each in input order."""
        if not len(keys):
            return [np.zeros(0, dtype=np.int64) for _ in self.shards]
        hashes = key_hashes(keys, drop_last_byte=True)
        shard = (hashes % np.uint64(len(self.shards))).astype(np.int64)
        order = np.argsort(shard, kind="stable")
        counts = np.bincount(shard, minlength=len(self.shards))
        return np.split(order, np.cumsum(counts)[:-1])

    # -- file table ------------------------------------------------------------------------

    def file_ordinal(self, path: str) -> int:
        return self.files.file_ordinal(path)

    def file_ordinals(self, paths: Iterable[str]) -> list[int]:
        return self.files.file_ordinals(paths)

    def known_ordinals(self, paths: Iterable[str]) -> list[int | None]:
        return self.files.known_ordinals(paths)

    def has_ordinal(self, ordinal: int) -> bool:
        return self.files.has_ordinal(ordinal)

    def forget_files(self, paths: Iterable[str]) -> int:
        return self.files.forget_files(paths)

    def file_count(self) -> int:
        return self.files.file_count()

    def file_path(self, ordinal: int) -> str:
        return self.files.file_path(ordinal)

    # -- keys ------------------------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> list[Location | None]:
        result: list[Location | None] = [None] * len(keys)
        for shard, which in zip(self.shards, self._split(keys)):
            if len(which):
                for i, location in zip(which.tolist(), shard.lookup(take_items(keys, which))):
                    result[i] = location
        with self.files.move_maps() as maps:
            if maps:
                result = [_moved(loc, maps) for loc in result]
        return result

    def apply(self, token: str, puts: Sequence[tuple[bytes, Location]], deletes: Sequence[bytes]) -> None:
        put_parts = self._split([k for k, _ in puts])
        delete_parts = self._split(deletes)
        for s, (shard, put_which, delete_which) in enumerate(zip(self.shards, put_parts, delete_parts)):
            # An empty apply still registers the token, as `KeyShard.apply` does (in shard 0).
            if len(put_which) or len(delete_which) or (s == 0 and not puts and not deletes):
                shard.apply(token, take_items(puts, put_which), take_items(deletes, delete_which))

    def overwrite_packed(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        for shard, which in zip(self.shards, self._split(keys)):
            if len(which):
                shard.overwrite_packed(take_items(keys, which), take_items(values, which))

    def remove_keys(self, keys: Sequence[bytes]) -> None:
        for shard, which in zip(self.shards, self._split(keys)):
            if len(which):
                shard.remove_keys(take_items(keys, which))

    def transact(self, token: str, keys: Sequence[bytes], decide: ShardDecision) -> None:
        """`KeyShard.transact` per shard, each under its shard's host lock: one write
        transaction per shard with keys. Shards whose lock is free are taken first; only when
        every remaining one is busy does the task wait (for the first of them)."""
        parts = self._split(keys)
        pending = [s for s, which in enumerate(parts) if len(which)]
        # The file table's map cannot grow under the move maps' view below, while the
        # shards' transactions give this task's new files their ordinals: room first.
        self.files.make_room(FILE_TABLE_ROOM)
        # Move maps change only in a sync, which holds every shard's lock: what this
        # transaction reads of them stays true while it holds one.
        with self.files.move_maps() as maps:
            while pending:
                for s in pending:
                    with host_lock(self.lock_paths[s], blocking=False) as held:
                        if held:
                            self._transact_shard(s, token, keys, parts[s], decide, maps)
                            break
                else:
                    s = pending[0]
                    with host_lock(self.lock_paths[s]):
                        self._transact_shard(s, token, keys, parts[s], decide, maps)
                pending.remove(s)

    def _transact_shard(
        self, s: int, token: str, keys: Sequence[bytes], which: np.ndarray, decide: ShardDecision, maps: MoveMaps
    ) -> None:
        def shard_decide(found: Found, ordinal_of: Callable[[str], int]) -> tuple[np.ndarray, list[bytes | None]]:
            return decide(which, translate(found, maps), ordinal_of)

        self.shards[s].transact(token, take_items(keys, which), shard_decide, ordinal_of=self.files.file_ordinal)

    def count(self) -> int:
        return sum(shard.count() for shard in self.shards)

    # -- compactions' row moves (index/row_moves.py) -----------------------------------------

    def record_moves(self, new: MoveMaps, targets: Iterable[int]) -> None:
        """Keep the move maps of a compaction that wrote the files `targets`: maps leading
        into the files it rewrote are re-aimed at the rows' new places; the rewritten files'
        own maps are kept only where a key may point at them directly (not for earlier
        compactions' outputs, which only maps lead into), and a map left with no live row is
        dropped. Idempotent (a replayed catch-up records the same maps again)."""
        with self.files.move_maps() as existing:
            changed = compose(existing, new)
        map_only = self.files.map_only_ordinals(new)
        kept = {**changed, **{o: places for o, places in new.items() if o not in map_only}}
        dead = {o for o, places in kept.items() if not (places >= 0).any()}
        self.files.put_move_maps(
            {o: places for o, places in kept.items() if o not in dead}, dropped=map_only | dead, map_only=targets
        )

    def mark_direct(self, ordinal: int) -> None:
        self.files.mark_direct(ordinal)

    def forget_moves(self, ordinals: Iterable[int]) -> None:
        """Drop the maps and markers of these files (removed from the table)."""
        self.files.put_move_maps({}, dropped=ordinals)

    def moved_rows(self) -> int:
        """How many row positions the move maps hold (what they cost on disk: 8 bytes each)."""
        return self.move_stats()[1]

    def move_stats(self) -> tuple[int, int]:
        """(maps, row positions) the index holds: every keyed transaction reads each map's
        header, and the positions cost 8 bytes each on disk."""
        with self.files.move_maps() as maps:
            return len(maps), moved_rows(maps)

    def move_targets(self) -> set[int]:
        """Ordinals of the files the move maps lead to."""
        with self.files.move_maps() as maps:
            return {o for places in maps.values() for o in unique_sorted(place_ordinals(places)).tolist() if o != NO_ROW}

    def retire_move_targets(self, ordinals: set[int]) -> None:
        """No key reads through a map into these files any more (they were re-indexed, or are
        gone): their entries become NO_ROW, and maps left with no live entry are dropped."""
        if not ordinals:
            return
        wanted = np.fromiter(ordinals, dtype=np.int64, count=len(ordinals))
        changed: dict[int, np.ndarray] = {}
        with self.files.move_maps() as maps:
            for ordinal, places in maps.items():
                hit = np.isin(place_ordinals(places), wanted)
                if hit.any():
                    changed[ordinal] = np.where(hit, NO_ROW, places)
        dead = {o for o, places in changed.items() if not (places >= 0).any()}
        self.files.put_move_maps({o: p for o, p in changed.items() if o not in dead}, dropped=dead)

    # -- undo ------------------------------------------------------------------------------

    def pending_tokens(self) -> list[str]:
        """Tokens pending in any shard (a token that touched no key of a shard is not
        pending there)."""
        return list(dict.fromkeys(t for shard in self.shards for t in shard.pending_tokens()))

    def _each_shard(self, op: Callable[[KeyShard], object], step: str) -> None:
        for shard in self.shards:
            op(shard)
            fault_point(f"index_shard_{step}")  # tests: a crash between two shards

    def _each_environment(self, op: Callable[[IndexEnvironment], object], step: str) -> None:
        for env in [*self.shards, self.files]:
            op(env)
            fault_point(f"index_shard_{step}")

    def commit_tokens(self, tokens: Iterable[str], state: IndexState | None = None) -> None:
        tokens = list(tokens)
        self._each_shard(lambda shard: shard.commit_tokens(tokens, state), "committed")
        if state is not None:
            # The file table holds no tokens, but records the state too (see get_state).
            self.files.set_state(state)
            fault_point("index_shard_committed")

    def rollback_tokens(self, tokens: Iterable[str]) -> None:
        tokens = list(tokens)
        self._each_shard(lambda shard: shard.rollback_tokens(tokens), "rolled_back")

    # -- state -----------------------------------------------------------------------------

    def get_state(self) -> IndexState | None:
        """The state every shard and the file table reflect; None when they disagree (a crash
        between two state writes, or one environment found damaged and started empty by
        `open_index`), which makes the next sync rebuild. The file table counts: shards that
        kept their keys over an emptied file table would point at ordinals it reassigns."""
        states = [shard.get_state() for shard in [*self.shards, self.files]]
        return states[0] if all(state == states[0] for state in states) else None

    def set_state(self, state: IndexState) -> None:
        self._each_environment(lambda env: env.set_state(state), "state_set")

    def begin_catch_up(self, target: str) -> None:
        self._each_shard(lambda shard: shard.begin_catch_up(target), "catch_up_begun")

    def catch_up_under_way(self) -> str | None:
        return next((t for t in (shard.catch_up_under_way() for shard in self.shards) if t is not None), None)

    # -- maintenance -----------------------------------------------------------------------

    def clear(self) -> None:
        # Shards first: one cleared shard has no state, so a crash before the rest are cleared
        # still rebuilds.
        self._each_environment(lambda env: env.clear(), "cleared")

    @contextmanager
    def all_locked(self) -> Iterator[None]:
        """Hold every shard's host lock: for whatever spans shards (sync, rollback)."""
        with host_locks(self.lock_paths):
            yield

    # -- copies (published.py) -------------------------------------------------------------

    def environments(self) -> dict[str, IndexEnvironment]:
        """The environments by name, as a copy names them."""
        return {"files": self.files, **{f"shard-{s:02d}": shard for s, shard in enumerate(self.shards)}}

    def read_snapshot(self) -> IndexSnapshot:
        """Read transactions on every environment, begun now: a copy of exactly this state
        (take it holding every shard's lock, with no undo pending)."""
        return IndexSnapshot({name: (env, env.read_transaction()) for name, env in self.environments().items()})

    def replace_environments(self, folders: Mapping[str, str]) -> None:
        """Put the environments copied into `folders` (name -> directory holding data.mdb) in
        place of this index's own, and reopen them (hold every shard's lock). Other
        processes of the host notice the new files when they next open the index."""
        for name, env in self.environments().items():
            target = env.path
            env.close()
            remove_environment(target)
            os.makedirs(target, exist_ok=True)
            os.replace(os.path.join(folders[name], "data.mdb"), os.path.join(target, "data.mdb"))
        self.files = open_index(FileTable, _files_dir(self.path))
        self.shards = [open_index(KeyShard, _shard_dir(self.path, s)) for s in range(len(self.shards))]

    def __repr__(self) -> str:
        return f"ShardedIndex({self.path!r}, {len(self.shards)} shards)"


class IndexSnapshot:
    """Read transactions on every environment of an index: one consistent state to copy."""

    def __init__(self, txns: Mapping[str, tuple[IndexEnvironment, Any]]):
        self._txns = dict(txns)

    def copy_to(self, folder: str) -> dict[str, str]:
        """Compacted copies of every environment under `folder`: name -> its data file."""
        return {name: env.copy_to(os.path.join(folder, name), txn) for name, (env, txn) in self._txns.items()}

    def close(self) -> None:
        for env, txn in self._txns.values():
            env.end_read(txn)
        self._txns = {}


def _moved(location: Location | None, maps: MoveMaps) -> Location | None:
    if location is None or location.file_ordinal not in maps:
        return location
    found = translate(
        Found(np.array([True]), np.array([location.file_ordinal], dtype=np.int64), np.array([location.position], dtype=np.int64), None),
        maps,
    )
    if not found.present[0]:
        return None
    return Location(int(found.ordinal[0]), int(found.position[0]), location.sequence)


def make_index_dir(path: str) -> str:
    """The index's directory, created (a file standing in its place is removed: the index is
    a cache, rebuilt). Writers call it before taking the shard locks, whose files live there."""
    path = os.path.abspath(path)
    if damage(path) == "not a directory":
        remove_environment(path)
    os.makedirs(path, exist_ok=True)
    return path


def _prepare(path: str) -> str:
    path = make_index_dir(path)
    if os.path.exists(os.path.join(path, "data.mdb")):
        # The one-environment layout of lakesink before shards: a cache, rebuilt as shards.
        remove_environment(path)
    return path


def open_sharded(path: str, shards: int = SHARDS) -> ShardedIndex:
    """The sharded index at `path` (created when absent). Each environment is the process's
    cached environment (`open_index`), which also answers a damaged one with an empty one."""
    path = _prepare(path)
    return ShardedIndex(path, [open_index(KeyShard, _shard_dir(path, s)) for s in range(shards)], open_index(FileTable, _files_dir(path)))


def reopen_empty_sharded(path: str, shards: int = SHARDS) -> ShardedIndex:
    """Every environment of the index at `path` deleted and opened empty (for a rebuild)."""
    path = _prepare(path)
    return ShardedIndex(
        path, [reopen_empty(KeyShard, _shard_dir(path, s)) for s in range(shards)], reopen_empty(FileTable, _files_dir(path))
    )


def environment_paths(path: str, shards: int = SHARDS) -> list[str]:
    path = os.path.abspath(path)
    return [_files_dir(path), *(_shard_dir(path, s) for s in range(shards))]


def drop_sharded(path: str, shards: int = SHARDS) -> None:
    """Close this process's handles of the index at `path` and delete its directory."""
    for env in environment_paths(path, shards):
        drop_index(env)
    shutil.rmtree(os.path.abspath(path), ignore_errors=True)
