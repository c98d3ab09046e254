"""unique_sorted against Python's own set and sort (key hashes use the full uint64 range);
take_items against a list comprehension."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lakesink_datasource.arrays import take_items, unique_sorted


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=200))
def test_unique_sorted_of_key_hashes(values: list[int]) -> None:
    result = unique_sorted(np.array(values, dtype=np.uint64))
    assert result.dtype == np.uint64
    assert result.tolist() == sorted(set(values))


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=200))
def test_unique_sorted_of_positions(values: list[int]) -> None:
    assert unique_sorted(np.array(values, dtype=np.int64)).tolist() == sorted(set(values))


@given(st.lists(st.binary(max_size=4), max_size=30), st.data())
def test_take_items_picks_like_indexing(items: list[bytes], data: st.DataObject) -> None:
    which = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=40)) if items else []
    assert take_items(items, np.array(which, dtype=np.int64)) == [items[i] for i in which]
