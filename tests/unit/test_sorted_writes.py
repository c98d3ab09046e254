"""Data files sorted by the table's sort order (issue 45, part 2).

- `RowOrder` against a plain-Python model of Iceberg's ordering (hypothesis): every
  transform a sort field may have, ascending or descending, nulls first or last, ties in
  input order.
- Through the production path without Spark: appends and compaction output are sorted
  within each file and labelled with the order (Parquet `sorting_columns` for leading
  identity fields); keyed writes too, a chunk's rows of a partition as one sorted run;
  `sort_by` creates the order, and is refused when it differs from an existing table's.
"""

from __future__ import annotations

import datetime as dt
import os

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lakesink_testing import assert_readers_see, expected_rows, load, table_exists
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import LongType, NestedField, StringType, TimestampType
from pyspark.sql import types as T
from sort_model import model_sorted

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.io.row_order import RowOrder
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.schema.arrow_align import table_arrow_schema
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write import task_writers as task_module
from lakesink_datasource.write.task import TaskIdentity, write_task

ICEBERG = Schema(NestedField(1, "id", LongType()), NestedField(2, "s", StringType()), NestedField(3, "ts", TimestampType()))
ARROW = table_arrow_schema(ICEBERG)
SPARK = T.StructType([T.StructField("id", T.LongType()), T.StructField("s", T.StringType()), T.StructField("ts", T.TimestampNTZType())])
EPOCH = dt.datetime(1970, 1, 1)

# ----------------------------------------------------------------- the model


def _model_sorted(rows: list[dict], order: SortOrder) -> list[dict]:
    return model_sorted(rows, order, ICEBERG)


TRANSFORMS: dict[int, list[Transform]] = {
    1: [IdentityTransform(), BucketTransform(4), TruncateTransform(10), VoidTransform()],
    2: [IdentityTransform(), TruncateTransform(2), BucketTransform(3)],
    3: [IdentityTransform(), HourTransform(), DayTransform(), MonthTransform(), YearTransform()],
}

fields = st.builds(
    lambda source, pick, desc, nulls_first: SortField(
        source_id=source, transform=TRANSFORMS[source][pick % len(TRANSFORMS[source])],
        direction=SortDirection.DESC if desc else SortDirection.ASC,
        null_order=NullOrder.NULLS_FIRST if nulls_first else NullOrder.NULLS_LAST,
    ),
    st.sampled_from([1, 2, 3]), st.integers(0, 10), st.booleans(), st.booleans(),
)
rows_strategy = st.lists(st.fixed_dictionaries({
    "id": st.none() | st.integers(-50, 50),
    "s": st.none() | st.text(alphabet="abcé日", max_size=3),
    "ts": st.none() | st.datetimes(min_value=dt.datetime(1969, 6, 1), max_value=dt.datetime(1972, 6, 1)),
}), max_size=40)


@given(rows=rows_strategy, order_fields=st.lists(fields, min_size=1, max_size=3))
def test_row_order_sorts_as_icebergs_ordering(rows: list[dict], order_fields: list[SortField]) -> None:
    order = SortOrder(*order_fields, order_id=1)
    for i, row in enumerate(rows):
        row["_i"] = i  # to compare positions, not just values
    table = pa.Table.from_pylist([{k: r[k] for k in ("id", "s", "ts")} for r in rows], schema=ARROW)
    row_order = RowOrder.of(order, ICEBERG)
    assert row_order is not None
    got = row_order.indices(table).to_pylist()
    assert got == [r["_i"] for r in _model_sorted(rows, order)]


# ----------------------------------------------------------------- writes


def _write(warehouse: str, rows: list[dict], **options: str) -> None:
    plan = plan_write(parse_options({"table": "db.t", "warehouse": warehouse, "progress": "false", **options}), SPARK, False)
    plan = msgspec.structs.replace(plan, compaction=None)
    batch = pa.RecordBatch.from_pylist(rows, schema=ARROW)
    commit_write(plan, decode_messages([write_task(plan, iter([batch]), TaskIdentity(batch_id=None))]), None)


def _rows(ids: list[int]) -> list[dict]:
    return [{"id": i, "s": f"s{i % 7}", "ts": EPOCH + dt.timedelta(hours=(i * 37) % 200)} for i in ids]


def _file_rows(path: str) -> list[dict]:
    return pq.read_table(path.removeprefix("file://")).select(["id", "s", "ts"]).to_pylist()


SORT_BY = "days(ts), id DESC"


def _assert_files_sorted(warehouse: str, order: SortOrder, files: int) -> None:
    table = load(warehouse, "db.t")
    live = [e.data_file for e in live_data_files(table.io, table.metadata.current_snapshot())]
    assert len(live) == files
    for f in live:
        assert f.sort_order_id == 1
        rows = _file_rows(f.file_path)
        assert rows == _model_sorted(rows, order)


