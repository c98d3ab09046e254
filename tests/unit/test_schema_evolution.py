"""Schema evolution with `merge_schema`, driven through the production path without Spark
(plan_write -> write_task -> the driver's commit), read back by DuckDB and pyiceberg.

Expected rows are written out by hand: old rows read the added columns as null and promoted
columns as the wider type."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyspark.sql import types as T

from lakesink_datasource.check import check_table
from lakesink_datasource.datasource import _commit
from lakesink_datasource.options import parse_options
from lakesink_datasource.schema.spark_types import SchemaError
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task

IDENT = "db.t"


def _field(name: str, dt: T.DataType, nullable: bool = True) -> T.StructField:
    return T.StructField(name, dt, nullable)


V1 = T.StructType([_field("id", T.LongType(), False), _field("n", T.IntegerType()), _field("f", T.FloatType()),
                   _field("d", T.DecimalType(5, 2)), _field("s", T.StructType([_field("x", T.IntegerType())]))])
A1 = pa.schema([pa.field("id", pa.int64(), False), ("n", pa.int32()), ("f", pa.float32()), ("d", pa.decimal128(5, 2)),
                ("s", pa.struct([("x", pa.int32())]))])
# Every kind of change at once: n int -> long, f float -> double, d decimal(5,2) -> (9,2), a new
# field s.y inside the struct, a new top-level column tag, and a list of structs.
V2 = T.StructType([_field("id", T.LongType(), False), _field("n", T.LongType()), _field("f", T.DoubleType()),
                   _field("d", T.DecimalType(9, 2)), _field("s", T.StructType([_field("x", T.IntegerType()), _field("y", T.StringType())])),
                   _field("tag", T.StringType()), _field("items", T.ArrayType(T.StructType([_field("k", T.StringType())])))])
A2 = pa.schema([pa.field("id", pa.int64(), False), ("n", pa.int64()), ("f", pa.float64()), ("d", pa.decimal128(9, 2)),
                ("s", pa.struct([("x", pa.int32()), ("y", pa.string())])), ("tag", pa.string()),
                ("items", pa.list_(pa.struct([("k", pa.string())])))])


def _plan(warehouse: str, schema: T.StructType, **options: str) -> WritePlan:
    return plan_write(parse_options({"table": IDENT, "warehouse": warehouse, "progress": "false", **options}), schema, overwrite=False)


def _land(plan: WritePlan, arrow: pa.Schema, records: list[dict]) -> None:
    _commit(plan, [write_task(plan, iter([pa.RecordBatch.from_pylist(records, schema=arrow)]))], None)


def _write(warehouse: str, schema: T.StructType, arrow: pa.Schema, records: list[dict], **options: str) -> None:
    _land(_plan(warehouse, schema, **options), arrow, records)


OLD = [{"id": 1, "n": 7, "f": 1.5, "d": Decimal("1.25"), "s": {"x": 1}}]
NEW = [{"id": 2, "n": 2**40, "f": 0.1, "d": Decimal("1234567.89"), "s": {"x": 2, "y": "why"}, "tag": "t", "items": [{"k": "a"}]}]
COLUMNS = ["id", "n", "f", "d", "tag"]


def test_merge_schema_adds_columns_and_promotes_types_in_the_commit_of_its_data(warehouse: str) -> None:
    _write(warehouse, V1, A1, OLD)
    before = load(warehouse, IDENT)
    plan = _plan(warehouse, V2, merge_schema="true")
    # Staged, not current: readers see the old schema until the data commits.
    staged = load(warehouse, IDENT)
    assert staged.schema() == before.schema() and staged.metadata.current_snapshot() == before.metadata.current_snapshot()
    _land(plan, A2, NEW)

    table = load(warehouse, IDENT)
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    assert types["n"] == "long" and types["f"] == "double" and types["d"] == "decimal(9, 2)" and types["tag"] == "string"
    assert [f.name for f in table.schema().find_field("s").field_type.fields] == ["x", "y"]  # type: ignore[attr-defined]
    ids = [f.field_id for f in table.schema().fields]
    assert len(set(ids)) == len(ids) and min(set(ids) - {f.field_id for f in before.schema().fields}) > before.metadata.last_column_id
    assert table.metadata.current_snapshot().schema_id == table.schema().schema_id  # type: ignore[union-attr]
    expected = [{"id": 1, "n": 7, "f": 1.5, "d": Decimal("1.25"), "tag": None},
                {"id": 2, "n": 2**40, "f": 0.1, "d": Decimal("1234567.89"), "tag": "t"}]
    assert_readers_see(warehouse, IDENT, expected_rows(expected, COLUMNS), COLUMNS)
    nested = {r["id"]: (r["s"], r["items"]) for r in table.scan().to_arrow().to_pylist()}
    assert nested == {1: ({"x": 1, "y": None}, None), 2: ({"x": 2, "y": "why"}, [{"k": "a"}])}
    assert check_table(table) == []


def test_without_merge_schema_every_difference_is_named_with_the_way_out(warehouse: str) -> None:
    _write(warehouse, V1, A1, OLD)
    before = load(warehouse, IDENT)
    with pytest.raises(SchemaError) as caught:
        _plan(warehouse, V2)
    message = str(caught.value)
    for change in ("promoted n int -> long", "promoted f float -> double", "promoted d decimal(5, 2) -> decimal(9, 2)",
                   "added s.y (string)", "added tag (string)", "option merge_schema=true evolves the table"):
        assert change in message
    after = load(warehouse, IDENT)
    assert after.metadata.schemas == before.metadata.schemas and after.metadata.current_snapshot() == before.metadata.current_snapshot()


@pytest.mark.parametrize(
    ("column", "dt", "arrow", "value", "message"),
    [
        ("n", T.StringType(), pa.string(), "x", "column 'n': table type int cannot become string"),
        ("d", T.DecimalType(9, 3), pa.decimal128(9, 3), Decimal("1.000"), r"column 'd': table type decimal\(5, 2\) cannot become decimal\(9, 3\)"),
        ("s", T.StringType(), pa.string(), "x", "column 's': table type struct<.*> cannot become string"),
        ("id", T.StringType(), pa.string(), "x", "column 'id': table type long cannot become string"),
    ],
)
def test_a_change_iceberg_forbids_is_refused_naming_the_column_and_both_types(
    warehouse: str, column: str, dt: T.DataType, arrow: pa.DataType, value: object, message: str
) -> None:
    _write(warehouse, V1, A1, OLD)
    before = load(warehouse, IDENT)
    fields = [_field(column, dt) if f.name == column else f for f in V1.fields]
    with pytest.raises(SchemaError, match=message):
        _plan(warehouse, T.StructType(fields), merge_schema="true")
    after = load(warehouse, IDENT)
    assert after.metadata.schemas == before.metadata.schemas and after.metadata.last_column_id == before.metadata.last_column_id


def test_a_primary_key_column_cannot_be_promoted(warehouse: str) -> None:
    schema = T.StructType([_field("k", T.IntegerType(), False), _field("v", T.StringType())])
    _write(warehouse, schema, pa.schema([pa.field("k", pa.int32(), False), ("v", pa.string())]), [{"k": 1, "v": "a"}],
           operation="upsert", primary_key="k")
    wider = T.StructType([_field("k", T.LongType(), False), _field("v", T.StringType())])
    with pytest.raises(SchemaError, match=r"column 'k': table type int cannot become long \(primary-key columns cannot change type\)"):
        _plan(warehouse, wider, operation="upsert", merge_schema="true")


def test_two_writers_evolving_at_once_both_land_with_distinct_field_ids(warehouse: str) -> None:
    base = T.StructType([_field("id", T.LongType(), False), _field("v", T.StringType())])
    _write(warehouse, base, pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())]), [{"id": 1, "v": "x"}])
    with_a = T.StructType([*base.fields, _field("a", T.IntegerType())])
    with_b = T.StructType([*base.fields, _field("b", T.StringType())])
    plan_a = _plan(warehouse, with_a, merge_schema="true")
    plan_b = _plan(warehouse, with_b, merge_schema="true")  # planned before a's commit
    _land(plan_a, pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string()), ("a", pa.int32())]), [{"id": 2, "v": "y", "a": 5}])
    _land(plan_b, pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string()), ("b", pa.string())]), [{"id": 3, "v": "z", "b": "bee"}])

    table = load(warehouse, IDENT)
    assert [f.name for f in table.schema().fields] == ["id", "v", "a", "b"]
    assert table.schema().find_field("a").field_id != table.schema().find_field("b").field_id
    expected = [{"id": 1, "v": "x", "a": None, "b": None}, {"id": 2, "v": "y", "a": 5, "b": None}, {"id": 3, "v": "z", "a": None, "b": "bee"}]
    assert_readers_see(warehouse, IDENT, expected_rows(expected, ["id", "v", "a", "b"]), ["id", "v", "a", "b"])


def test_keyed_upserts_work_across_an_evolution(warehouse: str) -> None:
    base = T.StructType([_field("id", T.LongType(), False), _field("v", T.StringType())])
    arrow = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())])
    _write(warehouse, base, arrow, [{"id": i, "v": f"a{i}"} for i in range(5)], operation="upsert", primary_key="id")
    wider = T.StructType([*base.fields, _field("w", T.IntegerType())])
    wider_arrow = pa.schema([*arrow, ("w", pa.int32())])
    _write(warehouse, wider, wider_arrow, [{"id": i, "v": f"b{i}", "w": i} for i in (3, 4, 5)], operation="upsert", merge_schema="true")
    _write(warehouse, base, arrow, [{"id": 0, "v": "c0"}], operation="upsert")  # an older writer without w
    expected = [{"id": 0, "v": "c0", "w": None}, {"id": 1, "v": "a1", "w": None}, {"id": 2, "v": "a2", "w": None},
                {"id": 3, "v": "b3", "w": 3}, {"id": 4, "v": "b4", "w": 4}, {"id": 5, "v": "b5", "w": 5}]
    assert_readers_see(warehouse, IDENT, expected_rows(expected, ["id", "v", "w"]), ["id", "v", "w"])
    assert check_table(load(warehouse, IDENT)) == []


def test_cdc_and_dedupe_work_across_an_evolution(warehouse: str) -> None:
    base = T.StructType([_field("id", T.LongType(), False), _field("v", T.StringType()), _field("op", T.StringType())])
    arrow = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string()), ("op", pa.string())])
    cdc = {"operation": "cdc", "op_column": "op", "primary_key": "id"}
    _write(warehouse, base, arrow, [{"id": i, "v": f"a{i}", "op": "c"} for i in range(4)], **cdc)
    wider = T.StructType([*base.fields, _field("w", T.LongType())])
    wider_arrow = pa.schema([*arrow, ("w", pa.int64())])
    # The evolving batch updates one old row, deletes another and inserts a new one.
    _write(warehouse, wider, wider_arrow, [{"id": 1, "v": "b1", "op": "u", "w": 10}, {"id": 2, "v": None, "op": "d", "w": None},
                                           {"id": 7, "v": "b7", "op": "c", "w": 70}], merge_schema="true", **cdc)
    # Dedupe keeps the first row per key: id 3 (old, without w) stays, id 8 is new.
    no_op = T.StructType([f for f in wider.fields if f.name != "op"])
    no_op_arrow = pa.schema([f for f in wider_arrow if f.name != "op"])
    _write(warehouse, no_op, no_op_arrow, [{"id": 3, "v": "c3", "w": 3}, {"id": 8, "v": "c8", "w": 80}], operation="dedupe")
    expected = [{"id": 0, "v": "a0", "w": None}, {"id": 1, "v": "b1", "w": 10}, {"id": 3, "v": "a3", "w": None},
                {"id": 7, "v": "b7", "w": 70}, {"id": 8, "v": "c8", "w": 80}]
    assert_readers_see(warehouse, IDENT, expected_rows(expected, ["id", "v", "w"]), ["id", "v", "w"])
    assert check_table(load(warehouse, IDENT)) == []


def test_compaction_after_an_evolution_rewrites_old_files_into_the_new_schema(warehouse: str) -> None:
    from lakesink_datasource.maintain import maintain_table

    _write(warehouse, V1, A1, OLD)
    _write(warehouse, V1, A1, [{"id": 3, "n": 9, "f": 2.5, "d": Decimal("3.00"), "s": {"x": 3}}])
    _write(warehouse, V2, A2, NEW, merge_schema="true")
    maintain_table(load(warehouse, IDENT), "compact")
    table = load(warehouse, IDENT)
    assert table.metadata.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
    got = {r["id"]: (r["n"], r["s"], r["tag"]) for r in table.scan().to_arrow().to_pylist()}
    assert got == {1: (7, {"x": 1, "y": None}, None), 3: (9, {"x": 3, "y": None}, None), 2: (2**40, {"x": 2, "y": "why"}, "t")}
    expected = [{"id": 1, "n": 7, "tag": None}, {"id": 3, "n": 9, "tag": None}, {"id": 2, "n": 2**40, "tag": "t"}]
    assert_readers_see(warehouse, IDENT, expected_rows(expected, ["id", "n", "tag"]), ["id", "n", "tag"])
    assert check_table(table) == []


def test_a_required_column_the_dataframe_omits_or_sends_nullable_becomes_optional(warehouse: str) -> None:
    strict = T.StructType([_field("id", T.LongType(), False), _field("r", T.StringType(), False), _field("q", T.StringType(), False)])
    _write(warehouse, strict, pa.schema([pa.field("id", pa.int64(), False), pa.field("r", pa.string(), False), pa.field("q", pa.string(), False)]),
           [{"id": 1, "r": "r1", "q": "q1"}])
    loose = T.StructType([_field("id", T.LongType(), False), _field("q", T.StringType(), True)])  # r omitted, q nullable
    with pytest.raises(SchemaError, match="required table column 'r' is missing"):
        _plan(warehouse, loose)
    _write(warehouse, loose, pa.schema([pa.field("id", pa.int64(), False), ("q", pa.string())]), [{"id": 2, "q": None}], merge_schema="true")
    table = load(warehouse, IDENT)
    assert {f.name: f.required for f in table.schema().fields} == {"id": True, "r": False, "q": False}
    expected = [{"id": 1, "r": "r1", "q": "q1"}, {"id": 2, "r": None, "q": None}]
    assert_readers_see(warehouse, IDENT, expected_rows(expected, ["id", "r", "q"]), ["id", "r", "q"])
