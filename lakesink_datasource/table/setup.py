"""Driver setup: resolve the catalog and table (create it if missing), check the
DataFrame against it, and pin the table state into a WritePlan for the tasks.

Everything that can be wrong with a write is found here, before any task writes a
byte, so a bad write fails fast and leaves the table as it was.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import msgspec
from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import DoubleType, FloatType, PrimitiveType
from pyspark.sql.types import StructType

from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.catalog.errors import CatalogError
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.compaction.budget import compaction_budget, compaction_min_files
from lakesink_datasource.compaction.carried import CarriedCompaction, plan_carried
from lakesink_datasource.iceberg.compat import v3_metadata_writes
from lakesink_datasource.iceberg.history import branch_head
from lakesink_datasource.iceberg.properties import CREATE_DEFAULTS, FORMAT_VERSION, PropertyError, TableSettings
from lakesink_datasource.iceberg.retry import RetryClock, RetryPolicy
from lakesink_datasource.iceberg.row_filter import FilterError, parse_filter
from lakesink_datasource.iceberg.summary_keys import tasks_of
from lakesink_datasource.index.key_shards import SHARD_BY_TEXT, SHARD_COLUMN, SHARD_KEY_COLUMNS
from lakesink_datasource.options import KEYED_OPERATIONS, OptionError, WriteOptions
from lakesink_datasource.schema.evolution import Evolution, describe_differences, merge_schema
from lakesink_datasource.schema.spark_types import SchemaError, check_dataframe_columns, column_mapping, spark_to_iceberg_schema
from lakesink_datasource.table.checkpoint import committed_batches
from lakesink_datasource.table.history_columns import check_history_options, plan_history, with_history_columns
from lakesink_datasource.table.location_guard import (
    LocationInUse,
    created_meanwhile,
    metadata_files,
    refuse_if_in_use,
    remove_lost_creations,
)
from lakesink_datasource.table.new_checkpoint import check_planned_stream
from lakesink_datasource.table.partition_spec import describe_spec, parse_partition_spec, same_layout
from lakesink_datasource.table.plan import KeyedPlan, WritePlan
from lakesink_datasource.table.schema_staging import stage_evolution
from lakesink_datasource.table.sort_order import describe_order, parse_sort_order, same_order
from lakesink_datasource.table.spec_staging import stage_spec
from lakesink_datasource.table.store_probe import StoreRefusesFiles, check_puffin_accepted


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return sql_commit.load_table(catalog, identifier)
    except NoSuchTableError:
        return None


def _stored_columns(options: WriteOptions, spark_schema: StructType) -> StructType:
    """The DataFrame columns that become table columns (the cdc op column is not stored), and
    a history table's bounds."""
    if options.op_column is not None:
        spark_schema = StructType([f for f in spark_schema.fields if f.name.lower() != options.op_column.lower()])
    return with_history_columns(options, spark_schema)


def without_route(spark_schema: StructType) -> tuple[StructType, tuple[str, ...] | None]:
    """The DataFrame's columns without cluster_by_key's shard column (it clusters rows by key
    shards; it is never stored), and the key columns the shard column hashed (None: not clustered)."""
    route = next((f for f in spark_schema.fields if f.name == SHARD_COLUMN), None)
    if route is None:
        return spark_schema, None
    if route.metadata.get(SHARD_BY_TEXT):
        raise OptionError(
            "the DataFrame was routed by cluster_by_key to many tables (table_column): write it with the same options, "
            "'table_column' among them"
        )
    fields = [f for f in spark_schema.fields if f.name != SHARD_COLUMN]
    return StructType(fields), tuple(route.metadata.get(SHARD_KEY_COLUMNS) or ())


def _with_route(options: WriteOptions, route_key: tuple[str, ...] | None) -> WriteOptions:
    """The options of a write of routed rows: keyed, with the route's key as primary key."""
    if route_key is None:
        return options
    if options.operation not in KEYED_OPERATIONS:
        raise OptionError(
            f"the DataFrame was routed by cluster_by_key, which is for keyed writes (operation upsert, cdc or dedupe), "
            f"not operation {options.operation!r}: for appends use cluster_by_partition, or write the DataFrame unclustered"
        )
    if options.primary_key is None and route_key:
        return msgspec.structs.replace(options, primary_key=route_key)
    if route_key and [c.lower() for c in options.primary_key or ()] != [c.lower() for c in route_key]:
        raise OptionError(
            f"option 'primary_key' ({', '.join(options.primary_key or ())}) differs from the key cluster_by_key routed the "
            f"rows by ({', '.join(route_key)}): give the same columns, or leave primary_key out"
        )
    return options


