"""How much a stream's compaction may do per write: a byte budget and a minimum of files."""

from __future__ import annotations

from lakesink_datasource.iceberg.properties import TableSettings

# Per batch, compaction may rewrite this many times the bytes the batch wrote (at least the
# table's compaction-min-bytes-per-batch): a byte of a stream is rewritten about once per size
# class (~7 classes up to 512 MiB files), so this keeps up while bounding the batch's latency.
BUDGET_FACTOR = 8


def compaction_budget(settings: TableSettings, batch_bytes: int) -> int:
    return max(settings.compaction_min_budget_bytes, BUDGET_FACTOR * batch_bytes)


def compaction_min_files(settings: TableSettings, batch_files: int) -> int:
    """Files worth merging that make a compaction run: `compaction-batches-per-run` batches'
    worth of the files a batch adds, at least what one merge needs."""
    return max(settings.compaction_fan_in, settings.compaction_batches_per_run * batch_files)
