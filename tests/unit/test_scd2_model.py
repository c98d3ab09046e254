"""The SCD type 2 reference model (tests/scd2_model.py) against hand-written histories, and its own
properties. Every expected list below is written by hand from the rules in the model's docstring."""

from __future__ import annotations

import itertools
import random
from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from scd2_model import Change, Version, history


def up(key: Hashable, pos: int | tuple, **values: object) -> Change:
    return Change(key, _pos(pos), "upsert", values)


def delete(key: Hashable, pos: int | tuple) -> Change:
    return Change(key, _pos(pos), "delete", None)


def truncate(pos: int | tuple) -> Change:
    return Change(None, _pos(pos), "truncate", None)


def v(key: Hashable, start: int | tuple, end: int | tuple | None, **values: object) -> Version:
    return Version(key, values, _pos(start), None if end is None else _pos(end))


def _pos(pos: int | tuple) -> tuple:
    return pos if isinstance(pos, tuple) else (pos,)


# --- hand-written histories ---------------------------------------------------------------------


def test_each_upsert_with_new_values_ends_the_previous_version() -> None:
    assert history([[up(1, 1, c="a"), up(1, 2, c="b")]]) == [v(1, 1, 2, c="a"), v(1, 2, None, c="b")]


def test_late_delete_between_two_equal_upserts_leaves_a_gap() -> None:
    # the brief's example: upsert@10 a, upsert@30 a, then late delete@20
    assert history([[up(1, 10, c="a"), up(1, 30, c="a")], [delete(1, 20)]]) == [
        v(1, 10, 20, c="a"),
        v(1, 30, None, c="a"),
    ]


def test_late_upsert_between_two_equal_upserts_splits_the_version() -> None:
    # the brief's example: upsert@10 a, upsert@30 a, then late upsert@20 b
    assert history([[up(1, 10, c="a"), up(1, 30, c="a")], [up(1, 20, c="b")]]) == [
        v(1, 10, 20, c="a"),
        v(1, 20, 30, c="b"),
        v(1, 30, None, c="a"),
    ]


def test_equal_values_continue_the_version() -> None:
    assert history([[up(1, 10, c="a"), up(1, 20, c="a"), up(1, 30, c="b")]]) == [v(1, 10, 30, c="a"), v(1, 30, None, c="b")]


def test_late_upsert_equal_to_the_current_version_changes_nothing() -> None:
    assert history([[up(1, 10, c="a"), up(1, 30, c="c")], [up(1, 20, c="a")]]) == [v(1, 10, 30, c="a"), v(1, 30, None, c="c")]


def test_late_upsert_equal_to_the_next_version_starts_it_earlier() -> None:
    assert history([[up(1, 10, c="a"), up(1, 30, c="b")], [up(1, 20, c="b")]]) == [v(1, 10, 20, c="a"), v(1, 20, None, c="b")]


@pytest.mark.parametrize(
    "batches",
    [
        [[up(7, 4490, c="x"), delete(7, 4600), up(7, 4660, c="x")]],  # all in one batch
        [[up(7, 4490, c="x")], [delete(7, 4600), up(7, 4660, c="x")]],  # the brief's: delete and upsert in one batch
    ],
    ids=["one-batch", "two-batches"],
)
def test_every_change_in_a_batch_counts(batches: list[list[Change]]) -> None:
    assert history(batches) == [v(7, 4490, 4600, c="x"), v(7, 4660, None, c="x")]


def test_delete_of_a_key_with_no_version_changes_nothing() -> None:
    assert history([[delete(1, 5)]]) == []
    assert history([[delete(1, 5), up(1, 7, c="a")]]) == [v(1, 7, None, c="a")]


def test_delete_applied_first_ends_a_late_upsert_below_it() -> None:
    assert history([[delete(1, 20)], [up(1, 10, c="a")]]) == [v(1, 10, 20, c="a")]


def test_upsert_after_a_delete_starts_a_new_version_even_with_equal_values() -> None:
    assert history([[up(1, 10, c="a"), delete(1, 20), up(1, 30, c="a")]]) == [v(1, 10, 20, c="a"), v(1, 30, None, c="a")]


def test_a_change_at_an_applied_position_is_a_resent_duplicate() -> None:
    assert history([[up(1, 10, c="a")], [up(1, 10, c="a")]]) == [v(1, 10, None, c="a")]
    assert history([[up(1, 10, c="a")], [up(1, 10, c="b")]]) == [v(1, 10, None, c="a")]
    assert history([[up(1, 10, c="a"), delete(1, 10)]]) == [v(1, 10, None, c="a")]
    assert history([[delete(1, 10)], [up(1, 10, c="a")]]) == []


