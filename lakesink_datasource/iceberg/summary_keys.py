"""Snapshot summary keys lakesink writes and reads, in one place.

The streaming keys are the ones Iceberg's own Spark sink uses, so a query can switch sinks
without replaying batches; the `lakesink.*` keys are lakesink's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping

QUERY_ID = "spark.sql.streaming.queryId"
EPOCH_ID = "spark.sql.streaming.epochId"
WRITE_ID = "lakesink.write-id"  # unique per planned write: recognises a commit after a lost response
HOSTS = "lakesink.hosts"  # hosts whose tasks contributed to a keyed batch
COMPACTION = "lakesink.compaction"  # "true" on the replace snapshots of lakesink's compaction
TXN_APP_ID = "lakesink.txn-app-id"  # idempotent batch writes (options txn_app_id, txn_version)
TXN_VERSION = "lakesink.txn-version"
TOMBSTONES = "lakesink.tombstones"  # Parquet files of a batch's sequenced deletes
DELETED_KEYS = "lakesink.deleted-keys"  # Parquet files of the keys a batch deleted without a sequence
# Keyed batches: "true" when every key the batch deleted is in its TOMBSTONES or DELETED_KEYS
# files (so another host's index follows the batch from them), and the task attempts whose
# changes it holds ("<partition>.<attempt>,...", the attempt being Spark's task attempt id),
# so a host knows which of its own undo tokens the batch committed (an attempt lost with its
# executor never did).
DELETES_REPORTED = "lakesink.deletes-reported"
TASK_ATTEMPTS = "lakesink.task-attempts"
# How many write tasks a batch ran: the next write deals its carried compaction out to as many.
TASKS = "lakesink.tasks"
# Hosts whose key index started over for this batch (a rebuild from the table or a published
# copy), with why: "<host>: rebuilt (reason); ...". Absent when every index was followed.
INDEX_STARTS = "lakesink.index-starts"
# What maintenance does not do on this table and why (gc.enabled=false): in the summary of
# the first batch that found it so, and as a table property of the same name that keeps it
# from being said again (summaries expire).
MAINTENANCE_NOTE = "lakesink.maintenance-note"
ENGINE_NAME = "engine-name"
TOTAL_DATA_FILES = "total-data-files"  # Iceberg's own: live data files after the snapshot
ENGINE_VERSION = "engine-version"
LAKESINK_VERSION = "lakesink-version"
ROWS_IN = "lakesink.rows-in"
ROWS_WRITTEN = "lakesink.rows-written"
ROWS_DELETED = "lakesink.rows-deleted"
PARTITION_SECONDS = "lakesink.partition-seconds"
INDEX_SECONDS = "lakesink.index-seconds"
INDEX_SYNC_SECONDS = "lakesink.index-sync-seconds"  # of those: the hosts' indexes following the table
WRITE_SECONDS = "lakesink.write-seconds"
COMMIT_PREPARE_SECONDS = "lakesink.commit-prepare-seconds"  # driver: commit start until the snapshot is written
# Rows this batch hides that a compaction committed meanwhile had moved: found again by
# "<by row id>,<by key>,<no longer live>" (commit/rebase.py).
MOVED_DELETES = "lakesink.deletes-moved-by-compaction"
# Keyed batches that shared keys with commits made since they were planned: how many keys
# the commit decided itself, and the Parquet file of the outcome (key columns, the winner's
# sequence, file and position, or none for a deleted key) that hosts' indexes apply.
KEYS_REDECIDED = "lakesink.keys-redecided"
REDECIDED_KEYS = "lakesink.redecided-keys"
# A batch that took a source table's truncate: the position (hex) its rows were hidden
# before. Key indexes start over after it rather than follow it key by key.
TRUNCATED = "lakesink.truncated"


def task_attempt(partition_id: int, attempt: int) -> str:
    """One entry of TASK_ATTEMPTS."""
    return f"{partition_id}.{attempt}"


def listed_task_attempts(properties: Mapping[str, str]) -> frozenset[str] | None:
    """The entries of a snapshot's TASK_ATTEMPTS; None when it has none (not a keyed batch,
    or one of a lakesink before it)."""
    value = properties.get(TASK_ATTEMPTS)
    return None if value is None else frozenset(filter(None, value.split(",")))


def tasks_of(properties: Mapping[str, str]) -> int:
    """How many write tasks a batch's snapshot says it ran; 0 when it does not say."""
    if TASKS in properties:
        return int(properties[TASKS])
    # Keyed batches of a lakesink before TASKS: their tasks are the partitions they list.
    return len({a.split(".", 1)[0] for a in listed_task_attempts(properties) or ()})
