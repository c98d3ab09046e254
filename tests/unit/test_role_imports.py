"""What each process of a streaming append to the embedded catalog imports: Spark runs the
planner, the tasks and the commit in processes of their own, each paying its imports on a
fresh start (a scheduled job, a trigger a minute or more apart: docs/performance.md). An
append uses no pandas (pyarrow.dataset imports it), no SQLAlchemy (the embedded catalog's
reads and swap go through sqlite3) and no requests (the REST catalog's client). A task does
import pandas: pyarrow imports it at the first Arrow array a process builds from Python
objects (PySpark's worker builds one for every write task), so only the others are checked
there.

Each role runs in a fresh interpreter, as Spark's worker runs it: the planner calls
`streamWriter` and pickles the writer; a task unpickles it and writes its rows; the commit
plans again (as Spark's commit runner does) and commits the task's message. The table then
holds the rows, read back by pyiceberg."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lakesink_testing import load, pyiceberg_rows

AVOIDED = ("pandas", "sqlalchemy", "requests")

_COMMON = """
import json, pickle, sys
import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType
from lakesink_datasource.datasource import LakeSinkDataSource

SCHEMA = StructType([StructField("id", LongType()), StructField("v", StringType())])
OPTIONS = {{"table": "db.events", "warehouse": {warehouse!r}, "maintenance": "off"}}
"""

_ROLES = {
    "create": """
writer = LakeSinkDataSource(OPTIONS).streamWriter(SCHEMA, False)
message = writer.write(iter([pa.RecordBatch.from_arrays([pa.array([0], pa.int64()), pa.array(["first"])], ["id", "v"])]))
writer.commit([message], 0)
""",
    "planner": """
with open(sys.argv[1], "wb") as f:
    pickle.dump(LakeSinkDataSource(OPTIONS).streamWriter(SCHEMA, False), f)
""",
    "task": """
with open(sys.argv[1], "rb") as f:
    writer = pickle.load(f)
# Spark hands Arrow batches (pyarrow's record_batch of a dict would look for pandas itself).
message = writer.write(iter([pa.RecordBatch.from_arrays([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], ["id", "v"])]))
with open(sys.argv[2], "wb") as f:
    pickle.dump(message, f)
""",
    "commit": """
with open(sys.argv[2], "rb") as f:
    message = pickle.load(f)
LakeSinkDataSource(OPTIONS).streamWriter(SCHEMA, False).commit([message], 1)
""",
}


def _modules(code: str, *args: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", code + "\nprint(json.dumps(sorted(sys.modules)))\n", *args],
                         capture_output=True, text=True, timeout=300, cwd="/", env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _run(role: str, warehouse: str, *args: str) -> list[str]:
    modules = _modules(_COMMON.format(warehouse=warehouse) + _ROLES[role], *args)
    avoided = [m for m in AVOIDED if role != "task" or m != "pandas"]
    return sorted({m.split(".")[0] for m in modules} & set(avoided))


def test_each_role_of_a_streaming_append_imports_no_pandas_sqlalchemy_or_requests(tmp_path: Path) -> None:
    warehouse = str(tmp_path / "wh")
    _run("create", warehouse)  # the table's creation may use pyiceberg's SQL catalog
    writer, message = str(tmp_path / "writer.pickle"), str(tmp_path / "message.pickle")
    imported = {role: _run(role, warehouse, writer, message) for role in ("planner", "task", "commit")}
    assert imported == {"planner": [], "task": [], "commit": []}
    assert pyiceberg_rows(load(warehouse, "db.events"), ["id", "v"]) == {(0, "first"): 1, (1, "a"): 1, (2, "b"): 1}


def test_pyarrow_itself_imports_pandas_at_a_process_s_first_array() -> None:
    """Why a task is not held to it: pyarrow looks for pandas at the first array it builds."""
    assert "pandas" in _modules("import json, sys\nimport pyarrow as pa\npa.array([1])")
