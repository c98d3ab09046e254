"""Nothing lost when the world around a table goes wrong (issue 26), through Spark: what
the user's write meets, and the table read back by DuckDB and pyiceberg."""

from __future__ import annotations

import pytest
from lakesink_testing import assert_readers_see, expected_rows, load

from lakesink_datasource.check import check_table
from lakesink_datasource.maintenance.compaction import compact


def test_an_optional_struct_with_a_required_field_can_be_left_out(spark, warehouse: str) -> None:
    """Spark makes `named_struct('x', cast(id as int))`'s field `x` required. A later
    merge_schema upsert that omits `s` used to fail in the task ("Column 'x' is declared
    non-nullable but contains nulls") and stall the stream; a null optional struct with
    required fields is valid Iceberg, written as such."""
    options = {"warehouse": warehouse, "table": "db.s", "operation": "upsert", "primary_key": "id"}
    spark.range(4).selectExpr("id", "named_struct('x', cast(id as int)) as s", "'a' as v") \
        .write.format("lakesink").options(**options).mode("append").save()
    spark.createDataFrame([(2, "b"), (9, "b")], "id long, v string") \
        .write.format("lakesink").options(**options, merge_schema="true").mode("append").save()
    expected = [{"id": i, "s": {"x": i}, "v": "a"} for i in (0, 1, 3)] + [{"id": i, "s": None, "v": "b"} for i in (2, 9)]
    assert_readers_see(warehouse, "db.s", expected_rows(expected, ["id", "s", "v"]), ["id", "s", "v"])
    table = load(warehouse, "db.s")
    assert check_table(table) == []
    # The struct stays optional with its required field: the table's schema is unchanged.
    field = table.schema().find_field("s")
    assert not field.required and field.field_type.fields[0].required


@pytest.mark.parametrize("operation", ["append", "upsert"])
def test_a_struct_omitted_from_a_stream_survives_compaction(spark, warehouse: str, operation: str) -> None:
    """Files holding null structs with required fields are rewritten by the compaction
    (which reads them back through the same alignment) without error."""
    keyed = {"operation": "upsert", "primary_key": "id"} if operation == "upsert" else {}
    options = {"warehouse": warehouse, "table": "db.c", "maintenance": "off", **keyed}
    spark.range(3).selectExpr("id", "named_struct('x', cast(id as int)) as s") \
        .write.format("lakesink").options(**options).mode("append").save()
    for i in range(3, 6):
        spark.createDataFrame([(i,)], "id long").write.format("lakesink").options(**options, merge_schema="true").mode("append").save()
    result = compact(load(warehouse, "db.c"), budget_bytes=1 << 40, tiered=False, batch_id=None)
    assert result.snapshot_id is not None and result.files_rewritten >= 4, result.describe()
    expected = [{"id": i, "s": {"x": i} if i < 3 else None} for i in range(6)]
    assert_readers_see(warehouse, "db.c", expected_rows(expected, ["id", "s"]), ["id", "s"])
