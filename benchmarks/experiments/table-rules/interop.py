"""Issue 45's interop check: a keyed table sorted by id, with the object-store layout and Bloom filters,
written by upsert batches with maintenance on, then Iceberg Java's maintenance, then more
batches; every reader of ../shared/tools/readers reads the same rows.

usage: python benchmarks/experiments/table-rules/interop.py WAREHOUSE
(then: python ../shared/tools/readers/java_maintenance.py WAREHOUSE db.t all and
read_table.py on the printed metadata file, as FINDINGS.md shows)
Phases: `write N` writes N upsert batches; `check` prints the metadata file and the model's
row count and checksum.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
from pyspark.sql import types as T

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.maintenance.after_batch import land_compaction, maintain_after_commit
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string())])


def main(warehouse: str, phase: str, count: int = 6) -> None:
    model_file = Path(warehouse) / "model.json"
    model = json.loads(model_file.read_text()) if model_file.exists() else {"next": 0, "rows": {}}
    options = {
        "table": "db.t", "warehouse": warehouse, "progress": "false", "partition_by": "bucket(4, id)",
        "operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx",
        "property.write.object-storage.enabled": "true",
        "property.write.parquet.bloom-filter-enabled.column.id": "true",
        "property.lakesink.maintenance.compaction-fan-in": "2",
        "sort_by": "id",
    }
    if phase == "write":
        for _ in range(count):
            b = model["next"]
            ids = [(b * 37 + i * 7) % 500 for i in range(120)]
            ids = list(dict.fromkeys(ids))
            plan = plan_write(parse_options(options), SCHEMA, False)
            rows = pa.RecordBatch.from_pylist([{"id": i, "v": f"b{b}-{i}"} for i in ids], schema=ARROW)
            message = write_task(plan, iter([rows]), TaskIdentity(batch_id=b, query_id="interop"))
            land_compaction(plan, decode_messages([message]), b)
            outcome = commit_write(plan, decode_messages([message]), b)
            maintain_after_commit(plan, outcome.stats.bytes_written, b, batch_files=outcome.data_files)
            model["rows"].update({str(i): f"b{b}-{i}" for i in ids})
            model["next"] = b + 1
        model_file.write_text(json.dumps(model))
    from lakesink_datasource.locate import metadata_location

    location = metadata_location("db.t", warehouse=warehouse)
    print(location)
    print(f"model: {len(model['rows'])} rows")
    print(_sortedness(location))


def _sortedness(location: str) -> str:
    """How many live data files carry each sort order id, and whether those labelled 1 are
    sorted by id (the table's order), hidden rows included."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import PyArrowFileIO
    from pyiceberg.serializers import FromInputFile

    from lakesink_datasource.iceberg.live_files import live_data_files

    io = PyArrowFileIO()
    metadata = FromInputFile.table_metadata(io.new_input(location))
    labels: dict[int, int] = {}
    unsorted = []
    for entry in live_data_files(io, metadata.current_snapshot()):
        f = entry.data_file
        labels[f.sort_order_id or 0] = labels.get(f.sort_order_id or 0, 0) + 1
        ids = pq.read_table(f.file_path.removeprefix("file://"), columns=["id"]).column("id").to_pylist()
        if f.sort_order_id == 1 and ids != sorted(ids):
            unsorted.append(f.file_path)
    return f"live data files by sort order id: {dict(sorted(labels.items()))}; labelled 1 but not sorted: {unsorted or 'none'}"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