def test_appends_and_compaction_write_files_sorted_by_the_tables_order(warehouse: str) -> None:
    batches = [[(i * 7919) % 1000 for i in range(b * 300, b * 300 + 300)] for b in range(3)]
    for ids in batches:
        _write(warehouse, _rows(ids), sort_by=SORT_BY, maintenance="off", partition_by="bucket(2, id)")
    table = load(warehouse, "db.t")
    order = table.metadata.sort_order()
    assert order.order_id == 1 and len(order.fields) == 2
    _assert_files_sorted(warehouse, order, files=6)
    assert compact(table, budget_bytes=1 << 40, tiered=False).snapshot_id is not None
    _assert_files_sorted(warehouse, order, files=2)
    everything = [r for ids in batches for r in _rows(ids)]
    assert_readers_see(warehouse, "db.t", expected_rows(everything, ["id", "s", "ts"]), ["id", "s", "ts"])


def test_a_leading_identity_field_is_in_parquets_sorting_columns(warehouse: str) -> None:
    _write(warehouse, _rows([5, 3, 9, 1, 3]), sort_by="id DESC NULLS LAST, s")
    table = load(warehouse, "db.t")
    (entry,) = live_data_files(table.io, table.metadata.current_snapshot())
    meta = pq.ParquetFile(entry.data_file.file_path.removeprefix("file://")).metadata
    assert meta.num_row_groups == 1
    columns = meta.row_group(0).sorting_columns
    assert [(c.column_index, c.descending, c.nulls_first) for c in columns] == [(0, True, False), (1, False, True)]
    assert [r["id"] for r in _file_rows(entry.data_file.file_path)] == [9, 5, 3, 3, 1]


def test_keyed_writes_into_a_sorted_table_write_sorted_files(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until 2026-11-27 keyed writes left their files unsorted (labelled 0). Chunks of 4 rows:
    a chunk's rows of a partition are one sorted run, which goes on the file when it sorts
    after the file's last row and starts a file otherwise; keys replaced within the batch
    are hidden at their sorted positions."""
    monkeypatch.setattr(task_module, "CHUNK_ROWS", 4)
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx", "sort_by": SORT_BY, "maintenance": "off"}
    first = [5, 3, 9, 12, 40, 7, 3, 1, 5, 22]  # 3 and 5 twice: the first copies hidden in the batch's own files
    _write(warehouse, _rows(first), **keyed)
    _write(warehouse, _rows([3, 1, 30, 2]), **keyed)
    table = load(warehouse, "db.t")
    order = table.metadata.sort_order()
    live = [e.data_file for e in live_data_files(table.io, table.metadata.current_snapshot())]
    for f in live:
        assert f.sort_order_id == 1
        rows = _file_rows(f.file_path)
        assert rows == _model_sorted(rows, order), f.file_path
    assert_readers_see(warehouse, "db.t", expected_rows(_rows([5, 9, 12, 40, 7, 22, 3, 1, 30, 2]), ["id", "s", "ts"]), ["id", "s", "ts"])


def test_a_keyed_stream_whose_sort_key_grows_fills_one_file(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that continue the file's order go on it: ids arriving in order, sorted by id,
    make one file of many chunks, as an unsorted table would."""
    monkeypatch.setattr(task_module, "CHUNK_ROWS", 3)
    _write(warehouse, _rows(list(range(20))), operation="upsert", primary_key="id", index_dir=f"{warehouse}/idx", sort_by="id")
    table = load(warehouse, "db.t")
    (entry,) = live_data_files(table.io, table.metadata.current_snapshot())
    assert entry.data_file.sort_order_id == 1
    assert [r["id"] for r in _file_rows(entry.data_file.file_path)] == list(range(20))


def test_sort_by_is_checked_before_anything_is_written(warehouse: str) -> None:
    with pytest.raises(OptionError, match="option 'sort_by': column 'nope' is not in the schema"):
        _write(warehouse, _rows([1]), sort_by="nope")
    assert not table_exists(warehouse, "db.t")
    with pytest.raises(OptionError, match="option 'sort_by'"):
        _write(warehouse, _rows([1]), sort_by="days(id)")
    _write(warehouse, _rows([1]), sort_by="id")
    before = load(warehouse, "db.t").metadata_location
    with pytest.raises(OptionError, match=r"differs from the sort order of table db\.t \(id ASC NULLS FIRST\)"):
        _write(warehouse, _rows([2]), sort_by="id DESC")
    table = load(warehouse, "db.t")
    assert table.metadata_location == before
    assert [r["id"] for r in table.scan().to_arrow().to_pylist()] == [1]
    written = {os.path.join(d, f) for d, _, fs in os.walk(os.path.join(warehouse, "db", "t", "data")) for f in fs}
    assert written == {e.data_file.file_path.removeprefix("file://") for e in live_data_files(table.io, table.current_snapshot())}
