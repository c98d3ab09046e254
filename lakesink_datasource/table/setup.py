"""Driver setup: resolve the catalog and table (create it if missing), check the
DataFrame against it, and pin the table state into a WritePlan for the tasks.

Everything that can be wrong with a write is found here, before any task writes a
byte, so a bad write fails fast and leaves the table as it was.
"""

from __future__ import annotations

import uuid
from typing import Optional

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table
from pyspark.sql.types import StructType

from lakesink_datasource.catalog import loader
from lakesink_datasource.options import OptionError, WriteOptions
from lakesink_datasource.schema.spark_types import column_mapping, spark_to_iceberg_schema
from lakesink_datasource.table.partition_spec import parse_partition_spec
from lakesink_datasource.table.plan import WritePlan


def load_table(catalog: Catalog, identifier: str) -> Optional[Table]:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def create_table(catalog: Catalog, options: WriteOptions, spark_schema: StructType) -> Table:
    schema = spark_to_iceberg_schema(spark_schema)
    spec = parse_partition_spec(options.partition_by, schema)
    namespace = options.table.rsplit(".", 1)[0]
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    try:
        return catalog.create_table(
            options.table,
            schema=schema,
            partition_spec=spec,
            properties={"format-version": str(options.format_version)},
        )
    except TableAlreadyExistsError:
        # Another writer created it between our load and create: use theirs.
        return catalog.load_table(options.table)


def resolve_table(options: WriteOptions, spark_schema: StructType, *, create: bool = True) -> Optional[Table]:
    catalog = loader.load(loader.catalog_config(options))
    table = load_table(catalog, options.table)
    if table is None and create:
        table = create_table(catalog, options, spark_schema)
    return table


def plan_write(options: WriteOptions, spark_schema: StructType, overwrite: bool) -> WritePlan:
    if options.operation != "append":
        raise OptionError(f"option 'operation' = {options.operation!r} is not available yet in this version (use 'append')")
    # Validate everything that does not need the table first, so a bad option never
    # creates a table as a side effect.
    probe = spark_to_iceberg_schema(spark_schema)
    parse_partition_spec(options.partition_by, probe)
    table = resolve_table(options, spark_schema)
    assert table is not None
    sources = column_mapping(spark_schema, table.schema())
    current = table.metadata.current_snapshot()
    return WritePlan(
        write_id=uuid.uuid4().hex,
        options=options,
        catalog=loader.catalog_config(options),
        identifier=options.table,
        metadata_location=table.metadata_location,
        io_properties=dict(table.io.properties),
        format_version=table.metadata.format_version,
        overwrite=overwrite,
        column_sources=sources,
        planned_snapshot_id=current.snapshot_id if current else None,
    )
