"""Which data files a compaction rewrites: tiered by size, bounded by a byte budget.

A stream adds a few small files per partition and batch. Merging every small file of a
partition each time would rewrite the same bytes again and again; merging nothing lets
file counts (and read cost) grow without bound. Tiers sit in between, as in an LSM tree,
with a fan-in F (table property `lakesink.maintenance.compaction-fan-in`, default 8): a
file's class is log_F of its live bytes (from 64 KiB up), and a partition merges the files
of a class once it holds F of them, so a byte is rewritten about once per class it climbs
(log_F of how much it grows) and a partition keeps at most about F - 1 files per class. A
larger F rewrites less and leaves more files. Files of at least `large_file_bytes`
(`lakesink.maintenance.compaction-large-file-bytes`, 8 MiB) stop climbing: a reader pays
little per byte for them, and merging them again would rewrite a large stream's every byte
a few more times (benchmarks/results/STREAM-APPEND.md); `maintain compact` merges them. Files whose rows are mostly deleted are rewritten even alone (their
DVs go with them), and so are small files of an earlier partition spec (into the current
one, so a stream's files converge on the evolved layout; large ones are left as they are,
readable under their own spec). Fully deleted files are simply dropped.

Each call picks work up to a byte budget (smallest classes first: they cost least and
remove most files), so the time a micro-batch spends on compaction stays bounded. After a
batch, work is also held back until it adds up to `min_files` input files (and dropped
ones; `after_batch` asks for a few batches' worth): every compaction is a snapshot of its
own and makes each host's key index re-read the rewritten rows, a cost per compaction more
than per byte, so most batches commit without one and the batches that do carry several
batches' worth of merging.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

MIN_CLASS_BYTES = 64 * 1024
FAN_IN = 8  # files of one class that make a merge; the ratio between classes
DELETED_FRACTION_TO_REWRITE = 0.5  # a file this much deleted is rewritten even alone
SMALL_FRACTION = 0.75  # a file below this fraction of the target size counts as small


@dataclass(frozen=True)
class FileStats:
    """One live data file as the planner sees it."""

    path: str
    partition: Hashable  # (spec id, partition values): files only merge within one
    size: int  # bytes on storage
    records: int
    deleted: int = 0  # rows hidden by its DV
    # Laid out by an earlier partition spec: worth rewriting even alone (into the current one).
    earlier_spec: bool = False

    @property
    def live_records(self) -> int:
        return self.records - self.deleted

    @property
    def live_bytes(self) -> int:
        return 0 if self.records == 0 else math.ceil(self.size * self.live_records / self.records)

    @property
    def deleted_fraction(self) -> float:
        return self.deleted / self.records if self.records else 1.0

    @property
    def worth_alone(self) -> bool:
        """Rewriting this file pays even with nothing to merge it with."""
        return self.deleted_fraction >= DELETED_FRACTION_TO_REWRITE or self.earlier_spec


@dataclass
class RewriteGroup:
    partition: Hashable
    files: list[FileStats] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class CompactionPlan:
    groups: list[RewriteGroup]
    dropped: list[FileStats]  # every row deleted: removed without rewriting

    @property
    def is_empty(self) -> bool:
        return not self.groups and not self.dropped


def size_class(live_bytes: int, fan_in: int = FAN_IN) -> int:
    return max(0, int(math.log(max(live_bytes, 1) / MIN_CLASS_BYTES, fan_in)) + 1) if live_bytes >= MIN_CLASS_BYTES else 0


def plan_compaction(
    files: Iterable[FileStats], target_file_size: int, budget_bytes: int, *, tiered: bool = True, min_files: int = 0,
    fan_in: int = FAN_IN, large_file_bytes: int | None = None,
) -> CompactionPlan:
    """Groups to rewrite (each into one file of at most about `target_file_size`), within
    `budget_bytes` of input, and the files to drop outright; nothing while that is fewer than
    `min_files` files. `tiered=False` (an operator's full compaction) merges every
    partition's small files whenever it has two or more."""
    min_group_files = fan_in if tiered else 2
    dropped: list[FileStats] = []
    by_class: dict[tuple[int, Hashable], list[FileStats]] = defaultdict(list)
    for f in files:
        if f.live_records <= 0:
            dropped.append(f)
            continue
        small = f.size < target_file_size * SMALL_FRACTION and (not tiered or large_file_bytes is None or f.size < large_file_bytes)
        if small or f.deleted_fraction >= DELETED_FRACTION_TO_REWRITE:
            by_class[(size_class(f.live_bytes, fan_in) if tiered else 0, f.partition)].append(f)

    candidates: list[tuple[int, RewriteGroup]] = []
    for (cls, partition), members in by_class.items():
        if len(members) < min_group_files and not any(f.worth_alone for f in members):
            continue
        # Oldest-first order is not known here; by path keeps the choice deterministic.
        members.sort(key=lambda f: f.path)
        group = RewriteGroup(partition)
        live = 0
        for f in members:
            if group.files and live + f.live_bytes > target_file_size:
                candidates.append((cls, group))
                group, live = RewriteGroup(partition), 0
            group.files.append(f)
            live += f.live_bytes
        candidates.append((cls, group))

    chosen: list[RewriteGroup] = []
    left = budget_bytes
    for _cls, group in sorted(candidates, key=lambda c: (c[0], -len(c[1].files))):
        worth = len(group.files) >= 2 or any(f.worth_alone for f in group.files)
        if worth and group.bytes <= left:
            chosen.append(group)
            left -= group.bytes
    if sum(len(g.files) for g in chosen) + len(dropped) < min_files:
        return CompactionPlan([], [])
    return CompactionPlan(chosen, dropped)
