"""A task of a write routed to many tables: its rows grouped by table, each table written
as a write of its own (write.task), every table's result in one message.

A table's rows are gathered over the task's whole input first: planning a table (loading
it, creating it, adding columns) happens once per task and table, and the table's payloads
are parsed in one call. The task's input is held in Arrow meanwhile (one Spark partition of
one micro-batch).
"""

from __future__ import annotations

import logging
import pickle
from collections import OrderedDict
from collections.abc import Iterator

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.table import Table
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from lakesink_datasource.debezium.decode import Decoded, DecodedTable, decode
from lakesink_datasource.debezium.envelope import DebeziumInputError
from lakesink_datasource.debezium.failovers import BINLOGS_PROPERTY
from lakesink_datasource.debezium.naming import SOURCE_PROPERTY, check_table_source, source_property
from lakesink_datasource.debezium.options import DEFAULT_PLACEHOLDER
from lakesink_datasource.debezium.positions import POSITION_COLUMN, check_stored
from lakesink_datasource.debezium.records import OP_COLUMN
from lakesink_datasource.index import environment
from lakesink_datasource.index.key_shards import NO_SHARD, SHARD_COLUMN, misclustered_message, text_misclustered
from lakesink_datasource.messages import LakeSinkCommitMessage, RoutedTablesMessage
from lakesink_datasource.options import KEYED_OPERATIONS, WriteOptions
from lakesink_datasource.routing.route_plan import RoutedWrite
from lakesink_datasource.routing.route_rows import RoutedInputError, key_fields, split_by_table, table_rows
from lakesink_datasource.schema.arrow_align import table_arrow_schema
from lakesink_datasource.schema.spark_types import SchemaError
from lakesink_datasource.table import metadata_cache
from lakesink_datasource.table.history_columns import END, START
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import RoutedTableCheck, check_routed_table, find_table, plan_routed_table
from lakesink_datasource.write.task import TaskIdentity, write_task

log = logging.getLogger("lakesink")


def write_routed_task(write: RoutedWrite, batches: Iterator[pa.RecordBatch], who: TaskIdentity | None = None) -> RoutedTablesMessage:
    who = who or TaskIdentity.from_spark()
    # Every table's rows are read and checked before any table is created, changed or written:
    # one table's bad payload or option leaves the others as they were.
    if write.options.debezium is not None:
        incoming, notes = _debezium_tables(write, batches)
    else:
        incoming = _routed_tables(write, batches)
        notes = TaskNotes()
    written: list[tuple[str, bytes, bytes]] = []
    done: list[tuple[WritePlan, LakeSinkCommitMessage]] = []
    try:
        for identifier, (options, rows, checked, read, clustered) in incoming.items():
            plan = plan_routed_table(
                options, _table_columns(rows), write.table_write_id(identifier), create=write.options.create_tables,
                checked=checked, clustered=clustered,
            )
            if read.truncates:
                plan = msgspec.structs.replace(plan, truncated_at=read.truncates[-1], truncates=read.truncates)
            if read.binlogs is not None:
                plan = msgspec.structs.replace(plan, binlogs=read.binlogs)
            opened_before = environment.cached_paths() if plan.keyed is not None else set()
            message = write_task(plan, iter(rows.to_batches()), who)
            if plan.keyed is not None:
                _keep_open(identifier, environment.cached_paths() - opened_before)
            done.append((plan, message))
            # Pickled as Spark ships the plan to tasks: a catalog's config may hold objects (a REST
            # catalog's auth manager) that msgpack cannot encode.
            written.append((identifier, pickle.dumps(plan), message.payload))
    except BaseException:
        _abandon(done)
        raise
    return RoutedTablesMessage(written, notes.skipped, notes.change_logs, notes.truncates, notes.sources)


class SourceRead(msgspec.Struct, frozen=True):
    """What a keyed table's Debezium events say besides its rows."""

    truncates: tuple[bytes, ...] = ()  # the truncates among its events, in order
    binlogs: str | None = None  # MySQL/MariaDB: what its partitions showed (debezium/failovers.py)