def test_keys_are_independent() -> None:
    assert history([[up("b", 2, c="y"), up("a", 1, c="x"), delete("a", 3)]]) == [
        v("a", 1, 3, c="x"),
        v("b", 2, None, c="y"),
    ]


def test_truncate_ends_every_current_version_and_keeps_the_past() -> None:
    batches = [
        [up(1, 5, c="old"), up(1, 10, c="a"), up(2, 20, c="b"), up(3, 1, c="gone"), delete(3, 2)],
        [truncate(50)],
        [up(1, 60, c="c")],
    ]
    assert history(batches) == [
        v(1, 5, 10, c="old"),
        v(1, 10, 50, c="a"),
        v(1, 60, None, c="c"),
        v(2, 20, 50, c="b"),
        v(3, 1, 2, c="gone"),
    ]


def test_truncate_then_equal_upsert_leaves_a_gap() -> None:
    assert history([[up(1, 10, c="a"), truncate(20), up(1, 30, c="a")]]) == [v(1, 10, 20, c="a"), v(1, 30, None, c="a")]


def test_late_change_below_an_applied_truncate_ends_at_the_truncate() -> None:
    batches = [[up(1, 10, c="a"), truncate(50)], [up(1, 40, c="b"), up(3, 30, c="new")]]
    assert history(batches) == [v(1, 10, 40, c="a"), v(1, 40, 50, c="b"), v(3, 30, 50, c="new")]


def test_late_change_below_a_truncate_ends_earlier_at_its_keys_next_change() -> None:
    batches = [[up(1, 30, c="b"), truncate(50)], [up(1, 10, c="a")]]
    assert history(batches) == [v(1, 10, 30, c="a"), v(1, 30, 50, c="b")]


def test_upsert_at_the_truncate_position_survives_it() -> None:
    batches = [[up(1, 10, c="a"), truncate(50)], [up(1, 50, c="a"), up(2, 50, c="z")]]
    assert history(batches) == [v(1, 10, 50, c="a"), v(1, 50, None, c="a"), v(2, 50, None, c="z")]


def test_resent_truncate_is_the_same_truncate() -> None:
    batches = [[up(1, 10, c="a"), truncate(20)], [up(1, 30, c="b")], [truncate(20)]]
    assert history(batches) == [v(1, 10, 20, c="a"), v(1, 30, None, c="b")]


def test_truncate_of_an_empty_table_changes_nothing() -> None:
    assert history([[truncate(5)]]) == []
    assert history([[truncate(5)], [up(1, 7, c="a")]]) == [v(1, 7, None, c="a")]


def test_positions_compare_as_whole_tuples() -> None:
    # (1, 9) lies between (1, 5) and (2, 0) although 9 > 0: the first part alone would misplace it
    batches = [[up(1, (1, 5), c="a"), up(1, (2, 0), c="b")], [up(1, (1, 9), c="c")]]
    assert history(batches) == [
        v(1, (1, 5), (1, 9), c="a"),
        v(1, (1, 9), (2, 0), c="c"),
        v(1, (2, 0), None, c="b"),
    ]


def test_positions_sharing_a_first_part_are_distinct() -> None:
    assert history([[up(1, (1, 5), c="a")], [up(1, (1, 6), c="b")]]) == [v(1, (1, 5), (1, 6), c="a"), v(1, (1, 6), None, c="b")]


def test_several_tracked_columns_compare_together() -> None:
    batches = [[up(1, 1, c="a", n=1), up(1, 2, c="a", n=1), up(1, 3, c="a", n=2)]]
    assert history(batches) == [v(1, 1, 3, c="a", n=1), v(1, 3, None, c="a", n=2)]


