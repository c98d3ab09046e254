"""Keyed writes in a process of their own under an address-space limit (`ulimit -v`), the way
Spark's Python workers run under spark.executor.pyspark.memory (RLIMIT_AS set before the
worker imports anything).

usage: address_space_child.py ROOT LIMIT OPERATION BATCHES KEYS [min_map=BYTES]

LIMIT is in MiB: `1024` sets the limit before any import, as Spark does; `+N` sets it N MiB
above what the process maps once lakesink is imported (a limit the key index cannot live
in); `none` sets none. Writes BATCHES batches of KEYS rows each (ids `batch * 7919 + i` modulo 2 * KEYS, so
keys come back; cdc deletes every fifth) into table db.k under ROOT through the driver and
task code Spark would run, without Spark, and prints one JSON line: the batches committed,
the error that stopped it (its type and message) and the map size of each environment.
`min_map` lowers the smallest map so a small index outgrows its maps several times; `first`
numbers the batches from there (a later run going on with the same table).
"""

from __future__ import annotations

import json
import os
import resource
import sys


def _limit(spec: str) -> None:
    from lakesink_datasource.index.address_space import in_use

    size = (in_use() + int(spec[1:]) * 2**20) if spec.startswith("+") else int(spec) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (size, size))


def rows(operation: str, batch: int, keys: int) -> list[dict]:
    out = []
    for i in range(keys):
        row: dict = {"id": (batch * 7919 + i) % (2 * keys), "v": f"b{batch}r{i}"}
        if operation == "cdc":
            row["op"] = "d" if i % 5 == 4 else "u"
            row["seq"] = batch * keys + i
        out.append(row)
    return out


def main(root: str, limit: str, operation: str, batches: str, keys: str, *extra: str) -> None:
    if limit != "none" and not limit.startswith("+"):
        _limit(limit)  # before anything is imported, as Spark's worker does
    import pyarrow as pa
    from pyspark.sql import types as T

    from lakesink_datasource.commit.committer import commit_write
    from lakesink_datasource.index import address_space, environment
    from lakesink_datasource.messages import decode_messages
    from lakesink_datasource.options import parse_options
    from lakesink_datasource.table.setup import plan_write
    from lakesink_datasource.write.task import TaskIdentity, write_task

    settings = dict(item.split("=", 1) for item in extra)
    if "min_map" in settings:
        address_space.MIN_MAP = int(settings["min_map"])
    if limit.startswith("+"):
        # A Spark worker has built an Arrow array before a task's rows reach lakesink (pyarrow
        # imports pandas then): what is left above it is the index's.
        pa.array([0])
        _limit(limit)
    options = {"table": "db.k", "warehouse": f"{root}/warehouse", "index_dir": f"{root}/index", "operation": operation,
               "primary_key": "id", "maintenance": "off"}
    fields = [T.StructField("id", T.LongType()), T.StructField("v", T.StringType())]
    arrow = [("id", pa.int64()), ("v", pa.string())]
    if operation == "cdc":
        options |= {"op_column": "op", "sequence_column": "seq"}
        fields += [T.StructField("op", T.StringType()), T.StructField("seq", T.LongType())]
        arrow += [("op", pa.string()), ("seq", pa.int64())]
    parsed, schema = parse_options(options), T.StructType(fields)
    committed, error = 0, None
    try:
        first = int(settings.get("first", 0))
        for batch in range(first, first + int(batches)):
            plan = plan_write(parsed, schema, overwrite=False)
            data = pa.RecordBatch.from_pylist(rows(operation, batch, int(keys)), schema=pa.schema(arrow))
            who = TaskIdentity(partition_id=0, attempt=batch, batch_id=batch, query_id="capped")
            message = write_task(plan, iter([data]), who=who)
            commit_write(plan, decode_messages([message]), batch)
            committed += 1
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        error = {"type": type(exc).__name__, "message": str(exc), "lakesink": type(exc).__module__.startswith("lakesink")}
    maps = {os.path.relpath(path, root): env._env.info()["map_size"] for path, env in environment._CACHE.items() if not env.closed}
    print(json.dumps({"committed": committed, "error": error, "maps": maps, "limit": address_space.cap()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