def _new_table_schema(options: WriteOptions, spark_schema: StructType) -> Schema:
    # A keyed table gets its primary key as Iceberg identifier fields (required columns).
    return spark_to_iceberg_schema(_stored_columns(options, spark_schema), options.primary_key or ())


def _column_sources(options: WriteOptions, spark_schema: StructType, schema: Schema) -> list[str | None]:
    return column_mapping(spark_schema, schema, ignore=(options.op_column,) if options.op_column else ())


def create_table(
    catalog: Catalog, options: WriteOptions, spark_schema: StructType, config: loader.CatalogConfig, clock: RetryClock
) -> Table:
    schema = _new_table_schema(options, spark_schema)
    spec = parse_partition_spec(options.partition_by, schema)
    order = parse_sort_order(options.sort_by, schema)
    namespace = options.table.rsplit(".", 1)[0]
    name = loader.describe(config)
    _ensure_namespace(catalog, namespace, name, clock)
    planned = _planned_location(catalog, options.table)
    before: frozenset[str] = frozenset()
    if planned is not None:
        planned_io = load_file_io(catalog.properties, planned)
        try:
            refuse_if_in_use(planned_io, planned, options.table, name)
        except LocationInUse:
            other = created_meanwhile(lambda: _loaded_or_none(catalog, options.table), clock)
            if other is None:
                raise
            return other
        before = frozenset(metadata_files(planned_io, planned))
    try:
        with v3_metadata_writes():
            table = catalog_call(
                clock,
                lambda: catalog.create_table(
                    options.table,
                    schema=schema,
                    partition_spec=spec,
                    sort_order=order if order is not None else UNSORTED_SORT_ORDER,
                    properties={**CREATE_DEFAULTS, **options.table_properties, FORMAT_VERSION: str(options.format_version or 3)},
                ),
                what=f"creating table {options.table}", catalog=name,
            )
    except TableAlreadyExistsError:
        # Another writer created it between our load and create: use theirs.
        table = catalog_call(clock, lambda: catalog.load_table(options.table), what=f"loading table {options.table}", catalog=name)
        if planned is not None:
            remove_lost_creations(table.io, planned, before, str(table.metadata.table_uuid))
        return table
    if planned is None:
        # The catalog chose the location (a REST catalog): check it now, and take the new
        # entry back if another table's metadata is there.
        try:
            refuse_if_in_use(table.io, table.metadata.location, options.table, name, own_uuid=str(table.metadata.table_uuid))
        except LocationInUse:
            catalog.drop_table(options.table)
            raise
    return table


def _ensure_namespace(catalog: Catalog, namespace: str, name: str, clock: RetryClock) -> None:
    try:
        catalog_call(clock, lambda: catalog.create_namespace(namespace), what=f"creating namespace {namespace}", catalog=name)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:
        # Another writer's create of the same namespace won the race (a SQL catalog then
        # reports its unique-key violation, not NamespaceAlreadyExistsError).
        if not catalog.namespace_exists(namespace):
            raise


def _loaded_or_none(catalog: Catalog, identifier: str) -> Table | None:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def _planned_location(catalog: Catalog, identifier: str) -> str | None:
    """Where `catalog` will put a new table `identifier`, when the client decides it (SQL
    and other metastore catalogs); None when the catalog service chooses (REST)."""
    if not isinstance(catalog, MetastoreCatalog):
        return None
    namespace, name = identifier.rsplit(".", 1)
    try:
        return catalog._resolve_table_location(None, namespace, name)
    except (ValueError, NoSuchNamespaceError):
        return None


