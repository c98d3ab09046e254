"""What a compaction of a table's current state rewrites: its live files as the tiered
planner (`plan.py`) sees them, and the planner's choice within a byte budget."""

from __future__ import annotations

from pyiceberg.schema import index_by_id
from pyiceberg.table import Table

from lakesink_datasource.compaction.plan import CompactionPlan, FileStats, plan_compaction
from lakesink_datasource.compaction.rewrite import RewriteInput
from lakesink_datasource.iceberg.live_files import live_data_files, live_position_deletes
from lakesink_datasource.iceberg.partition_key import encode_partition
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.index.key_shards import file_shard


def plan_for(
    table: Table, budget_bytes: int, target_file_size: int | None = None, *, tiered: bool = True, min_files: int = 0
) -> tuple[CompactionPlan, dict[str, RewriteInput]]:
    """The compaction worth doing on the table's current state, within `budget_bytes`."""
    metadata = table.metadata
    snapshot = metadata.current_snapshot()
    specs = metadata.specs()
    schema = metadata.schema()
    settings = TableSettings.of_table(metadata)
    dvs = live_position_deletes(table.io, snapshot)
    column_ids = set(index_by_id(schema))
    readable_specs = {i for i, spec in specs.items() if all(f.source_id in column_ids for f in spec.fields)}
    inputs: dict[str, RewriteInput] = {}
    stats: list[FileStats] = []
    for entry in live_data_files(table.io, snapshot):
        f = entry.data_file
        if f.spec_id not in readable_specs:
            continue  # an earlier spec on a column since dropped: its partition values cannot be re-read
        dv = dvs.get(f.file_path)
        inputs[f.file_path] = RewriteInput(entry, dv)
        # Files of an earlier spec merge with the files of their own old partition; what
        # they are rewritten into is laid out by the current spec (rewrite_files).
        # Files of one key shard (cluster_by_key's) merge only among themselves, so what a
        # shard's index reads stays that shard's (key_shards.py).
        shard = file_shard(f.file_path)
        key = (f.spec_id, encode_partition(specs[f.spec_id], schema, f.partition), shard.file_tag() if shard else None)
        stats.append(FileStats(
            f.file_path, key, f.file_size_in_bytes, f.record_count, dv.data_file.record_count if dv else 0,
            earlier_spec=f.spec_id != metadata.default_spec_id,
        ))
    plan = plan_compaction(
        stats, target_file_size or settings.target_file_size_bytes, budget_bytes, tiered=tiered, min_files=min_files,
        fan_in=settings.compaction_fan_in, large_file_bytes=settings.compaction_large_file_bytes,
    )
    return plan, inputs