NOTHING_READ = SourceRead()
# A table's options, rows, check, what its Debezium events say besides rows, and whether its
# rows carry cluster_by_key's route (a keyed table's task then holds one key shard).
Incoming = dict[str, tuple[WriteOptions, pa.Table, RoutedTableCheck, SourceRead, bool]]


def _routed_tables(write: RoutedWrite, batches: Iterator[pa.RecordBatch]) -> Incoming:
    """Rows routed by `table_column`, per table, parsed and checked."""
    gathered: dict[str, list[pa.Table]] = {}
    for batch in batches:
        if batch.num_rows:
            for identifier, rows in split_by_table(batch, write.options):
                gathered.setdefault(identifier, []).append(rows)
    # Rows cluster_by_key routed by key shard carry their route: each keyed table's task
    # then holds that one shard of the table's keys (write.task reads the route).
    clustered = any(SHARD_COLUMN in rows.column_names for tables in gathered.values() for rows in tables)
    incoming: Incoming = {}
    for identifier in sorted(gathered):
        options = write.options.table_options(identifier)
        received = pa.concat_tables(gathered.pop(identifier))
        if options.operation in KEYED_OPERATIONS and not options.primary_key and write.options.key_column is not None:
            # Debezium's way: the message key names the key columns.
            options = msgspec.structs.replace(options, primary_key=key_fields(received, write.options) or None)
        # One lookup serves both: the payload is parsed by the table's columns, then checked.
        table = find_table(options)
        stored = table_arrow_schema(table.schema()) if table is not None else None
        rows = table_rows(received, write.options, stored if write.options.payload_column else None)
        checked = check_routed_table(options, _table_columns(rows), table, create=write.options.create_tables, clustered=clustered)
        key = checked.keyed.table_key_columns if checked.keyed is not None else options.primary_key  # a new table's: its option's
        if clustered and key and options.operation in KEYED_OPERATIONS:
            _check_clustered_keys(identifier, rows, key, stored)
        incoming[identifier] = options, rows, checked, NOTHING_READ, clustered
    return incoming


class TaskNotes(msgspec.Struct):
    """What a Debezium task read besides its tables' rows, for the batch's progress line."""

    skipped: dict[str, int] = {}  # records that change no table, by kind
    change_logs: list[str] = []  # tables kept as change logs (no key at the source)
    truncates: dict[str, bytes] = {}  # truncates of tables that did not exist yet: their newest position
    sources: dict[str, list[str | None]] = {}  # table -> its source table (default table_name: checked across tasks)