def _stream_history_check(options: WriteOptions, catalog: str) -> None:
    """A streaming query that has committed batches never starts a new table: its earlier
    batches are marked done in its checkpoint and would never be written again."""
    committed = committed_batches(options.checkpoint_location) if options.checkpoint_location else []
    if committed:
        raise CatalogError(
            f"table {options.table} does not exist in {catalog}, but this streaming query's checkpoint "
            f"{options.checkpoint_location} has committed batches (up to {committed[-1]}): they were written to a table "
            "this catalog no longer knows, and Spark will not replay them. lakesink does not start a new table under a "
            "running query. Restore the catalog or register the table back (python -m lakesink_datasource.maintain "
            f"register {options.table} ...); to start over on purpose, use a new checkpointLocation"
        )


def planning_clock(options: WriteOptions) -> RetryClock:
    """The clock of planning a write (iceberg/retry.py): the write's own `property.<key>`
    options' budgets until the table, once loaded, gives its own (`RetryClock.adopt`)."""
    return RetryPolicy.from_properties(options.table_properties).start(f"planning a write to {options.table}")


def resolve_table(
    options: WriteOptions, spark_schema: StructType, *, create: bool = True, clock: RetryClock | None = None
) -> Table | None:
    """The table `options` name, created when missing (`create`). `clock`: the planning's
    (else one of its own)."""
    clock = clock if clock is not None else planning_clock(options)
    config = loader.catalog_config(options)
    name = loader.describe(config)
    try:
        catalog = catalog_call(clock, lambda: loader.load(config), what="opening the catalog", catalog=name)
        table = catalog_call(clock, lambda: load_table(catalog, options.table), what=f"loading table {options.table}", catalog=name)
        if table is None and create:
            _stream_history_check(options, name)
            table = create_table(catalog, options, spark_schema, config, clock)
    except OSError as exc:  # a REST catalog that stopped answering, a file permission, ...
        if isinstance(exc, PermissionError):
            raise loader.CatalogError(
                f"permission denied on {exc.filename or 'a table file'} for table {options.table}: {exc.strerror}; the "
                "Spark driver and executors need read and write access to the warehouse"
            ) from exc
        raise loader.CatalogError(loader.unreachable(config, exc)) from exc
    return table


def _find(struct: StructType, name: str) -> str | None:
    return next((f.name for f in struct.fields if f.name.lower() == name.lower()), None)


def _check_layout_matches(options: WriteOptions, table: Table, schema: Schema, fixed_by: str | None = None) -> PartitionSpec | None:
    """`partition_by` and `format_version` describe the table a write creates; on an existing
    table they must agree with it rather than be silently ignored. With `evolve_partition` a
    different `partition_by` is the spec to evolve to: returned (parsed against `schema`, the
    schema the write will have), else None. `fixed_by`: the kind of write whose tasks plan
    each table themselves, which can never evolve a partitioning (named in the refusal)."""
    if options.format_version is not None and options.format_version != table.metadata.format_version:
        raise OptionError(
            f"option 'format_version' = {options.format_version} differs from table {options.table}, which is format "
            f"version {table.metadata.format_version}; leave the option out (it applies when lakesink creates a table)"
        )
    if options.sort_by is not None:
        order = parse_sort_order(options.sort_by, schema)
        assert order is not None
        if not same_order(order, table.sort_order()):
            raise OptionError(
                f"option 'sort_by' = {options.sort_by!r} differs from the sort order of table {options.table} "
                f"({describe_order(table.sort_order(), table.schema())}); it applies when lakesink creates a table: leave it "
                "out to write with the table's own order (change a table's order with your engine's WRITE ORDERED BY)"
            )
    if options.partition_by is None:
        return None
    wanted = parse_partition_spec(options.partition_by, schema)
    if same_layout(wanted, table.spec()):
        return None
    if fixed_by is not None:
        raise OptionError(
            f"table {options.table}: {fixed_by} cannot evolve the table's partitioning (option 'partition_by' = "
            f"{options.partition_by!r}, the table's is {describe_spec(table.spec(), table.schema())}); leave partition_by "
            "out, or evolve the table with one plain write of its own first (evolve_partition=true)"
        )
    if not options.evolve_partition:
        raise OptionError(
            f"option 'partition_by' = {options.partition_by!r} differs from the partitioning of table {options.table} "
            f"({describe_spec(table.spec(), table.schema())}); set evolve_partition=true to make it the table's new "
            "partitioning (files already written keep theirs), or leave partition_by out to write with the table's own"
        )
    return wanted


