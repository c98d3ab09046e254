"""A plain model of history tables (`history=true`, slowly changing dimensions of type 2).

Every version of a key is a row `(start, end, values)`; the current one has `end` None.
Changes arrive in any order, each with a sequence; the model applies them one by one in
arrival order with these rules, which the implementation must follow:

- A change with the sequence the key last applied is a re-sent one: it changes nothing.
- In order (a sequence above the key's last):
  - a write to a key with a current version: when the tracked columns are equal, the current
    version takes the new values in place (its start kept; when nothing but the sequence
    differs, nothing changes at all, and the change does not count as the key's last); else
    the current version ends at the sequence and a new one starts there;
  - a write to a key without one starts a version;
  - a delete ends the current version (nothing when there is none).
- Late (a sequence below the key's last), against the versions as they stand:
  - inside a version that starts exactly there: nothing (re-sent);
  - a write inside a version: with equal tracked columns nothing; else the version ends there
    and a new one runs from there to where the old one ended, merged with the version after
    it when their tracked columns are equal; with some columns untracked, a late change
    inside the current version changes nothing (the current version took newer values);
  - a write outside every version (before the first, in a deleted period) starts a version
    that ends where the next one starts; after the key's last version (in the period its last
    delete ended) its end is unknown: it is not recorded;
  - a delete inside a version ends it there (leaving a deleted period); outside, nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Version:
    start: Any
    end: Any  # None: the current version
    values: dict[str, Any]


@dataclass
class KeyHistory:
    versions: list[Version] = field(default_factory=list)  # by start
    last: Any = None  # the sequence of the last change applied (write or delete)

    @property
    def current(self) -> Version | None:
        return next((v for v in self.versions if v.end is None), None)


class HistoryModel:
    def __init__(self, tracked: list[str] | None, columns: list[str], sequence: list[str]) -> None:
        self.columns = columns  # every value column (not the key, start, end)
        self.sequence = sequence  # value columns holding the sequence (never tracked)
        self.tracked = tracked if tracked is not None else [c for c in columns if c not in sequence]
        self.partial = tracked is not None
        self.keys: dict[Any, KeyHistory] = {}

    def _same_tracked(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(a.get(c) == b.get(c) for c in self.tracked)

    def _same_data(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(a.get(c) == b.get(c) for c in self.columns if c not in self.sequence)

    def apply(self, key: Any, seq: Any, delete: bool, values: dict[str, Any] | None) -> None:
        h = self.keys.setdefault(key, KeyHistory())
        if h.last is not None and seq == h.last:
            return
        if h.last is None or seq > h.last:
            if self._in_order(h, seq, delete, values):
                h.last = seq
        else:
            self._late(h, seq, delete, values)

    def _in_order(self, h: KeyHistory, seq: Any, delete: bool, values: dict[str, Any] | None) -> bool:
        current = h.current
        if delete:
            if current is not None:
                current.end = seq
            return True
        assert values is not None
        if current is not None and self._same_tracked(current.values, values):
            if self._same_data(current.values, values):
                return False
            current.values = dict(values)
            return True
        if current is not None:
            current.end = seq
        h.versions.append(Version(seq, None, dict(values)))
        return True

    def _late(self, h: KeyHistory, seq: Any, delete: bool, values: dict[str, Any] | None) -> None:
        holding = next((v for v in h.versions if v.start <= seq and (v.end is None or seq < v.end)), None)
        if holding is not None and holding.start == seq:
            return
        if holding is not None:
            if holding.end is None and self.partial:
                return
            if delete:
                holding.end = seq
                return
            assert values is not None
            if self._same_tracked(holding.values, values):
                return
            old_end = holding.end
            holding.end = seq
            new = Version(seq, old_end, dict(values))
            self._insert(h, new)
            return
        after = [v for v in h.versions if v.start > seq]
        if delete or not after:
            return
        assert values is not None
        self._insert(h, Version(seq, min(after, key=lambda v: v.start).start, dict(values)))

    def _insert(self, h: KeyHistory, new: Version) -> None:
        h.versions.append(new)
        h.versions.sort(key=lambda v: v.start)
        following = next((v for v in h.versions if new.end is not None and v.start == new.end), None)
        if following is not None and self._same_tracked(following.values, new.values):
            new.end = following.end
            new.values = dict(following.values)
            h.versions.remove(following)

    def rows(self, key_name: str, columns: list[str]) -> Counter:
        out: Counter = Counter()
        for key, h in self.keys.items():
            for v in h.versions:
                row = {key_name: key, **v.values, "__start_at": v.start, "__end_at": v.end}
                out[tuple(row.get(c) for c in columns)] += 1
        return out
