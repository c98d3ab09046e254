"""A plain-dict model of the key index's undo contract, shared by the tests of one
environment (`KeyShard`) and of the sharded index."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from lakesink_datasource.index.location_codec import Location

KEYS = [b"k%d" % i for i in range(8)]
TOKENS = [f"q/{i // 2}/{i % 2}" for i in range(5)]

operation = st.one_of(
    st.tuples(
        st.just("apply"),
        st.sampled_from(TOKENS),
        st.lists(st.sampled_from(KEYS), max_size=6),
        st.lists(st.sampled_from(KEYS), max_size=3),
    ),
    st.tuples(st.just("commit"), st.lists(st.sampled_from(TOKENS), max_size=3)),
    st.tuples(st.just("rollback"), st.lists(st.sampled_from(TOKENS), max_size=3)),
)


class Model:
    """The documented undo contract on a plain dict.

    Each apply logs (token, key, previous, new) for keys it changes. Rollback replays the
    chosen tokens' records newest first, restoring `previous` only while the key still
    holds that record's `new` value; where a surviving token overwrote the key since, that
    token's record is changed to restore what the rolled-back write had replaced (its
    `previous` never reached the table). Commit forgets the records.
    """

    def __init__(self) -> None:
        self.mapping: dict[bytes, Location] = {}
        self.log: list[tuple[str, bytes, Location | None, Location | None]] = []
        self.pending: list[str] = []

    def apply(self, token: str, puts: list[tuple[bytes, Location]], deletes: list[bytes]) -> None:
        final: dict[bytes, Location | None] = dict(puts)
        final.update(dict.fromkeys(deletes))
        for k, new in final.items():
            prev = self.mapping.get(k)
            if prev != new:
                self.log.append((token, k, prev, new))
                self._set(k, new)
        if token not in self.pending:
            self.pending.append(token)

    def commit(self, tokens: list[str]) -> None:
        self.log = [r for r in self.log if r[0] not in tokens]
        self.pending = [t for t in self.pending if t not in tokens]

    def rollback(self, tokens: list[str]) -> None:
        stood_for: dict[tuple[bytes, Location | None], Location | None] = {}
        for token, k, prev, new in reversed(self.log):
            if token not in tokens:
                continue
            if self.mapping.get(k) == new:
                self._set(k, prev)
            else:
                stood_for[(k, new)] = prev
        self.commit(tokens)
        spliced = []
        for token, k, prev, new in self.log:
            seen = set()
            while (k, prev) in stood_for and prev not in seen:
                seen.add(prev)
                prev = stood_for[(k, prev)]
            spliced.append((token, k, prev, new))
        self.log = spliced

    def _set(self, k: bytes, value: Location | None) -> None:
        if value is None:
            self.mapping.pop(k, None)
        else:
            self.mapping[k] = value


def check_against_model(ix: Any, ops: list, *, pending_in_order: bool = True) -> None:
    """Run `ops` on the index `ix` (a `KeyShard` or a `ShardedIndex`) and on the model,
    comparing the mapping, the count and the pending tokens after every step. A sharded
    index lists pending tokens shard by shard, so only the set is compared there."""
    model = Model()
    for step, op in enumerate(ops):
        if op[0] == "apply":
            _, token, put_keys, delete_keys = op
            # Every put writes a fresh location, as real writes land in new files.
            puts = [(k, Location(step, i, b"s%d" % step if i % 2 else None)) for i, k in enumerate(put_keys)]
            ix.apply(token, puts, delete_keys)
            model.apply(token, puts, delete_keys)
        elif op[0] == "commit":
            ix.commit_tokens(op[1])
            model.commit(op[1])
        else:
            ix.rollback_tokens(op[1])
            model.rollback(op[1])
        assert {k: loc for k, loc in zip(KEYS, ix.lookup(KEYS)) if loc is not None} == model.mapping
        assert ix.count() == len(model.mapping)
        pending = ix.pending_tokens()
        assert (pending if pending_in_order else sorted(pending)) == (model.pending if pending_in_order else sorted(model.pending))


def run_workers(target: Callable[..., None], *args: Any, workers: int = 2, timeout: float = 300) -> None:
    """`target(*args, worker)` in `workers` spawned processes at once (each opens its own
    LMDB handles, as Spark's worker processes do); fails unless every one exits cleanly."""
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=target, args=(*args, w)) for w in range(workers)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=timeout)
        assert child.exitcode == 0