def _check_write_target(options: WriteOptions, overwrite: bool) -> None:
    """Branch and partial-overwrite options that need no table."""
    if options.replace_where is not None and not overwrite:
        raise OptionError(
            "option 'replace_where' applies to overwrites: use mode('overwrite') (it then replaces only the rows the "
            "filter matches), or leave it out to append"
        )
    if options.evolve_partition and options.partition_by is None:
        raise OptionError("option 'evolve_partition' needs option 'partition_by': the partitioning to evolve the table to")
    if options.evolve_partition and options.branch is not None:
        raise OptionError(
            "option 'evolve_partition' cannot be used with option 'branch': a table's partitioning is shared by all "
            "its branches; evolve it on main"
        )
    if options.branch is not None and options.operation in KEYED_OPERATIONS:
        raise OptionError(
            f"option 'branch' cannot be used with operation {options.operation!r}: keyed writes resolve keys in an "
            "index of main's rows; write keyed changes to main, or append/overwrite on the branch"
        )


def _check_filter(options: WriteOptions, schema: Schema) -> None:
    if options.replace_where is None:
        return
    try:
        parse_filter(options.replace_where, schema)
    except FilterError as exc:
        raise OptionError(f"option 'replace_where': {exc}") from None


def _check_branch(options: WriteOptions, table: Table) -> None:
    ref = table.metadata.refs.get(options.branch) if options.branch is not None else None
    if ref is not None and ref.snapshot_ref_type.value != "branch":
        raise OptionError(
            f"option 'branch' = {options.branch!r} names a tag of table {options.table}; tags cannot be written to: "
            "give a branch name (a missing branch is created from main)"
        )


def _check_keyed_options(options: WriteOptions, spark_schema: StructType, overwrite: bool) -> None:
    """Keyed option checks that need no table (so they run before one is created)."""
    keyed = options.operation in KEYED_OPERATIONS
    if not keyed:
        for name in ("primary_key", "op_column", "sequence_column", "unavailable_value"):
            if getattr(options, name) is not None:
                raise OptionError(f"option '{name}' only applies to keyed operations (upsert, cdc, dedupe)")
        check_history_options(options, spark_schema)
        return
    if options.operation == "dedupe" and options.unavailable_value is not None:
        raise OptionError("option 'unavailable_value' does not apply to operation 'dedupe': dedupe never replaces a row")
    check_history_options(options, spark_schema)
    if overwrite:
        raise OptionError(
            f"option 'operation' = {options.operation!r} needs append: overwrite (and complete output mode) "
            "replaces the whole table, which leaves nothing to resolve keys against"
        )
    if options.operation == "cdc" and options.op_column is None:
        raise OptionError("operation 'cdc' needs option 'op_column' (the column saying c/r/u/d per row)")
    if options.operation == "dedupe" and options.sequence_column is not None:
        raise OptionError("option 'sequence_column' does not apply to operation 'dedupe': dedupe never replaces a row")
    if options.operation != "cdc" and options.op_column is not None:
        raise OptionError(f"option 'op_column' only applies to operation 'cdc', not {options.operation!r}")
    for name, columns in (("op_column", (options.op_column,) if options.op_column else ()), ("sequence_column", options.sequence_column or ())):
        for column in columns:
            if _find(spark_schema, column) is None:
                raise SchemaError(f"option '{name}': column '{column}' is not in the DataFrame")
    for column in options.primary_key or ():
        if _find(spark_schema, column) is None:
            raise SchemaError(f"primary key column '{column}' is missing from the DataFrame")


def _check_new_keyed_table(options: WriteOptions) -> None:
    """A keyed write that would create its table must say the key: a table created without
    identifier fields would be left behind, empty, by the error that follows."""
    if options.operation in KEYED_OPERATIONS and not options.primary_key:
        raise OptionError(
            f"operation {options.operation!r} needs option 'primary_key' (table {options.table} does not exist yet; "
            "lakesink creates it with the primary key as its identifier fields)"
        )


