"""PartitionSplitter against a per-row reference built on pyiceberg's scalar transforms."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from pyiceberg.conversions import to_bytes
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
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
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros
from pyiceberg.utils.decimal import decimal_to_bytes

from lakesink_datasource.iceberg.partition_key import PartitionKey, decode_partition, partition_path
from lakesink_datasource.io.partitioning import PartitionSplitter

SCHEMA = Schema(
    NestedField(1, "row_id", LongType(), required=True),
    NestedField(2, "i", IntegerType()),
    NestedField(3, "l", LongType()),
    NestedField(4, "s", StringType()),
    NestedField(5, "d", DateType()),
    NestedField(6, "ts", TimestampType()),
    NestedField(7, "tstz", TimestamptzType()),
    NestedField(8, "dec", DecimalType(9, 2)),
    NestedField(9, "flag", BooleanType()),
    NestedField(10, "bin", BinaryType()),
    NestedField(11, "nested", StructType(NestedField(12, "x", IntegerType()), NestedField(13, "y", StringType()))),
)
ARROW_SCHEMA = schema_to_pyarrow(SCHEMA)

UTC = dt.timezone.utc
_datetimes = st.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(-(2**31), 2**31 - 1),
    "l": st.integers(-(2**63), 2**63 - 1),
    "s": st.text(max_size=12),
    "d": st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2200, 1, 1)),
    "ts": _datetimes,
    "tstz": _datetimes.map(lambda v: v.replace(tzinfo=UTC)),
    "dec": st.decimals(min_value=Decimal("-9999999.99"), max_value=Decimal("9999999.99"), places=2),
    "flag": st.booleans(),
    "bin": st.binary(max_size=8),
    "x": st.integers(-1000, 1000),
}


def _internal(value: Any) -> Any:
    """Python value -> Iceberg internal representation, as the scalar transforms expect."""
    if isinstance(value, dt.datetime):
        return datetime_to_micros(value)
    if isinstance(value, dt.date):
        return date_to_days(value)
    return value


def _to_bytes(kind: Any, value: Any) -> bytes:
    # truncate can push a decimal past its precision (see partitioning._to_bytes); pyiceberg's
    # to_bytes refuses that, Java writes the unscaled value, so the reference does too.
    if isinstance(kind, DecimalType):
        return decimal_to_bytes(value)
    # pyiceberg's scalar truncate on int/long does not wrap near the minimum
    # (truncate[10](-2147483641) = -2147483650); Java and pyiceberg-core wrap like machine ints.
    if isinstance(kind, IntegerType):
        value = (value + 2**31) % 2**32 - 2**31
    elif isinstance(kind, LongType):
        value = (value + 2**63) % 2**64 - 2**63
    return to_bytes(kind, value)


def _source_value(row: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = row
    for name in path:
        if value is None:
            return None
        value = value[name]
    return value


def _reference(spec: PartitionSpec, rows: list[dict[str, Any]]) -> dict[PartitionKey, list[int]]:
    """Row ids per partition, computed row by row with the scalar (non-Arrow) transforms."""
    groups: dict[PartitionKey, list[int]] = {}
    for row in rows:
        key = []
        for pf in spec.fields:
            source_type = SCHEMA.find_field(pf.source_id).field_type
            path = tuple(SCHEMA.find_column_name(pf.source_id).split("."))  # type: ignore[union-attr]
            value = pf.transform.transform(source_type)(_internal(_source_value(row, path)))
            key.append(None if value is None else _to_bytes(pf.transform.result_type(source_type), value))
        groups.setdefault(tuple(key), []).append(row["row_id"])
    return groups


def _check_split(spec: PartitionSpec, rows: list[dict[str, Any]]) -> list[tuple[PartitionKey, pa.Table]]:
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    result = PartitionSplitter(spec, SCHEMA).split(table)
    expected = _reference(spec, rows)
    got = {key: part.column("row_id").to_pylist() for key, part in result}
    assert len(got) == len(result), "a partition key appeared twice"
    # Same groups, same rows, input order kept inside each group (row ids are increasing).
    assert got == expected
    # Groups come out in order of first appearance, and every row lands exactly once, intact.
    assert [key for key, _ in result] == list(expected)
    by_id = {row["row_id"]: row for row in pa.Table.from_pylist(rows, schema=ARROW_SCHEMA).to_pylist()}
    seen = [r for _, part in result for r in part.to_pylist()]
    assert sorted(r["row_id"] for r in seen) == sorted(by_id)
    assert all(r == by_id[r["row_id"]] for r in seen)
    return result


@st.composite
def rows_for(draw: st.DrawFn, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows whose partition sources repeat (drawn from a small pool) and may be null."""
    pools = {c: draw(st.lists(VALUES[c], min_size=1, max_size=4)) for c in columns}
    n = draw(st.integers(1, 60))
    rows = []
    for row_id in range(n):
        row: dict[str, Any] = {"row_id": row_id}
        for c in columns:
            value = draw(st.none() | st.sampled_from(pools[c]))
            if c == "x":
                row["nested"] = None if draw(st.booleans()) and value is None else {"x": value, "y": "y"}
            else:
                row[c] = value
        rows.append(row)
    return rows


