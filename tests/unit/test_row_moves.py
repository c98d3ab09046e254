"""Move maps against a plain model: rows are named by their row id; a compaction keeps some
of them (shuffled, split across new files); the model follows each row by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from lakesink_datasource.index.location_codec import Found
from lakesink_datasource.index.row_moves import NO_ROW, compose, maps_from_row_ids, translate

Files = dict[int, list[int]]  # ordinal -> row id per position


@st.composite
def compactions(draw: st.DrawFn, rounds: int = 2) -> tuple[Files, list[tuple[list[int], Files]]]:
    """Files of a table (ordinal -> row ids) and `rounds` compactions, each: which files it
    removes and the new files (ordinal -> row ids) holding a shuffled subset of their rows."""
    next_id, next_ordinal = 0, 0
    files: Files = {}
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 12))
        files[next_ordinal] = list(range(next_id, next_id + n))
        next_id += n
        next_ordinal += 1
    live = dict(files)
    steps = []
    for _ in range(rounds):
        removed = draw(st.lists(st.sampled_from(sorted(live)), min_size=1, unique=True)) if live else []
        rows = [r for o in removed for r in live[o]]
        kept = [r for r, keep in zip(rows, draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))) if keep]
        kept = draw(st.permutations(kept))
        cuts = sorted(draw(st.lists(st.integers(0, len(kept)), max_size=2)))
        added: Files = {}
        for part in np.split(np.array(kept, dtype=np.int64), cuts):
            added[next_ordinal] = [int(x) for x in part]
            next_ordinal += 1
        for o in removed:
            del live[o]
        live.update(added)
        files.update(added)
        steps.append((removed, added))
    return files, steps


def _ids(rows: list[int]) -> np.ndarray:
    return np.array(rows, dtype=np.int64)


def _where(files: Files, live: set[int]) -> dict[int, tuple[int, int]]:
    """Model: row id -> (ordinal, position) of its live copy."""
    return {r: (o, p) for o in live for p, r in enumerate(files[o])}


@settings(max_examples=examples(200), deadline=None)
@given(compactions(rounds=1))
def test_one_compaction_maps_every_old_place_to_the_rows_new_place(case: tuple[Files, list]) -> None:
    files, [(removed, added)] = case
    maps = maps_from_row_ids([(o, _ids(files[o])) for o in removed], [(o, _ids(rows)) for o, rows in added.items()])
    assert maps is not None and set(maps) == set(removed)
    now = _where(files, set(added))
    for o in removed:
        for p, row in enumerate(files[o]):
            expected = (now[row][0] << 32 | now[row][1]) if row in now else NO_ROW
            assert maps[o][p] == expected, (o, p, row)


@settings(max_examples=examples(200), deadline=None)
@given(compactions(rounds=3), st.data())
def test_composed_maps_and_translate_follow_a_row_through_every_compaction(case: tuple[Files, list], data: st.DataObject) -> None:
    """Keys pointing at the original files, after several compactions recorded one by one
    (each composed into the earlier maps), read the rows' current places, or absent for a
    row some compaction dropped."""
    files, steps = case
    original = {o: rows for o, rows in files.items() if all(o not in added for _, added in steps)}
    stored: dict[int, np.ndarray] = {}
    live = set(original)
    for removed, added in steps:
        maps = maps_from_row_ids([(o, _ids(files[o])) for o in removed], [(o, _ids(rows)) for o, rows in added.items()])
        assert maps is not None
        stored.update(compose(stored, maps))
        stored.update(maps)
        live = (live - set(removed)) | set(added)
    # Every place of the original files, some asked twice, in a random order.
    places = [(o, p) for o, rows in original.items() for p in range(len(rows))]
    asked = data.draw(st.lists(st.sampled_from(places), max_size=40)) if places else []
    found = Found(
        np.ones(len(asked), dtype=bool),
        np.array([o for o, _ in asked], dtype=np.int64),
        np.array([p for _, p in asked], dtype=np.int64),
        [b"s%d" % i for i in range(len(asked))],
    )
    got = translate(found, stored)
    now = _where(files, live)
    for i, (o, p) in enumerate(asked):
        row = original[o][p]
        if o in live:  # never compacted: the key still points at its own place
            assert (got.present[i], got.ordinal[i], got.position[i]) == (True, o, p)
        elif row in now:
            assert (got.present[i], got.ordinal[i], got.position[i]) == (True, *now[row])
            assert got.sequence is not None and got.sequence[i] == b"s%d" % i  # a move keeps the key's sequence
        else:
            assert not got.present[i] and got.sequence is not None and got.sequence[i] is None


def test_translate_leaves_keys_in_files_no_compaction_touched() -> None:
    found = Found(np.array([True, False, True]), np.array([7, 0, 9], dtype=np.int64), np.array([1, 0, 2], dtype=np.int64), None)
    maps = {9: np.array([NO_ROW, NO_ROW, (3 << 32) | 5], dtype=np.int64)}
    got = translate(found, maps)
    assert got.present.tolist() == [True, False, True]
    assert got.ordinal.tolist() == [7, 0, 3] and got.position.tolist() == [1, 0, 5]
    assert found.ordinal.tolist() == [7, 0, 9]  # the input is not changed


def test_row_ids_that_cannot_tell_where_rows_went_give_no_maps() -> None:
    a, b = np.array([1, 2, 3], dtype=np.int64), np.array([4, 5], dtype=np.int64)
    assert maps_from_row_ids([(0, a), (1, b)], [(2, np.array([5, 1, 3], dtype=np.int64))]) is not None
    assert maps_from_row_ids([(0, a), (1, b)], [(2, np.array([5, 6], dtype=np.int64))]) is None  # 6: from no removed file
    assert maps_from_row_ids([(0, a), (1, a)], [(2, a)]) is None  # an id in two removed files
    assert maps_from_row_ids([(0, a)], [(2, np.array([1, 1], dtype=np.int64))]) is None  # one old row written twice
    assert maps_from_row_ids([(0, a)], [(2, np.array([-1, 2], dtype=np.int64))]) is None  # a row without an id