def _check_input(options: WriteOptions, spark_schema: StructType, overwrite: bool) -> None:
    """What every planner refuses before it looks at a table: the DataFrame's columns, the
    keyed options against them, and where the write goes."""
    check_dataframe_columns(spark_schema)
    _check_keyed_options(options, spark_schema, overwrite)
    _check_write_target(options, overwrite)


def _check_new_table(options: WriteOptions, probe: Schema) -> None:
    """What a table created from these options would refuse: its partitioning and sort
    order against the schema it would have, and a keyed write's key."""
    parse_partition_spec(options.partition_by, probe)
    parse_sort_order(options.sort_by, probe)
    _check_new_keyed_table(options)


def _check_format_version(options: WriteOptions, table: Table) -> None:
    if table.metadata.format_version < 2:
        raise OptionError(
            f"table {options.table} is Iceberg format version 1; lakesink writes versions 2 and 3 "
            "(upgrade it first, e.g. ALTER TABLE ... SET TBLPROPERTIES ('format-version' = '2'))"
        )


def _refuse_partition_change(options: WriteOptions, table: Table, schema: Schema, writer: str) -> None:
    """`writer`'s tasks plan each table themselves, with no driver to stage a new spec."""
    _check_layout_matches(options, table, schema, fixed_by=writer)


def _plan_keys(options: WriteOptions, spark_schema: StructType, table: Table, clustered: bool = False) -> KeyedPlan | None:
    if options.operation not in KEYED_OPERATIONS:
        return None
    schema = table.schema()
    identifier = tuple(schema.find_column_name(i) or "" for i in sorted(schema.identifier_field_ids))
    key = options.primary_key or identifier
    if not key:
        raise OptionError(
            f"operation {options.operation!r} needs option 'primary_key' (the table {options.table} has no identifier fields)"
        )
    if options.primary_key and identifier and [c.lower() for c in options.primary_key] != [c.lower() for c in identifier]:
        raise OptionError(
            f"option 'primary_key' ({', '.join(options.primary_key)}) does not match the table's identifier fields "
            f"({', '.join(identifier)})"
        )
    table_key = []
    for column in key:
        field = next((f for f in schema.fields if f.name.lower() == column.lower()), None)
        if field is None:
            raise SchemaError(f"primary key column '{column}' is not a top-level column of the table")
        if not isinstance(field.field_type, PrimitiveType) or isinstance(field.field_type, (FloatType, DoubleType)):
            raise SchemaError(f"primary key column '{column}' has type {field.field_type}, which cannot be a key")
        table_key.append(field.name)
    sources = []
    for column in table_key:
        source = _find(spark_schema, column)
        if source is None:
            raise SchemaError(f"primary key column '{column}' is missing from the DataFrame")
        sources.append(source)
    sequence = options.sequence_column or ()
    by_name = {f.name.lower(): f.name for f in schema.fields}
    stored = tuple(by_name[c.lower()] for c in sequence if c.lower() in by_name)
    history = plan_history(options, schema, tuple(table_key), stored, options.table)
    return KeyedPlan(
        history=history,
        key_sources=tuple(sources),
        op_source=_find(spark_schema, options.op_column) if options.op_column else None,
        sequence_sources=tuple(_find(spark_schema, c) or c for c in sequence),
        table_key_columns=tuple(table_key),
        # Stored only when every sequence column is: a rebuilt index compares whole sequences.
        table_sequence_columns=stored if len(stored) == len(sequence) else (),
        clustered=clustered,
    )


def _key_columns(table: Table, keyed: KeyedPlan | None) -> tuple[str, ...]:
    if keyed is not None:
        return keyed.table_key_columns
    schema = table.schema()
    return tuple(schema.find_column_name(i) or "" for i in sorted(schema.identifier_field_ids))


def _evolution(options: WriteOptions, spark_schema: StructType, table: Table, keyed: KeyedPlan | None) -> Evolution:
    """How the table's schema must change for this write (nothing, or with `merge_schema` the
    evolved schema, not staged yet). A difference without `merge_schema` is refused here,
    named."""
    stored = _stored_columns(options, spark_schema)
    metadata = table.metadata
    if not options.merge_schema:
        differences = describe_differences(table.schema(), stored, format_version=metadata.format_version)
        if differences is not None:
            raise SchemaError(f"table {options.table}: {differences}")
        return Evolution(table.schema())
    return merge_schema(
        table.schema(), stored, last_column_id=metadata.last_column_id, format_version=metadata.format_version,
        key_columns=_key_columns(table, keyed),
    )


