"""Data files sorted by the table's sort order (issue 45, part 2).

- `RowOrder` against a plain-Python model of Iceberg's ordering (hypothesis): every
  transform a sort field may have, ascending or descending, nulls first or last, ties in
  input order.
- Through the production path without Spark: appends and compaction output are sorted
  within each file and labelled with the order (Parquet `sorting_columns` for leading
  identity fields); keyed writes, whose rows cannot be reordered, are labelled unsorted;
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

from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.io.row_order import RowOrder
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.messages import decode_messages
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.schema.arrow_align import table_arrow_schema
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

ICEBERG = Schema(NestedField(1, "id", LongType()), NestedField(2, "s", StringType()), NestedField(3, "ts", TimestampType()))
ARROW = table_arrow_schema(ICEBERG)
SPARK = T.StructType([T.StructField("id", T.LongType()), T.StructField("s", T.StringType()), T.StructField("ts", T.TimestampNTZType())])
EPOCH = dt.datetime(1970, 1, 1)

# ----------------------------------------------------------------- the model


def _internal(field_id: int, value: object) -> object:
    """A source value as pyiceberg's scalar transforms take it (timestamps as micros)."""
    if value is None:
        return None
    if field_id == 3:
        assert isinstance(value, dt.datetime)
        return (value - EPOCH) // dt.timedelta(microseconds=1)
    return value


def _model_sorted(rows: list[dict], order: SortOrder) -> list[dict]:
    """Iceberg's order by a plain sort per field, last field first (Python's sort is stable)."""
    names = {1: "id", 2: "s", 3: "ts"}
    types = {1: LongType(), 2: StringType(), 3: TimestampType()}
    out = list(rows)
    for field in reversed(order.fields):
        if isinstance(field.transform, VoidTransform):
            continue
        fn = field.transform.transform(types[field.source_id])

        def key(row: dict, field: SortField = field, fn: object = fn) -> object:
            value = _internal(field.source_id, row[names[field.source_id]])
            return None if value is None else fn(value)  # type: ignore[operator]

        present = [r for r in out if key(r) is not None]
        missing = [r for r in out if key(r) is None]
        descending = field.direction == SortDirection.DESC
        # Strings compare by their UTF-8 bytes, as Iceberg's comparator does.
        present.sort(key=lambda r: (lambda k: k.encode() if isinstance(k, str) else k)(key(r)), reverse=descending)
        if descending:  # a reversed stable sort reverses ties: restore their input order
            present = _stable_reverse(present, key)
        out = missing + present if field.null_order == NullOrder.NULLS_FIRST else present + missing
    return out


def _stable_reverse(rows: list[dict], key: object) -> list[dict]:
    groups: list[list[dict]] = []
    for row in rows:
        if groups and key(groups[-1][0]) == key(row):  # type: ignore[operator]
            groups[-1].append(row)
        else:
            groups.append([row])
    # sort(reverse=True) keeps ties in input order already (Python guarantees stability).
    return [r for g in groups for r in g]


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


def test_keyed_writes_into_a_sorted_table_are_labelled_unsorted(warehouse: str) -> None:
    keyed = {"operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx", "sort_by": "id"}
    _write(warehouse, _rows([5, 3, 9]), **keyed)
    _write(warehouse, _rows([3, 1]), **keyed)
    table = load(warehouse, "db.t")
    assert {e.data_file.sort_order_id for e in live_data_files(table.io, table.metadata.current_snapshot())} == {0}
    assert_readers_see(warehouse, "db.t", expected_rows(_rows([5, 9, 3, 1]), ["id", "s"]), ["id", "s"])


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
    assert load(warehouse, "db.t").metadata_location == before
    assert os.path.exists(warehouse)
