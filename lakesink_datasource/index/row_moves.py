"""Where a compaction moved each row, so the key index can follow without rewriting keys.

A compaction rewrites live rows into new files. Pointing every moved key at its new place
costs one index write per key (for a 1M-row file ~0.8 s, the slowest batch of a CDC
stream). Instead the index keeps, per removed file (by its ordinal), a *move map*: an int64
per row position of the old file holding the row's new place (`new ordinal << 32 | new
position`), or NO_ROW for a row the compaction dropped. Keys keep pointing at the old
file; a lookup translates them (`translate`) with a few numpy gathers. A key that is
written again gets a direct location, and the maps are folded away (their target files
re-indexed a few at a time, the entries into them retired) once they outgrow the index.

The map is derived from Iceberg v3 row lineage, not from how the rewrite ordered its
rows: a rewrite keeps each row's `_row_id`, so joining the new files' row ids with the
removed files' ones gives every row's old and new place, whatever the engine (lakesink's
compaction, Iceberg Java's `rewrite_data_files`). Anything that breaks the join (a v2
table, a row without an id, an id found twice or not at all, a removed file already gone)
makes the caller fall back to re-indexing the new files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from lakesink_datasource.arrays import unique_sorted
from lakesink_datasource.index.location_codec import Found

NO_ROW = -1  # the compaction dropped the row (it was deleted)
_POSITION_BITS = 32
_POSITION_MASK = (1 << _POSITION_BITS) - 1

MoveMaps = Mapping[int, np.ndarray]  # old file ordinal -> int64 new place per old position


def pack_places(ordinal: int, positions: np.ndarray) -> np.ndarray:
    return (np.int64(ordinal) << _POSITION_BITS) | positions.astype(np.int64)


def place_ordinals(places: np.ndarray) -> np.ndarray:
    """The file ordinal of each place, NO_ROW where the row was dropped."""
    return np.where(places >= 0, places >> _POSITION_BITS, NO_ROW)


def maps_from_row_ids(
    sources: Sequence[tuple[int, np.ndarray]], targets: Sequence[tuple[int, np.ndarray]]
) -> dict[int, np.ndarray] | None:
    """Move maps of a rewrite: `sources` are the removed files (ordinal, row id per
    position), `targets` the added ones. None when row ids cannot tell every new row's
    origin: unknown ids (negative), an id twice among the sources or among the targets, a
    target id that no source has, or positions beyond what a map can hold."""
    if any(len(ids) > _POSITION_MASK for _, ids in [*sources, *targets]):
        return None
    src_ids = np.concatenate([ids for _, ids in sources]) if sources else np.zeros(0, np.int64)
    tgt_ids = np.concatenate([ids for _, ids in targets]) if targets else np.zeros(0, np.int64)
    if (src_ids < 0).any() or (tgt_ids < 0).any():
        return None
    order = np.argsort(src_ids, kind="stable")
    ordered = src_ids[order]
    if len(ordered) > 1 and not (np.diff(ordered) > 0).all():
        return None  # an id twice among the removed files
    at = np.searchsorted(ordered, tgt_ids)
    if len(tgt_ids) and ((at >= len(ordered)).any() or (ordered[np.minimum(at, len(ordered) - 1)] != tgt_ids).any()):
        return None  # a new row whose origin is not among the removed files
    origin = order[at]  # index into src_ids of each new row's old row
    new_places = np.concatenate([pack_places(o, np.arange(len(ids))) for o, ids in targets]) if targets else np.zeros(0, np.int64)
    flat = np.full(len(src_ids), NO_ROW, dtype=np.int64)
    flat[origin] = new_places
    if np.count_nonzero(flat >= 0) != len(origin):
        return None  # one old row written twice (two new rows landed on one old place)
    maps: dict[int, np.ndarray] = {}
    start = 0
    for ordinal, ids in sources:
        maps[ordinal] = flat[start : start + len(ids)]
        start += len(ids)
    return maps


def compose(existing: MoveMaps, new: MoveMaps) -> dict[int, np.ndarray]:
    """The existing maps that lead into a file `new` moves, re-aimed at the rows' new
    places (so a lookup translates once, however often a row moved). Returns only the maps
    that changed."""
    if not new:
        return {}
    moved_ordinals = np.fromiter(new, dtype=np.int64, count=len(new))
    changed: dict[int, np.ndarray] = {}
    for ordinal, places in existing.items():
        ordinals = place_ordinals(places)
        hit = np.isin(ordinals, moved_ordinals)
        if not hit.any():
            continue
        updated = np.array(places, dtype=np.int64)  # a copy: `existing` may be a view
        for target in unique_sorted(ordinals[hit]).tolist():
            at = np.flatnonzero(ordinals == target)
            updated[at] = new[target][updated[at] & _POSITION_MASK]
        changed[ordinal] = updated
    return changed


def translate(found: Found, maps: MoveMaps) -> Found:
    """`found` with every location in a moved file replaced by the row's new place. A key
    whose row the compaction dropped reads as absent (its row was deleted)."""
    if not maps:
        return found
    moved_ordinals = np.fromiter(maps, dtype=np.int64, count=len(maps))
    hit = found.present & np.isin(found.ordinal, moved_ordinals)
    if not hit.any():
        return found
    present, ordinal, position = found.present.copy(), found.ordinal.copy(), found.position.copy()
    for old in unique_sorted(found.ordinal[hit]).tolist():
        at = np.flatnonzero(hit & (found.ordinal == old))
        places = maps[old]
        inside = found.position[at] < len(places)
        places_at = np.full(len(at), NO_ROW, dtype=np.int64)
        places_at[inside] = places[found.position[at][inside]]
        gone = places_at < 0
        present[at[gone]] = False
        ordinal[at] = np.where(gone, 0, places_at >> _POSITION_BITS)
        position[at] = np.where(gone, 0, places_at & _POSITION_MASK)
    sequence = found.sequence
    if sequence is not None and not np.array_equal(present, found.present):
        sequence = [s if p else None for s, p in zip(sequence, present.tolist())]
    return Found(present, ordinal, position, sequence)


def moved_rows(maps: MoveMaps) -> int:
    return sum(len(places) for places in maps.values())