def _pinned_plan(
    table: Table, options: WriteOptions, write_id: str, *, overwrite: bool, sources: list[str | None], keyed: KeyedPlan | None,
    write_schema_json: str | None = None, evolved_from_schema_id: int | None = None, write_spec_id: int | None = None,
) -> WritePlan:
    """The plan of a write against `table`'s current state (its metadata file and the head of
    the write's branch): what every task of the write and its commit go by."""
    current = branch_head(table.metadata, options.branch)
    return WritePlan(
        write_id=write_id, options=options, catalog=loader.catalog_config(options), identifier=options.table,
        metadata_location=table.metadata_location, io_properties=dict(table.io.properties),
        format_version=table.metadata.format_version, overwrite=overwrite, column_sources=sources,
        planned_snapshot_id=current.snapshot_id if current else None, keyed=keyed, write_schema_json=write_schema_json,
        evolved_from_schema_id=evolved_from_schema_id, write_spec_id=write_spec_id,
    )


def plan_write(options: WriteOptions, spark_schema: StructType, overwrite: bool) -> WritePlan:
    """The plan of a write (see the module's docstring), as one operation of the retry
    policy: every catalog call and file it reads or writes waits on its one clock."""
    clock = planning_clock(options)
    with clock.active():
        return _plan_write(options, spark_schema, overwrite, clock)


def _plan_write(options: WriteOptions, spark_schema: StructType, overwrite: bool, clock: RetryClock) -> WritePlan:
    # Validate everything that does not need the table first, so a bad option never
    # creates a table as a side effect.
    spark_schema, route_key = without_route(spark_schema)
    options = _with_route(options, route_key)
    clustered = route_key is not None
    _check_input(options, spark_schema, overwrite)
    probe = _new_table_schema(options, spark_schema)
    table = resolve_table(options, spark_schema, create=False, clock=clock)
    _check_filter(options, table.schema() if table is not None else probe)
    created = table is None
    if table is not None:
        _check_branch(options, table)
        # Before anything is staged: a new checkpoint's first batch is refused, or planned
        # only once the table is emptied (new_checkpoint.py).
        check_planned_stream(options, table.metadata, overwrite=overwrite)
    else:
        _check_new_table(options, probe)
        table = resolve_table(options, spark_schema, clock=clock)
    assert table is not None
    _check_format_version(options, table)
    try:
        # The table's own properties too: one another engine set to a value lakesink cannot
        # use must fail here, not in every task.
        settings = TableSettings.for_write(table.metadata.properties, options.table_properties, table.metadata.location)
        clock.adopt(RetryPolicy.of(settings))  # the table's own budgets from here on
    except PropertyError as exc:
        raise OptionError(f"{exc} (table {options.table}); fix it with property.{exc.name}=...") from None
    keyed = _plan_keys(options, spark_schema, table, clustered)
    if table.metadata.format_version >= 3 and (keyed is not None or (overwrite and options.replace_where is not None)):
        settings = TableSettings.for_write(table.metadata.properties, options.table_properties, table.metadata.location)
        try:
            check_puffin_accepted(table.io, settings.data_path, options.table, table.metadata.location)
        except StoreRefusesFiles:
            if created:  # the location was only known once created: take the empty table back
                table.catalog.drop_table(options.table)
            raise
    evolution = Evolution(table.schema()) if created else _evolution(options, spark_schema, table, keyed)
    new_spec = None if created else _check_layout_matches(options, table, evolution.schema)
    sources = _column_sources(options, spark_schema, evolution.schema)
    staged = None
    if evolution.changed:
        # Every check passed: only now is the evolved schema staged (its field ids reserved,
        # not visible to readers until the data commit makes it current).
        staged = stage_evolution(table, _stored_columns(options, spark_schema), _key_columns(table, keyed), clock=clock)
        if staged is not None:
            table = staged.table
            sources = _column_sources(options, spark_schema, staged.schema)
    spec_id = None
    if new_spec is not None:
        # Likewise the new partition spec (its id and field ids taken, the default unchanged),
        # parsed again against the schema as staged.
        staged_spec = stage_spec(
            table, parse_partition_spec(options.partition_by, staged.schema if staged else table.schema()), clock=clock
        )
        table, spec_id = staged_spec.table, staged_spec.spec.spec_id
    plan = _pinned_plan(
        table, options, uuid.uuid4().hex, overwrite=overwrite, sources=sources, keyed=keyed,
        write_schema_json=staged.schema.model_dump_json() if staged is not None else None,
        evolved_from_schema_id=staged.evolved_from if staged is not None else None,
        write_spec_id=spec_id,
    )
    if created or clustered or overwrite or staged is not None or spec_id is not None:
        # A new table has nothing to merge; a clustered stream's tasks plan for themselves; an
        # overwrite or an evolving write changes what a compaction would read.
        return plan
    return msgspec.structs.replace(plan, compaction=_carried_compaction(options, table))


