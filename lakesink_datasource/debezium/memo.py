"""What a process learns from the records it reads (Connect schemas parsed, JsonConverter's
prefixes per topic), kept for the next records: a Python worker lives across many tasks.

Each memo is bounded (a long-lived worker meets many topics and schema versions): past its
bound it starts over. `Memo.forget_all()` puts every memo back as a fresh process has them
(the tests' way to compare the first records a process reads with the next).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_ABSENT = object()


class Memo(Generic[K, V]):
    """A bounded dict of what was worked out once per key."""

    _every: ClassVar[list[Memo]] = []

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self._values: dict[K, V] = {}
        Memo._every.append(self)

    def get(self, key: K, make: Callable[[K], V]) -> V:
        """The value for `key`, worked out by `make` the first time."""
        value = self._values.get(key, _ABSENT)
        if value is _ABSENT:
            value = self[key] = make(key)
        return value  # type: ignore[return-value]

    def known(self, key: K) -> V | None:
        """The value kept for `key`, if any (nothing is worked out)."""
        return self._values.get(key)

    def __setitem__(self, key: K, value: V) -> None:
        if key not in self._values and len(self._values) >= self.bound:
            self._values.clear()
        self._values[key] = value

    def __len__(self) -> int:
        return len(self._values)

    @classmethod
    def forget_all(cls) -> None:
        for memo in cls._every:
            memo._values.clear()
