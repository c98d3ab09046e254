"""`snapshot_property.<key>`: user keys in the commit's snapshot summary (Delta's userMetadata)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from lakesink_testing import load
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType())])
ARROW = pa.schema([("id", pa.int64())])


def _write(warehouse: str, **options: str) -> None:
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse, **options}), SCHEMA, overwrite=False)
    message = write_task(plan, iter([pa.RecordBatch.from_pylist([{"id": 1}, {"id": 2}], schema=ARROW)]))
    commit_write(plan, decode_messages([message]), None)


def test_snapshot_properties_land_in_that_commits_summary_only(warehouse: str) -> None:
    _write(warehouse, **{"snapshot_property.source-offset": "kafka:7:1200", "snapshot_property.job": "nightly"})
    _write(warehouse)
    first, second = load(warehouse, "db.t").metadata.snapshots
    assert first.summary["source-offset"] == "kafka:7:1200" and first.summary["job"] == "nightly"  # type: ignore[index]
    assert first.summary["added-records"] == "2"  # type: ignore[index]
    assert "source-offset" not in second.summary.additional_properties  # type: ignore[union-attr]


@pytest.mark.parametrize("key", ["added-records", "total-data-files", "lakesink.write-id", "spark.sql.streaming.epochId", ""])
def test_keys_the_commit_sets_itself_are_refused(warehouse: str, key: str) -> None:
    with pytest.raises(OptionError, match="snapshot_property"):
        parse_options({"table": "db.t", "warehouse": warehouse, f"snapshot_property.{key}": "x"})