def _carried_compaction(options: WriteOptions, table: Table) -> CarriedCompaction | None:
    """maintenance=auto on main: what the write's tasks compact beside their rows, sized by
    what the table's last snapshot added (a stream's batches are alike)."""
    if options.maintenance != "auto" or options.branch is not None:
        return None
    metadata = table.metadata
    snapshot = metadata.current_snapshot()
    if snapshot is None:
        return None
    # The last write's own snapshot: a compaction's says nothing of a batch's size.
    for _ in range(8):
        if snapshot.summary is None or snapshot.summary.operation != Operation.REPLACE or snapshot.parent_snapshot_id is None:
            break
        parent = metadata.snapshot_by_id(snapshot.parent_snapshot_id)
        if parent is None:
            break
        snapshot = parent
    added = snapshot.summary.additional_properties if snapshot.summary is not None else {}
    settings = TableSettings.of_table(metadata)
    tasks = tasks_of(added)
    return plan_carried(
        table, budget_bytes=compaction_budget(settings, int(added.get("added-files-size", 0))),
        min_files=compaction_min_files(settings, int(added.get("added-data-files", 0))), tasks=tasks or 1,
    )


def write_layout(options: WriteOptions, spark_schema: StructType) -> tuple[Schema, PartitionSpec, list[str | None]]:
    """The table schema and partition spec a write of `spark_schema` with `options` goes to
    (the existing table's, else the ones it would be created with), and for each table column
    the DataFrame column that feeds it. Creates nothing."""
    spark_schema, _ = without_route(spark_schema)
    table = resolve_table(options, spark_schema, create=False)
    if table is not None:
        schema, spec = table.schema(), table.spec()
        if options.evolve_partition and options.partition_by is not None:
            spec = parse_partition_spec(options.partition_by, schema)  # what the write will evolve to
    else:
        schema = _new_table_schema(options, spark_schema)
        spec = parse_partition_spec(options.partition_by, schema)
    sources = _column_sources(options, spark_schema, schema)
    return schema, spec, sources


def plan_clustered_task(options: WriteOptions, spark_schema: StructType, write_id: str) -> WritePlan:
    """The plan a task of a stream clustered by key shard makes for itself (`cluster_by_key`:
    the keyed work runs inside Spark's stateful operator, before the sink's writer, so no
    driver plan reaches it). Against the table's current state, with no side effect: the
    sink's driver plan for the same batch, made before any task starts, has created the
    table already and refused bad input; a schema or partition change it would stage is
    refused here (the task cannot share the staged schema the commit makes current)."""
    spark_schema, _ = without_route(spark_schema)
    _check_input(options, spark_schema, overwrite=False)
    table = resolve_table(options, spark_schema, create=False)
    if table is None:
        raise OptionError(f"table {options.table} does not exist: the sink's plan creates it before the clustered tasks run")
    keyed = _plan_keys(options, spark_schema, table, clustered=True)
    evolution = _evolution(options, spark_schema, table, keyed)
    if evolution.changed:
        raise OptionError(
            f"table {options.table}: a stream clustered by cluster_by_key cannot change the table's schema (merge_schema) "
            "in the same batch; evolve the table with one unclustered write first"
        )
    _refuse_partition_change(options, table, evolution.schema, "a stream clustered by cluster_by_key")
    return _pinned_plan(table, options, write_id, overwrite=False, sources=_column_sources(options, spark_schema, evolution.schema), keyed=keyed)


