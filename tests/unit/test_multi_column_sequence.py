"""`sequence_column` with several columns, compared in order (a source position of several
parts: MySQL's binlog file number, position and row), on a plain keyed cdc write.

Against a plain-Python model: a change older than what its key last saw (a live row's or a
delete's whole sequence, compared as a tuple) is ignored, so a change written after a binlog
rotation (a new file, the position low again) wins over one before it. The index is dropped
between batches at random: the rebuilt index must take the sequences of live rows from the
table and those of deletes from the stored tombstones.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from keyed_model import Config, Harness
from lakesink_testing import duckdb_rows, expected_rows, pyiceberg_rows
from pyspark.sql import types as T

from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

SCHEMA = T.StructType([
    T.StructField("id", T.LongType()), T.StructField("v", T.StringType()), T.StructField("op", T.StringType()),
    T.StructField("file", T.LongType()), T.StructField("pos", T.LongType()), T.StructField("row", T.IntegerType()),
])
ARROW = pa.schema([("id", pa.int64()), ("v", pa.string()), ("op", pa.string()), ("file", pa.int64()), ("pos", pa.int64()), ("row", pa.int32())])
COLUMNS = ["id", "v", "file", "pos", "row"]


class _Harness(Harness):
    """The keyed harness with a three-column sequence."""

    def __init__(self) -> None:
        super().__init__(Config("cdc"))
        raw = {
            "table": "db.k", "warehouse": self.warehouse, "operation": "cdc", "primary_key": "id", "op_column": "op",
            "sequence_column": "file, pos, row", "index_dir": self.index_dir, "maintenance": "off",
        }
        self.options = parse_options(raw)
        self.schema = SCHEMA

    def run(self, tasks: list[list[dict]], batch_id: int) -> None:
        plan = plan_write(self.options, self.schema, overwrite=False)
        messages = [
            write_task(plan, iter([pa.RecordBatch.from_pylist(rows, schema=ARROW)]), TaskIdentity(partition_id=i, attempt=i, batch_id=batch_id, query_id="q"))
            for i, rows in enumerate(tasks)
        ]
        self.commit(plan, messages, batch_id)


def _model(batches: list[list[list[dict]]]) -> Counter:
    live: dict[int, tuple[tuple[int, int, int], dict | None]] = {}
    for tasks in batches:
        for rows in tasks:
            # Within a task: the highest sequence per key wins (ties: the later row).
            winners: dict[int, dict] = {}
            for r in rows:
                held = winners.get(r["id"])
                if held is None or (r["file"], r["pos"], r["row"]) >= (held["file"], held["pos"], held["row"]):
                    winners[r["id"]] = r
            for key, r in winners.items():
                seq = (r["file"], r["pos"], r["row"])
                held = live.get(key)
                if held is not None and held[0] > seq:
                    continue  # older than what the key last saw: ignored
                live[key] = (seq, None if r["op"] == "d" else r)
    return expected_rows([r for _, r in live.values() if r is not None], COLUMNS)


_change = st.tuples(
    st.integers(0, 5),  # key
    st.sampled_from(["c", "u", "u", "d"]),
    st.integers(1, 3),  # binlog file number
    st.sampled_from([4, 120, 900]),  # a position: low again in each new file
    st.integers(0, 2),  # row of the statement
)


@settings(max_examples=examples(40))
@given(
    batches=st.lists(st.lists(st.lists(_change, min_size=1, max_size=8), min_size=1, max_size=2), min_size=1, max_size=4),
    drops=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_several_sequence_columns_order_changes_as_a_tuple_across_batches_and_rebuilds(batches: list, drops: list[bool]) -> None:
    labelled: list[list[list[dict]]] = []
    n = 0
    for tasks in batches:
        labelled.append([])
        for task in tasks:
            rows = []
            for key, op, file, pos, row in task:
                n += 1
                rows.append({"id": key, "v": f"r{n}", "op": op, "file": file, "pos": pos, "row": row})
            labelled[-1].append(rows)
    with _Harness() as harness:
        for batch_id, tasks in enumerate(labelled):
            if drops[batch_id]:
                harness.drop_index()  # a rebuild: sequences from the table and the stored tombstones
            harness.run(tasks, batch_id)
            expected = _model(labelled[: batch_id + 1])
            table = harness.table()
            if table.metadata.current_snapshot() is None:
                assert expected == Counter()
                continue
            assert pyiceberg_rows(table, COLUMNS) == expected
            assert duckdb_rows(table.metadata_location, COLUMNS) == expected


def test_a_change_after_a_binlog_rotation_wins_over_a_higher_position_in_an_earlier_file() -> None:
    with _Harness() as harness:
        harness.run([[{"id": 1, "v": "before rotation", "op": "c", "file": 3, "pos": 9000, "row": 0}]], 0)
        harness.run([[{"id": 1, "v": "after rotation", "op": "u", "file": 4, "pos": 4, "row": 0}]], 1)
        # A late change from the older file never overwrites the newer one.
        harness.run([[{"id": 1, "v": "late", "op": "u", "file": 3, "pos": 9500, "row": 0}]], 2)
        assert pyiceberg_rows(harness.table(), ["id", "v"]) == Counter({(1, "after rotation"): 1})


def test_a_sequence_column_named_twice_is_refused() -> None:
    with pytest.raises(OptionError, match=r"'sequence_column' names .* more than once"):
        parse_options({"table": "db.t", "operation": "cdc", "sequence_column": "pos, POS", "primary_key": "id", "op_column": "op"})
