"""The compaction planner's policy (compaction/plan.py), without a table: what it picks obeys
its rules for any files, and over a long stream it rewrites each byte about once per size
class it climbs while the files it leaves stay bounded."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from lakesink_datasource.compaction.plan import MIN_CLASS_BYTES, FileStats, plan_compaction, size_class

TARGET = 512 << 20

_files = st.lists(
    st.builds(
        lambda i, part, size, records, deleted: FileStats(f"f{i}", part, size, records, min(deleted, records)),
        st.integers(0, 10**6), st.integers(0, 2), st.integers(1, 64 << 20), st.integers(1, 1000), st.integers(0, 1000),
    ),
    max_size=60, unique_by=lambda f: f.path,
)


@settings(max_examples=examples(200))
@given(files=_files, budget=st.integers(0, 256 << 20), fan_in=st.integers(2, 16), min_files=st.integers(0, 20))
def test_a_plan_follows_its_rules_for_any_files(files: list[FileStats], budget: int, fan_in: int, min_files: int) -> None:
    plan = plan_compaction(files, TARGET, budget, fan_in=fan_in, min_files=min_files)
    chosen = [f for g in plan.groups for f in g.files]
    assert len({f.path for f in chosen + plan.dropped}) == len(chosen) + len(plan.dropped)  # no file twice
    assert all(f.live_records == 0 for f in plan.dropped) and all(f.live_records > 0 for f in chosen)
    assert sum(g.bytes for g in plan.groups) <= budget
    if not plan.is_empty:
        assert len(chosen) + len(plan.dropped) >= min_files
    for group in plan.groups:
        assert len({f.partition for f in group.files}) == 1  # merges stay inside a partition
        # A merge of one size class needs fan_in files, unless a file is worth rewriting alone.
        assert len(group.files) >= 2 or any(f.worth_alone for f in group.files)
        if not any(f.worth_alone for f in group.files):
            assert len({size_class(f.live_bytes, fan_in) for f in group.files}) == 1
    # Nothing left out that the rules would take: every class with fan_in small files of one
    # partition is merged, when the budget allows all of it and nothing holds it back.
    if budget >= sum(f.size for f in files) and min_files == 0:
        by_class: dict[tuple[int, object], int] = {}
        for f in files:
            if f.live_records > 0 and f.size < TARGET * 0.75:
                key = (size_class(f.live_bytes, fan_in), f.partition)
                by_class[key] = by_class.get(key, 0) + 1
        merged = {(size_class(f.live_bytes, fan_in), f.partition) for f in chosen}
        assert {k for k, n in by_class.items() if n >= fan_in} <= merged


def _stream(batches: int, file_bytes: int, fan_in: int, files_per_batch: int = 2) -> tuple[float, int]:
    """A stream's files under the planner, as compaction/carried.py runs it (planned at each
    batch on what the batches before wrote): (bytes rewritten per byte written, files left)."""
    files: list[FileStats] = []
    written = rewritten = made = 0
    for _ in range(batches):
        plan = plan_compaction(files, TARGET, max(32 << 20, 8 * file_bytes * files_per_batch), fan_in=fan_in,
                               min_files=max(fan_in, 3 * files_per_batch))
        for group in plan.groups:
            gone = {f.path for f in group.files}
            files = [f for f in files if f.path not in gone]
            made += 1
            files.append(FileStats(f"c{made}", 0, group.bytes, sum(f.records for f in group.files)))
            rewritten += group.bytes
        for _ in range(files_per_batch):
            made += 1
            files.append(FileStats(f"b{made}", 0, file_bytes, 1000))
            written += file_bytes
    return rewritten / written, len(files)


@pytest.mark.parametrize("fan_in", [4, 8])
def test_a_long_stream_rewrites_each_byte_about_once_per_class_and_keeps_its_files_bounded(fan_in: int) -> None:
    for batches, file_bytes in ((200, 75_000), (600, 75_000), (20, 7_500_000)):
        amplification, left = _stream(batches, file_bytes, fan_in)
        climbed = math.log(batches * 2 * file_bytes / max(file_bytes, MIN_CLASS_BYTES), fan_in)
        assert amplification <= climbed + 1, (batches, amplification, climbed)
        classes = size_class(batches * 2 * file_bytes, fan_in) + 1
        assert left <= (fan_in - 1) * classes + 3 * 2, (batches, left)


def test_a_larger_fan_in_rewrites_less_and_leaves_more_files() -> None:
    four, eight = _stream(600, 75_000, 4), _stream(600, 75_000, 8)
    assert eight[0] < four[0] and eight[1] > four[1]