def _debezium_tables(write: RoutedWrite, batches: Iterator[pa.RecordBatch]) -> tuple[Incoming, TaskNotes]:
    """A task's Debezium records decoded into each source table's rows (debezium/decode.py),
    with the options the events decide: its key, its op and order, or a change log."""
    debezium = write.options.debezium
    assert debezium is not None
    parts = [b for b in batches if b.num_rows]
    records = pa.Table.from_batches(parts) if parts else None
    tables: dict[str, Table | None] = {}

    def found(identifier: str) -> Table | None:
        if identifier not in tables:
            tables[identifier] = find_table(write.options.table_options(identifier))
        return tables[identifier]

    def schema_of(identifier: str) -> pa.Schema | None:
        """The columns events of the table may carry, typed as the table stores them: a
        history table's own bounds are not among them."""
        table = found(identifier)
        if table is None:
            return None
        schema = table_arrow_schema(table.schema())
        if START in schema.names and END in schema.names:
            schema = pa.schema([f for f in schema if f.name not in (START, END)], metadata=schema.metadata)
        return schema

    def binlogs(identifier: str) -> str | None:
        table = found(identifier)
        return table.metadata.properties.get(BINLOGS_PROPERTY) if table is not None else None

    decoded = decode(records, debezium, schema_of, keeps_history=write.options.keeps_history, binlogs=binlogs) if records is not None else Decoded()
    incoming: Incoming = {}
    notes = TaskNotes(skipped=decoded.skipped, truncates=decoded.truncates)
    for part in decoded.tables:
        table = found(part.identifier)
        if part.source is not None:
            check_table_source(part.identifier, part.source, table.metadata.properties if table is not None else {})
            notes.sources[part.identifier] = list(part.source)
        keyed = part.keyed
        if table is not None and not table.schema().identifier_field_ids and OP_COLUMN in table.schema().column_names:
            keyed = False  # a change log lakesink made: it stays one
        elif table is not None and table.schema().identifier_field_ids and not keyed:
            raise DebeziumInputError(
                f"table {part.identifier} has a primary key, but its events in this batch carry no message key: was the "
                "source table's primary key dropped? Write its events to another table (option table_name). Nothing was written"
            )
        if table is not None and keyed:
            check_stored(part.identifier, part.connector, _stored_position_parts(table))
        own = write.options.table_options(part.identifier)
        derived = _derived_options(part, keyed, own)
        # A change log appends its events: what only keyed tables take is left out.
        without = () if keyed else ("history", "track_history_columns", "track_history_except_columns", "unavailable_value")
        options = write.options.table_options(part.identifier, derived, without)
        rows = part.rows if keyed or SHARD_COLUMN not in part.rows.column_names else part.rows.drop_columns([SHARD_COLUMN])
        clustered = SHARD_COLUMN in rows.column_names
        try:
            checked = check_routed_table(options, _table_columns(rows), table, create=write.options.create_tables, clustered=clustered)
        except SchemaError as exc:
            hint = (
                ". Iceberg cannot change a decimal's scale: the source column's scale changed, so give its events a table of "
                "their own (option table_name) or change the table first" if _scale_changed(str(exc)) else ""
            )
            raise SchemaError(f"table {part.identifier} (cdc_format=debezium): {exc}{hint}. Nothing was written") from None
        if not keyed:
            notes.change_logs.append(part.identifier)
        elif clustered:
            key = checked.keyed.table_key_columns if checked.keyed is not None else options.primary_key
            if key:
                _check_clustered_keys(part.identifier, rows, key, schema_of(part.identifier))
        read = SourceRead(part.truncates, part.binlogs) if keyed else NOTHING_READ
        incoming[part.identifier] = options, rows, checked, read, clustered
    return incoming, notes


def _scale_changed(problem: str) -> bool:
    """A merge refused for a decimal column whose scale changed (evolution.py's wording): not
    any error that names a decimal (the list of supported types does)."""
    return "table type decimal(" in problem and "cannot become decimal(" in problem


def _stored_position_parts(table: Table) -> list[str] | None:
    """The parts of the source positions a keyed table stores (None: none stored yet)."""
    field = next((f for f in table.schema().fields if f.name == POSITION_COLUMN), None)
    if field is None or not field.field_type.is_struct:
        return None
    return [f.name for f in field.field_type.fields]  # type: ignore[attr-defined]


def _derived_options(part: DecodedTable, keyed: bool, own: WriteOptions) -> dict[str, str]:
    """What a table's events decide: a keyed table is written by key in the order of the
    source's log (its op and position), a table without a key appends its events. A new field
    of the source adds a column (the source changed: no merge_schema needed)."""
    recorded = {f"property.{SOURCE_PROPERTY}": source_property(part.source)} if part.source is not None else {}
    if not keyed:
        return {"operation": "append", "merge_schema": "true", **recorded}
    derived = {"operation": "cdc", "op_column": OP_COLUMN, "sequence_column": POSITION_COLUMN, "merge_schema": "true", **recorded}
    if part.key:
        derived["primary_key"] = ",".join(part.key)
    if own.unavailable_value is None:
        derived["unavailable_value"] = DEFAULT_PLACEHOLDER
    return derived


