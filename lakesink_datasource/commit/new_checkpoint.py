"""Emptying a table for a new checkpoint's first batch (option new_checkpoint=replace).

The design is table/new_checkpoint.py's. The table is emptied in a snapshot of its own, a
whole-table overwrite that adds nothing, before the batch is planned: the batch then plans,
writes and commits against an empty table exactly as any batch does, keyed ones included (a
keyed batch planned against the old rows would hide positions in files the emptying removes,
and be refused at its commit). The same snapshot records the new query's id under the
query's name, so a batch that fails after it and runs again does not empty the table twice.
"""

from __future__ import annotations

import msgspec

from lakesink_datasource.catalog import loader
from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.options import WriteOptions
from lakesink_datasource.schema.iceberg_to_spark import iceberg_to_spark
from lakesink_datasource.table.new_checkpoint import NEW_CHECKPOINT_SUMMARY, ContentsToReplace, stream_property
from lakesink_datasource.table.setup import plan_write


def empty_for_new_checkpoint(options: WriteOptions, found: ContentsToReplace) -> CommitOutcome:
    """Replace the contents of `options.table` with nothing, recording `found.query_id` as
    the query that now writes under `found.query_name`."""
    table = loader.load(loader.catalog_config(options)).load_table(options.table)
    emptying = msgspec.structs.replace(
        options,
        # A plain overwrite of the whole table: none of the stream's own write rules apply to
        # a snapshot that adds no rows (and a keyed operation refuses overwrites).
        operation="append", primary_key=None, op_column=None, sequence_column=None, merge_schema=False,
        evolve_partition=False, partition_by=None, sort_by=None, format_version=None, overwrite_mode="static",
        replace_where=None, txn_app_id=None, txn_version=None, maintenance="off", progress=False, new_checkpoint="append",
        table_properties={**options.table_properties, stream_property(found.query_name): found.query_id},
        snapshot_properties={
            **options.snapshot_properties,
            NEW_CHECKPOINT_SUMMARY: f"query {found.query_name!r}: {found.query_id} replaces {found.previous}",
        },
    )
    # The table's own columns, so the plan matches it whatever the stream's schema is.
    plan = plan_write(emptying, iceberg_to_spark(table.schema()), overwrite=True)
    return commit_write(plan, [], batch_id=None)