CASES: list[tuple[str, Transform[Any, Any]]] = [
    *[(c, IdentityTransform()) for c in ("i", "l", "s", "d", "ts", "tstz", "dec", "flag", "bin", "x")],
    *[(c, BucketTransform(n)) for c in ("i", "l", "s") for n in (1, 7, 16)],
    ("d", BucketTransform(5)),
    ("tstz", BucketTransform(5)),
    ("dec", BucketTransform(5)),
    ("i", TruncateTransform(10)),
    ("l", TruncateTransform(1000)),
    ("s", TruncateTransform(2)),
    ("dec", TruncateTransform(50)),
    ("bin", TruncateTransform(3)),  # no pyiceberg-core kernel for large_binary: fallback path
    *[(c, t) for c in ("d", "ts", "tstz") for t in (YearTransform(), MonthTransform(), DayTransform())],
    ("ts", HourTransform()),
    ("tstz", HourTransform()),
    ("i", VoidTransform()),
    ("s", VoidTransform()),
]
FIELD_IDS = {"i": 2, "l": 3, "s": 4, "d": 5, "ts": 6, "tstz": 7, "dec": 8, "flag": 9, "bin": 10, "x": 12}


@pytest.mark.parametrize(("column", "transform"), CASES, ids=[f"{t}({c})" for c, t in CASES])
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_single_field_matches_scalar_reference(column: str, transform: Transform[Any, Any], data: st.DataObject) -> None:
    spec = PartitionSpec(PartitionField(FIELD_IDS[column], 1000, transform, "p"), spec_id=1)
    _check_split(spec, data.draw(rows_for((column,))))


@settings(max_examples=examples(60), deadline=None)
@given(rows=rows_for(("i", "s", "tstz", "d", "x", "l")))
def test_multi_field_spec_matches_scalar_reference(rows: list[dict[str, Any]]) -> None:
    spec = PartitionSpec(
        PartitionField(2, 1000, BucketTransform(4), "i_bucket"),
        PartitionField(4, 1001, TruncateTransform(1), "s_trunc"),
        PartitionField(7, 1002, HourTransform(), "tstz_hour"),
        PartitionField(5, 1003, MonthTransform(), "d_month"),
        PartitionField(12, 1004, IdentityTransform(), "x"),
        PartitionField(3, 1005, VoidTransform(), "l_void"),
        spec_id=3,
    )
    _check_split(spec, rows)