def _text_key_type(t: pa.DataType) -> bool:
    """A key type whose Arrow text is Spark's JSON text of the value (what a text route hashes)."""
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_boolean(t) or pa.types.is_date32(t)


def _check_clustered_keys(identifier: str, rows: pa.Table, key: tuple[str, ...], table_schema: pa.Schema | None) -> None:
    """Refuse, before any table is created or changed, rows cluster_by_key routed by a key
    text their table would spell otherwise: a key type whose text may differ, or a row
    whose key, in the table's types, hashes to another shard (the keyed writer checks the
    rows again as it writes them, which is the check the index relies on)."""
    names = {n.lower(): n for n in rows.column_names}
    ordered = sorted(key, key=str.lower)
    if any(k.lower() not in names for k in ordered):
        return  # a missing key column: the table's check names it
    routes = rows.column(SHARD_COLUMN)
    if pc.any(pc.equal(routes, NO_SHARD)).as_py():
        raise RoutedInputError(
            f"table {identifier}: rows routed by cluster_by_key carry no key: give every row its key in option 'key_column', "
            f"or the table's key in 'primary_key' (or 'tables.{identifier}.primary_key'). Nothing was written"
        )
    stored = {f.name.lower(): f.type for f in table_schema} if table_schema is not None else {}
    columns = []
    for k in ordered:
        column = rows.column(names[k.lower()])
        target = stored.get(k.lower(), column.type)
        if not _text_key_type(target):
            raise RoutedInputError(
                f"table {identifier}: key column '{k}' is {target}: cluster_by_key routes the keys of many tables by their "
                "JSON text, which is the table's own text of a key only for integer, string, boolean and date keys; write "
                "this table without cluster_by_key. Nothing was written"
            )
        try:
            columns.append(column.cast(target))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return  # a value the table's type cannot hold: the table's own check names it
    wrong = text_misclustered(routes, columns)
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        example = {k: rows.column(names[k.lower()])[row].as_py() for k in ordered}
        types = ", ".join(f"{k} {rows.schema.field(names[k.lower()]).type}" for k in ordered)
        raise RoutedInputError(misclustered_message(identifier, int(wrong.sum()), example, types))


def _table_columns(rows: pa.Table) -> StructType:
    """A table's rows as the columns its write plans with: cluster_by_key's route is never
    stored."""
    # A timestamp without a zone stays one (PySpark 4.0 defaults to an instant, 4.1+ does not).
    schema = from_arrow_schema(rows.schema, prefer_timestamp_ntz=True)
    return StructType([f for f in schema.fields if f.name != SHARD_COLUMN])


# Key indexes of this many tables stay open in a process writing many tables (the least
# recently written are closed; their files stay, and reopen when a batch needs them again).
KEEP_OPEN_TABLES = 16
_open_indexes: OrderedDict[str, set[str]] = OrderedDict()


def _keep_open(identifier: str, opened: set[str]) -> None:
    held = _open_indexes.pop(identifier, set()) | opened
    _open_indexes[identifier] = held
    while len(_open_indexes) > KEEP_OPEN_TABLES:
        _, paths = _open_indexes.popitem(last=False)
        environment.close_cached(paths)


def _abandon(done: list[tuple[WritePlan, LakeSinkCommitMessage]]) -> None:
    """The task failed after writing some tables: their files will never be committed (the
    task's next attempt writes its own); the key index's changes are undone like a lost
    task's, when the next batch finds their attempt was not committed."""
    for plan, message in done:
        io = None
        result = message.result()
        # The task's result never reaches the driver, so a compaction it carried cannot land either.
        for path in [*result.written_files(), *result.compacted_files()]:
            try:
                if io is None:
                    io = metadata_cache.file_io(plan.io_properties, plan.metadata_location)
                io.delete(path)
            except Exception:  # best effort: an orphan, which orphan removal takes later
                log.warning("could not delete %s of a failed routed task", path, exc_info=True)
