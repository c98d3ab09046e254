"""A plain-dict model of the key index's undo contract, shared by the tests of one
environment (`KeyIndex`) and of the sharded index."""

from __future__ import annotations

from hypothesis import strategies as st

from lakesink_datasource.index.key_index import Location

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
