"""The commit's own check of a new checkpoint: planning reads a checkpoint's query id from
the driver's file system, so a checkpoint on an object store is decided at commit, from the
query id the tasks carry. A named query's first batch from another checkpoint is refused
there (with `replace` too: the driver could not empty the table before the batch, and says
so), the table unchanged, and Spark's abort removes the batch's files."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import load, pyiceberg_rows
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lakesink_datasource.datasource import LakeSinkDataSource
from lakesink_datasource.table.new_checkpoint import NewCheckpointRefused, stream_property
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])


def _batch(options: dict[str, str], query_id: str, batch_id: int, rows: list[tuple[int, str]]) -> tuple[object, object]:
    writer = LakeSinkDataSource(options).streamWriter(SCHEMA, False)
    arrow = pa.RecordBatch.from_arrays([pa.array([r[0] for r in rows], pa.int64()), pa.array([r[1] for r in rows])], ["id", "v"])
    return writer, write_task(writer.plan, iter([arrow]), TaskIdentity(query_id=query_id, batch_id=batch_id))


@pytest.mark.parametrize("new_checkpoint", ["refuse", "replace"])
def test_a_new_checkpoint_on_an_object_store_is_refused_at_commit_and_changes_nothing(warehouse: str, new_checkpoint: str) -> None:
    common = {"table": "db.events", "warehouse": warehouse, "queryName": "events", "maintenance": "off"}
    first, message = _batch({**common, "checkpointLocation": "s3://checkpoints/events-1"}, "query-1", 0, [(1, "a"), (2, "b")])
    first.commit([message], 0)  # type: ignore[attr-defined]
    table = load(warehouse, "db.events")
    assert table.metadata.properties[stream_property("events")] == "query-1"
    before = table.metadata.current_snapshot_id

    options = {**common, "checkpointLocation": "s3://checkpoints/events-2", "new_checkpoint": new_checkpoint}
    second, message = _batch(options, "query-2", 0, [(1, "a"), (2, "b")])  # planning cannot read s3://: it passes
    written = [f.path for f in message.result().data_files]  # type: ignore[attr-defined]
    assert written and all(os.path.exists(p.removeprefix("file://")) for p in written)
    why = "is not on a local file system: empty the table yourself" if new_checkpoint == "replace" else "Set option new_checkpoint to 'replace'"
    with pytest.raises(NewCheckpointRefused, match=rf"streaming query 'events' from another checkpoint \(query id query-1\).*{why}"):
        second.commit([message], 0)  # type: ignore[attr-defined]
    second.abort([message], 0)  # what Spark does after a failed commit
    table = load(warehouse, "db.events")
    assert table.metadata.current_snapshot_id == before
    assert pyiceberg_rows(table, ["id", "v"]) == {(1, "a"): 1, (2, "b"): 1}
    assert not any(os.path.exists(p.removeprefix("file://")) for p in written)
    assert not Path(warehouse, "checkpoints").exists()