@dataclass(frozen=True)
class RoutedTableCheck:
    """What `check_routed_table` found of one table: the table (None: to be created), its
    keys and how the rows change its schema; `plan_routed_table` goes on from it."""

    table: Table | None
    keyed: KeyedPlan | None = None
    evolution: Evolution | None = None


def find_table(options: WriteOptions, clock: RetryClock | None = None) -> Table | None:
    """The table `options` name, None when it does not exist (catalog errors named, as a
    write's own planning names them). `clock`: the operation's (else one of its own)."""
    return resolve_table(options, StructType([]), create=False, clock=clock)


def check_routed_table(
    options: WriteOptions, spark_schema: StructType, table: Table | None, *, create: bool, clustered: bool = False
) -> RoutedTableCheck:
    """Everything `plan_routed_table` refuses, without its side effects (no table created, no
    column added): a routed task checks all of its tables before it changes any. `table`:
    the table as `find_table` found it (None: it does not exist). `clustered`: the rows were
    routed by key shard too (cluster_by_key), their shard column left out of `spark_schema`."""
    _check_input(options, spark_schema, overwrite=False)
    if table is None:
        if not create:
            raise OptionError(f"table {options.table} does not exist and create_tables is false: create it first, or let lakesink create it")
        _check_new_table(options, _new_table_schema(options, spark_schema))
        return RoutedTableCheck(None)
    _check_format_version(options, table)
    keyed = _plan_keys(options, spark_schema, table, clustered=clustered)
    evolution = _evolution(options, spark_schema, table, keyed)
    _refuse_partition_change(options, table, evolution.schema, "a write routed to many tables")
    return RoutedTableCheck(table, keyed, evolution)


def plan_routed_table(
    options: WriteOptions, spark_schema: StructType, write_id: str, *, create: bool, checked: RoutedTableCheck | None = None,
    clustered: bool = False, clock: RetryClock | None = None,
) -> WritePlan:
    """The plan a task of a write routed to many tables (`table_column`) makes for one table
    it met: no driver plan names the tables before the tasks see the rows. A table that does
    not exist is created from these rows (`create`); with `merge_schema` new columns are
    added to the table at once, the evolved schema made current (every task of the batch then
    writes with the one schema the catalog holds). A partition change is refused. `checked`:
    the table as `check_routed_table` just found it (checked here when not given).
    `clustered`: as `check_routed_table` has it. `clock`: the task's (else one of its own, the
    table's planning being one operation)."""
    clock = clock if clock is not None else planning_clock(options)
    if checked is None:
        checked = check_routed_table(options, spark_schema, find_table(options, clock), create=create, clustered=clustered)
    table = checked.table
    if table is not None and checked.evolution is not None and not checked.evolution.changed:
        sources = _column_sources(options, spark_schema, table.schema())
        return _pinned_plan(table, options, write_id, overwrite=False, sources=sources, keyed=checked.keyed)
    if table is None:
        config = loader.catalog_config(options)
        catalog = catalog_call(clock, lambda: loader.load(config), what="opening the catalog", catalog=loader.describe(config))
        # No checkpoint check (resolve_table's): a clustered stream meets new tables as it runs.
        table = create_table(catalog, options, spark_schema, config, clock)
    keyed = _plan_keys(options, spark_schema, table, clustered=clustered)
    evolution = _evolution(options, spark_schema, table, keyed)
    if evolution.changed:
        staged = stage_evolution(table, _stored_columns(options, spark_schema), _key_columns(table, keyed), make_current=True, clock=clock)
        # None: another task of the batch added the columns first; its schema, current now, is ours.
        table = staged.table if staged is not None else find_table(options, clock) or table
    _refuse_partition_change(options, table, table.schema(), "a write routed to many tables")
    sources = _column_sources(options, spark_schema, table.schema())
    return _pinned_plan(table, options, write_id, overwrite=False, sources=sources, keyed=keyed)
