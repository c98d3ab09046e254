"""Which writes and micro-batches of a streaming query already reached the table.

The table is the source of truth: each lakesink streaming commit records the query id and
the batch (epoch) id in its snapshot summary, under the keys Iceberg's own Spark sink uses,
and sets the table property `lakesink.last-epoch.<query id>` in the same commit. A replayed
batch finds its epoch there and is not applied twice. The property survives snapshot expiry
(the summary does not) and costs one lookup however long the history; the summaries are
still walked for tables written before the property existed.

Batch writes get the same promise with options `txn_app_id` + `txn_version` (Delta's
`txnAppId` / `txnVersion`): the commit records both in its summary and sets
`lakesink.last-txn-version.<app id>`; a write whose version is not above the recorded one is
skipped, whether it is a `foreachBatch` call repeated by a retried micro-batch or a job
rerun after a crash.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.iceberg.history import ancestors, branch_head, snapshots_after
from lakesink_datasource.iceberg.summary_keys import EPOCH_ID, QUERY_ID, TXN_APP_ID, TXN_VERSION, WRITE_ID

LAST_EPOCH_PREFIX = "lakesink.last-epoch."
LAST_TXN_PREFIX = "lakesink.last-txn-version."


def last_txn_property(app_id: str) -> str:
    return f"{LAST_TXN_PREFIX}{app_id}"


def is_txn_committed(metadata: TableMetadata, app_id: str | None, version: int | None) -> bool:
    """Is a write of `app_id` with `version` or a later one already in the table?"""
    if app_id is None or version is None:
        return False
    last = _last_recorded(metadata, last_txn_property(app_id), TXN_APP_ID, app_id, TXN_VERSION)
    return last is not None and version <= last


def _last_recorded(metadata: TableMetadata, prop: str, id_key: str, writer: str, value_key: str) -> int | None:
    """The newest value `writer` recorded: the table property `prop` (kept through expiry),
    else the newest retained snapshot whose summary has `id_key` = writer and `value_key`."""
    recorded = metadata.properties.get(prop)
    if recorded is not None:
        return int(recorded)
    for snapshot in ancestors(metadata):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(id_key) == writer and value_key in props:
            return int(props[value_key])
    return None


def last_epoch_property(query_id: str) -> str:
    return f"{LAST_EPOCH_PREFIX}{query_id}"


def last_committed_epoch(metadata: TableMetadata, query_id: str) -> int | None:
    """The newest epoch of `query_id` committed to the table, or None."""
    return _last_recorded(metadata, last_epoch_property(query_id), QUERY_ID, query_id, EPOCH_ID)


def is_epoch_committed(metadata: TableMetadata, query_id: str | None, epoch: int | None) -> bool:
    if query_id is None or epoch is None:
        return False
    last = last_committed_epoch(metadata, query_id)
    return last is not None and epoch <= last


def is_write_committed(metadata: TableMetadata, write_id: str, since_snapshot_id: int | None, branch: str | None = None) -> bool:
    """Did a commit of `write_id` land on `branch` (None: main) after `since_snapshot_id` (the
    state it planned on)?"""
    after, _ = snapshots_after(metadata, since_snapshot_id, head=branch_head(metadata, branch))
    return any(s.summary is not None and s.summary.get(WRITE_ID) == write_id for s in after)