def test_many_fields_with_many_distinct_values_do_not_overflow_group_ids() -> None:
    # Eight identity fields each with ~all-distinct values: the product of cardinalities
    # exceeds int64, so group ids must be re-densified along the way.
    schema = Schema(*[NestedField(i + 1, f"c{i}", LongType()) for i in range(8)])
    spec = PartitionSpec(*[PartitionField(i + 1, 1000 + i, IdentityTransform(), f"c{i}") for i in range(8)])
    n = 5000
    table = pa.table({f"c{i}": pa.array([(r * (i + 3)) % (n - i) for r in range(n)], pa.int64()) for i in range(8)})
    result = PartitionSplitter(spec, schema).split(table)
    assert len(result) == n
    assert sorted(part.column("c0")[0].as_py() for _, part in result) == sorted(table.column("c0").to_pylist())


def test_unpartitioned_returns_input_untouched() -> None:
    table = pa.Table.from_pylist([{"row_id": 1}, {"row_id": 2}], schema=ARROW_SCHEMA)
    splitter = PartitionSplitter(PartitionSpec(), SCHEMA)
    [(key, part)] = splitter.split(table)
    assert key == () and part is table
    [(key, part)] = splitter.split(table.to_batches()[0])
    assert key == () and part.equals(table)


def test_all_void_and_empty_and_record_batch_input() -> None:
    rows = [{"row_id": r, "i": r % 3} for r in range(10)]
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    void = PartitionSpec(PartitionField(2, 1000, VoidTransform(), "v"))
    assert PartitionSplitter(void, SCHEMA).split(table) == [((None,), table)]

    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "i"))
    assert PartitionSplitter(spec, SCHEMA).split(table.slice(0, 0)) == []
    result = PartitionSplitter(spec, SCHEMA).split(table.to_batches()[0])
    assert [(k, p.column("row_id").to_pylist()) for k, p in result] == [
        (_int(0), [0, 3, 6, 9]),
        (_int(1), [1, 4, 7]),
        (_int(2), [2, 5, 8]),
    ]


def test_chunked_input_is_grouped_across_chunks() -> None:
    rows = [{"row_id": r, "s": "ab"[r % 2]} for r in range(20)]
    table = pa.concat_tables([pa.Table.from_pylist(rows[:7], schema=ARROW_SCHEMA), pa.Table.from_pylist(rows[7:], schema=ARROW_SCHEMA)])
    spec = PartitionSpec(PartitionField(4, 1000, IdentityTransform(), "s"))
    result = PartitionSplitter(spec, SCHEMA).split(table)
    assert [(k, p.column("row_id").to_pylist()) for k, p in result] == [
        ((b"a",), list(range(0, 20, 2))),
        ((b"b",), list(range(1, 20, 2))),
    ]


def test_decode_partition_and_path() -> None:
    spec = PartitionSpec(
        PartitionField(7, 1000, DayTransform(), "tstz_day"),
        PartitionField(4, 1001, IdentityTransform(), "s"),
        PartitionField(2, 1002, BucketTransform(8), "i_bucket"),
        PartitionField(12, 1003, IdentityTransform(), "x"),
        spec_id=2,
    )
    rows = [{"row_id": 0, "tstz": dt.datetime(2024, 3, 5, 13, tzinfo=UTC), "s": "a b/c", "i": 42, "nested": None}]
    [(key, _)] = PartitionSplitter(spec, SCHEMA).split(pa.Table.from_pylist(rows, schema=ARROW_SCHEMA))
    bucket = BucketTransform(8).transform(IntegerType())(42)
    assert decode_partition(spec, SCHEMA, key) == Record(date_to_days(dt.date(2024, 3, 5)), "a b/c", bucket, None)
    assert partition_path(spec, SCHEMA, key) == f"tstz_day=2024-03-05/s=a+b%2Fc/i_bucket={bucket}/x=null"
    assert partition_path(PartitionSpec(), SCHEMA, ()) == ""
    with pytest.raises(ValueError):
        decode_partition(spec, SCHEMA, key[:2])


def _int(value: int | None) -> PartitionKey:
    return (None if value is None else to_bytes(IntegerType(), value),)
