"""A routed write's rows, per table: grouped by the table column, each table's payload
turned into its columns.

Grouping is one dictionary encoding and one stable sort of the batch, whatever the number of
tables. A JSON payload is parsed by Arrow's JSON reader, all of a table's rows at once,
against the table's own Arrow schema where it has one (so a column keeps its type whatever
the JSON spells, and a field the table lacks is inferred: a new column, added with
`merge_schema`); a struct payload's fields are its columns; a map's keys are.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.routing.route_options import RoutingOptions


class RoutedInputError(LakesinkError, ValueError):
    """A row of a routed write names no table, or its payload cannot be read."""


def split_by_table(batch: pa.RecordBatch | pa.Table, options: RoutingOptions) -> list[tuple[str, pa.Table]]:
    """The batch's rows per table (`namespace.table`), in their input order, without the
    table column."""
    table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
    names = table.column(options.table_column).combine_chunks()
    if names.null_count:
        raise RoutedInputError(
            f"column '{options.table_column}' has {names.null_count} null table name(s): every row must name its table"
        )
    encoded = pc.dictionary_encode(names.cast(pa.string()))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    rest = table.drop_columns([options.table_column])
    if len(encoded.dictionary) == 1:
        return [(options.identifier(encoded.dictionary[0].as_py()), rest)]
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=len(encoded.dictionary))
    grouped = rest.take(pa.array(order))
    out = []
    start = 0
    for code, count in enumerate(counts.tolist()):
        if count:
            out.append((options.identifier(encoded.dictionary[code].as_py()), grouped.slice(start, count)))
        start += count
    return out


def table_rows(rows: pa.Table, options: RoutingOptions, table_schema: pa.Schema | None) -> pa.Table:
    """One table's rows as the table's columns: the payload's, then the shared top-level
    columns (op, sequence: every column but the payload). Without a payload column the rows
    are already the table's."""
    if options.payload_column is None:
        return rows
    column = options.payload_column
    parsed = _columns(rows.column(column).combine_chunks(), column, "payload_column", table_schema)
    shared = rows.drop_columns([column])
    if options.key_column is not None:
        # The key's fields are the row's key, whatever the payload says (a delete's payload
        # is often null: Debezium puts the deleted row's key in the message key only).
        key = _key_columns(rows, options.key_column, table_schema)
        parsed = parsed.drop_columns([n for n in key.column_names if n in parsed.column_names])
        for i, name in enumerate(key.column_names):
            parsed = parsed.add_column(i, key.schema.field(name), key.column(name))
        shared = shared.drop_columns([options.key_column])
    # A field that is null in every row of a table it is new to has no type to add it with:
    # left out until a row gives it a value (a column the table has is typed by its schema).
    untyped = [f.name for f in parsed.schema if pa.types.is_null(f.type)]
    if untyped:
        parsed = parsed.drop_columns(untyped)
    if parsed.num_rows != rows.num_rows:
        raise RoutedInputError(f"column '{column}': {rows.num_rows} payloads gave {parsed.num_rows} rows (one JSON object each)")
    clashing = [name for name in shared.column_names if name in parsed.column_names]
    if clashing:
        parsed = parsed.drop_columns(clashing)  # the shared top-level column wins (op, sequence)
    for name in shared.column_names:
        parsed = parsed.append_column(shared.schema.field(name), shared.column(name))
    return parsed


def key_fields(rows: pa.Table, options: RoutingOptions) -> tuple[str, ...]:
    """The key column's field names (a keyed table lakesink creates takes them as its key)."""
    if options.key_column is None:
        return ()
    return tuple(_key_columns(rows, options.key_column, None).column_names)


def _key_columns(rows: pa.Table, column: str, table_schema: pa.Schema | None) -> pa.Table:
    """The fields the key column's objects hold, in the table's types where it has them (parsed
    without the table's schema, which would add every other column, null)."""
    key = _columns(rows.column(column).combine_chunks(), column, "key_column", None)
    key = key.drop_columns([f.name for f in key.schema if pa.types.is_null(f.type)])
    if table_schema is None:
        return key
    for i, name in enumerate(key.column_names):
        if name in table_schema.names and key.schema.field(name).type != table_schema.field(name).type:
            key = key.set_column(i, name, key.column(name).cast(table_schema.field(name).type))
    return key


def _columns(values: pa.Array, column: str, role: str, table_schema: pa.Schema | None) -> pa.Table:
    """A JSON string, struct or map column as the columns its objects hold."""
    if pa.types.is_struct(values.type):
        return pa.Table.from_arrays(values.flatten(), names=[f.name for f in values.type])
    if pa.types.is_map(values.type):
        return pa.Table.from_pylist([dict(m) if m is not None else {} for m in values.to_pylist()])
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return _parse_json(values, column, role, table_schema)
    raise RoutedInputError(f"column '{column}' ({role}) is {values.type}: give a JSON string, a struct or a map")


def _parse_json(payload: pa.Array, column: str, role: str, table_schema: pa.Schema | None) -> pa.Table:
    # A null payload is a row of nulls (a delete that carries its key in shared columns).
    texts = pc.fill_null(payload, "{}").to_pylist()
    blob = "\n".join(texts).encode()
    explicit = _json_schema(table_schema) if table_schema is not None else None
    parse = pa_json.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="infer", newlines_in_values=True)
    try:
        parsed = pa_json.read_json(io.BytesIO(blob), parse_options=parse)
    except pa.ArrowInvalid as exc:
        raise RoutedInputError(f"column '{column}' ({role}) holds a value that is not a JSON object: {exc}") from None
    return parsed


def _json_schema(schema: pa.Schema) -> pa.Schema:
    """The table's columns as Arrow's JSON reader can fill them (it parses timestamps with a
    time zone into UTC, and reads every integer and float width)."""
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])
