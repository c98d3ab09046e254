"""Bad input found while planning, before any table is created or written (no Spark needed:
`plan_write` gets the DataFrame's schema as Spark would hand it)."""

from __future__ import annotations

import socket

import pytest
from lakesink_testing import load, table_exists
from pyspark.sql import types as T

from lakesink_datasource.catalog.loader import CatalogError
from lakesink_datasource.options import OptionError, parse_options
from lakesink_datasource.schema.spark_types import SchemaError
from lakesink_datasource.table.setup import plan_write

ID_V = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("db.a/b", "must not contain '/'"),
        ("db/a.b", "must not contain '/'"),
        ("db.a\\b", "must not contain"),
        ("db.a\nb", "must not contain '\\\\n'"),
        ("db..t", "no empty part"),
        ("db. .t", "no empty part"),
    ],
)
def test_table_names_that_are_not_safe_directory_names_are_refused(warehouse: str, table: str, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options({"table": table, "warehouse": warehouse})


@pytest.mark.parametrize(
    ("options", "schema", "error", "message"),
    [
        ({"operation": "upsert", "primary_key": " , "}, ID_V, OptionError, "option 'primary_key' names no column"),
        ({"operation": "upsert", "primary_key": "id,ID"}, ID_V, OptionError, "names id, ID more than once|names ID, id more than once"),
        ({"operation": "upsert", "primary_key": "d"}, T.StructType([T.StructField("d", T.DoubleType())]), SchemaError,
         "primary key column 'd' has type double, which cannot be a key"),
        ({}, T.StructType([T.StructField("a", T.LongType()), T.StructField("A", T.LongType())]), SchemaError,
         "columns 'a' and 'A' differ only in case"),
        ({}, T.StructType([]), SchemaError, "the DataFrame has no columns"),
    ],
    ids=["empty-key", "repeated-key", "double-key", "case-duplicates", "no-columns"],
)
def test_bad_input_is_named_before_a_table_is_created(
    warehouse: str, options: dict[str, str], schema: T.StructType, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        plan_write(parse_options({"table": "db.t", "warehouse": warehouse, **options}), schema, overwrite=False)
    assert not table_exists(warehouse, "db.t")


def test_case_duplicates_are_refused_on_an_existing_table_too(warehouse: str) -> None:
    plan_write(parse_options({"table": "db.t", "warehouse": warehouse}), ID_V, overwrite=False)
    before = load(warehouse, "db.t").metadata_location
    twice = T.StructType([*ID_V.fields, T.StructField("V", T.StringType())])
    with pytest.raises(SchemaError, match="columns 'v' and 'V' differ only in case"):
        plan_write(parse_options({"table": "db.t", "warehouse": warehouse}), twice, overwrite=False)
    assert load(warehouse, "db.t").metadata_location == before




def test_partition_by_or_format_version_that_differ_from_an_existing_table_are_refused(warehouse: str) -> None:
    base = {"table": "db.t", "warehouse": warehouse}
    plan_write(parse_options({**base, "partition_by": "bucket(4, id)", "format_version": "2"}), ID_V, overwrite=False)
    before = load(warehouse, "db.t").metadata_location
    with pytest.raises(OptionError, match=r"'partition_by' = 'v' differs from the partitioning of table db\.t") as caught:
        plan_write(parse_options({**base, "partition_by": "v"}), ID_V, overwrite=False)
    assert "(bucket(4, id))" in str(caught.value) and "set evolve_partition=true" in str(caught.value) and "leave partition_by out" in str(caught.value)
    with pytest.raises(OptionError, match=r"'format_version' = 3 differs from table db\.t, which is format version 2"):
        plan_write(parse_options({**base, "format_version": "3"}), ID_V, overwrite=False)
    assert load(warehouse, "db.t").metadata_location == before
    # The same spec (any spelling) and no spec at all are fine.
    plan_write(parse_options({**base, "partition_by": "BUCKET(4, ID)", "format_version": "2"}), ID_V, overwrite=False)
    plan_write(parse_options(base), ID_V, overwrite=False)


def test_an_unconfigured_or_unreachable_catalog_is_named_with_lakesink_options(warehouse: str) -> None:
    base = {"table": "db.t", "catalog": "prod"}
    with pytest.raises(CatalogError, match=r"catalog 'prod' is not configured: give lakesink options 'catalog.uri'"):
        plan_write(parse_options(base), ID_V, overwrite=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rest = {**base, "catalog.type": "rest", "catalog.uri": f"http://127.0.0.1:{port}"}
    with pytest.raises(CatalogError, match=rf"cannot reach catalog 'prod' at http://127.0.0.1:{port}: ConnectionError.*check option 'catalog.uri'"):
        plan_write(parse_options(rest), ID_V, overwrite=False)


def test_new_checkpoint_refuses_what_it_cannot_do_naming_the_option(warehouse: str) -> None:
    from lakesink_datasource import LakeSinkDataSource

    with pytest.raises(OptionError, match=r"option 'new_checkpoint' must be one of refuse, replace, append, got 'Sometimes'"):
        parse_options({"table": "db.t", "warehouse": warehouse, "new_checkpoint": "Sometimes"})
    # A batch write has no checkpoint; a stream routed by table_column cannot empty tables it
    # only meets as rows arrive. Both refused before any table exists.
    batch = LakeSinkDataSource({"table": "db.t", "warehouse": warehouse, "new_checkpoint": "replace"})
    with pytest.raises(OptionError, match="option 'new_checkpoint' applies to streaming writes"):
        batch.writer(ID_V, False)
    routed = LakeSinkDataSource({"table_column": "tbl", "warehouse": warehouse, "new_checkpoint": "replace"})
    tbl = T.StructType([T.StructField("tbl", T.StringType()), *ID_V.fields])
    with pytest.raises(OptionError, match="routed by 'table_column' only knows its tables once their rows arrive"):
        routed.streamWriter(tbl, False)
    assert not table_exists(warehouse, "db.t")
