"""One plan a micro-batch: Spark's streaming commit runner calls `streamWriter()` again before
`commit()`, in a process of its own; lakesink's writer there makes no plan (a catalog and
metadata read a batch) and commits with the plan the batch's first task carried. Driven
through PySpark's own runner (`python_streaming_sink_runner._main`, PySpark 4.2+: before, only
Spark's JVM can drive it; the streaming tests run the whole path on every minor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lakesink_testing import load, pyiceberg_rows
from pyspark.sql.worker import python_streaming_sink_runner

needs_runner_main = pytest.mark.skipif(
    not hasattr(python_streaming_sink_runner, "_main"), reason="PySpark 4.0/4.1's commit runner is driven by Spark only"
)

CODE = """
import io, json, logging, struct, sys
import pyarrow as pa
from pyspark.serializers import CPickleSerializer, write_int, write_long, write_with_length
from pyspark.sql.types import LongType, StringType, StructField, StructType
from pyspark.sql.worker import python_streaming_sink_runner
from lakesink_datasource.datasource import LakeSinkDataSource

plans = []
class Plans(logging.Handler):
    def emit(self, record):
        event = getattr(record, "lakesink_event", None)
        if event is not None and event["event"] == "driver_plan":
            plans.append(event)
logging.getLogger("lakesink").addHandler(Plans())
logging.getLogger("lakesink").setLevel(logging.INFO)

schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
source = LakeSinkDataSource({"table": "db.t", "warehouse": sys.argv[1], "maintenance": "off", "progress": "false"})
ser = CPickleSerializer()

def commit_through_spark_s_runner(messages, batch_id):
    stream = io.BytesIO()
    ser._write_with_length(source, stream)
    write_with_length(schema.json().encode("utf-8"), stream)
    stream.write(struct.pack("!?", False))  # overwrite
    write_int(len(messages), stream)
    for m in messages:
        ser._write_with_length(m, stream)
    write_long(batch_id, stream)
    stream.write(struct.pack("!?", False))  # abort
    stream.seek(0)
    out = io.BytesIO()
    python_streaming_sink_runner._main(stream, out)

seen = {}
for batch_id, rows in enumerate([[1, 2], [3]]):
    planner = source.streamWriter(schema, False)  # the planner's call
    seen[f"planned {batch_id}"] = len(plans)
    message = planner.write(iter([pa.RecordBatch.from_arrays([pa.array(rows, pa.int64()), pa.array([str(r) for r in rows])], ["id", "v"])]))
    commit_through_spark_s_runner([message], batch_id)
    seen[f"committed {batch_id}"] = len(plans)
    seen[f"write id {batch_id}"] = planner.plan.write_id
commit_through_spark_s_runner([], 2)  # no task ran: nothing carries a plan, the commit plans
seen["empty batch"] = len(plans)
print(json.dumps(seen))
"""


@needs_runner_main
def test_the_commit_runner_commits_with_the_plan_the_first_task_carried(tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    run = subprocess.run([sys.executable, "-c", CODE, warehouse], capture_output=True, text=True, timeout=300, cwd="/", env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    # One plan per batch (the planner's); the runner's streamWriter() and commit() add none.
    assert [seen["planned 0"], seen["committed 0"], seen["planned 1"], seen["committed 1"]] == [1, 1, 2, 2]
    assert seen["empty batch"] == 3
    table = load(warehouse, "db.t")
    assert pyiceberg_rows(table, ["id", "v"]) == {(1, "1"): 1, (2, "2"): 1, (3, "3"): 1}
    # Each batch's snapshot names the write its planner planned.
    written = [s.summary.additional_properties.get("lakesink.write-id") for s in table.snapshots()]
    assert [seen["write id 0"], seen["write id 1"]] == [w for w in written if w in (seen["write id 0"], seen["write id 1"])]