@pytest.mark.parametrize(
    ("change", "error", "names"),
    [
        (Change(1, 5, "upsert", {"c": "a"}), TypeError, "Change.position"),  # type: ignore[arg-type]
        (Change(1, (5,), "upsert", None), ValueError, "Change.values"),
        (Change(1, (5,), "delete", {"c": "a"}), ValueError, "Change.values"),
        (Change(None, (5,), "truncate", {"c": "a"}), ValueError, "Change.values"),
        (Change(1, (5,), "merge", None), ValueError, "Change.op"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_names_the_field(change: Change, error: type[Exception], names: str) -> None:
    with pytest.raises(error, match=names):
        history([[up(1, 1, c="a")], [change]])


# --- properties ---------------------------------------------------------------------------------

KEYS = st.sampled_from([0, 1, 2])
VALUES = st.fixed_dictionaries({"c": st.sampled_from(["a", "b"])})


@st.composite
def change_lists(draw: st.DrawFn) -> list[Change]:
    """Changes of a few keys with distinct positions per key (and distinct truncates), positions of one arity."""
    arity = draw(st.integers(1, 2))
    positions = st.tuples(*[st.integers(0, 6)] * arity)
    change = st.one_of(
        st.builds(lambda k, p, vals: Change(k, p, "upsert", vals), KEYS, positions, VALUES),
        st.builds(lambda k, p: Change(k, p, "delete", None), KEYS, positions),
        st.builds(lambda k, p: Change(k, p, "truncate", None), KEYS, positions),  # a truncate's key is ignored
    )
    return draw(st.lists(change, max_size=14, unique_by=lambda c: ("T" if c.op == "truncate" else c.key, c.position)))


def split(changes: list[Change], cuts: list[int]) -> list[list[Change]]:
    bounds = [0, *sorted(c % (len(changes) + 1) for c in cuts), len(changes)]
    return [changes[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=examples(300))
@given(change_lists(), st.lists(st.integers(0, 100), max_size=6))
def test_history_does_not_depend_on_the_batch_split(changes: list[Change], cuts: list[int]) -> None:
    assert history(split(changes, cuts)) == history([changes])


@settings(max_examples=examples(300))
@given(change_lists(), st.randoms(use_true_random=False), st.lists(st.integers(0, 100), max_size=6))
def test_history_does_not_depend_on_arrival_order(changes: list[Change], rng: random.Random, cuts: list[int]) -> None:
    shuffled = list(changes)
    rng.shuffle(shuffled)
    assert history(split(shuffled, cuts)) == history([changes])


@settings(max_examples=examples(200))
@given(change_lists(), st.data())
def test_resent_changes_change_nothing(changes: list[Change], data: st.DataObject) -> None:
    resent = data.draw(st.lists(st.sampled_from(changes), max_size=6)) if changes else []
    assert history([changes, resent]) == history([changes])


def _by_key(versions: Sequence[Version]) -> dict[Hashable, list[Version]]:
    grouped: dict[Hashable, list[Version]] = {}
    for version in versions:
        grouped.setdefault(version.key, []).append(version)
    return {key: sorted(vs, key=lambda x: x.start) for key, vs in grouped.items()}


@settings(max_examples=examples(300))
@given(change_lists())
def test_versions_of_a_key_never_overlap_and_at_most_one_is_current(changes: list[Change]) -> None:
    for versions in _by_key(history([changes])).values():
        assert sum(x.end is None for x in versions) <= 1
        for earlier, later in itertools.pairwise(versions):
            assert earlier.end is not None
            assert earlier.end <= later.start
        for x in versions:
            assert x.end is None or x.start < x.end


@settings(max_examples=examples(300))
@given(change_lists())
def test_versions_begin_at_upserts_and_end_at_changes(changes: list[Change]) -> None:
    truncates = {c.position for c in changes if c.op == "truncate"}
    for key, versions in _by_key(history([changes])).items():
        upserts = {c.position: c.values for c in changes if c.op == "upsert" and c.key == key}
        key_changes = {c.position for c in changes if c.op != "truncate" and c.key == key}
        for x in versions:
            assert upserts.get(x.start) == x.values
            assert x.end is None or x.end in key_changes | truncates
        for earlier, later in itertools.pairwise(versions):
            # touching versions differ, except where a truncate removed the row and an upsert re-added it
            if earlier.end == later.start and later.start not in truncates:
                assert earlier.values != later.values


@settings(max_examples=examples(300))
@given(change_lists())
def test_current_version_is_the_last_upsert_unless_deleted_or_truncated_after(changes: list[Change]) -> None:
    current = {x.key: x.values for x in history([changes]) if x.end is None}
    last_truncate = max((c.position for c in changes if c.op == "truncate"), default=None)
    for key in {c.key for c in changes if c.op != "truncate"}:
        last = max((c for c in changes if c.op != "truncate" and c.key == key), key=lambda c: c.position)
        alive = last.op == "upsert" and (last_truncate is None or last_truncate <= last.position)
        assert current.get(key) == (last.values if alive else None)
