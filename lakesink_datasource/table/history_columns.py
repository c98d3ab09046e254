"""The columns of a history table (`history=true`), planned before anything is written.

Every version of a key is a row with `__start_at` and `__end_at`: the sequence it started and
ended at (one sequence column: its type and values; several: a struct of them, named and
ordered as `sequence_column` gives them), or, without a sequence column, the time of the batch
that made it (timestamptz). A table lakesink creates with `history`
gets both; an existing table must have them (lakesink does not turn a table of current rows
into a history: its rows' starts are unknown).
"""

from __future__ import annotations

import time

from pyiceberg.schema import Schema
from pyspark.sql.types import DataType, StructField, StructType, TimestampType

from lakesink_datasource.options import OptionError, WriteOptions
from lakesink_datasource.table.plan import HistoryPlan

START = "__start_at"
END = "__end_at"


def check_history_options(options: WriteOptions, spark_schema: StructType) -> None:
    """What needs no table: a keyed operation that replaces rows, and no DataFrame column
    of the bounds' names."""
    if not options.history:
        return
    if options.operation not in ("upsert", "cdc"):
        raise OptionError(
            f"option 'history' keeps every version of a key written by operation upsert or cdc, not {options.operation!r}"
        )
    if options.sort_by is not None:
        raise OptionError("option 'history' cannot be given with 'sort_by' yet: a history table's files are written unsorted")
    taken = [f.name for f in spark_schema.fields if f.name.lower() in (START, END)]
    if taken:
        raise OptionError(f"column '{taken[0]}' is a history table's own: rename it in the DataFrame (option 'history')")


def bound_field_type(options: WriteOptions, spark_schema: StructType) -> StructField:
    """The Spark type of the bounds: the sequence column's, a struct of the sequence columns
    when there are several (a version is bounded by the whole position, not by its first
    part), else timestamptz."""
    if options.sequence_column:
        by_name = {f.name.lower(): f for f in spark_schema.fields}
        fields = [by_name.get(c.lower()) for c in options.sequence_column]
        if all(f is not None for f in fields):
            found = [f for f in fields if f is not None]
            kind: DataType = found[0].dataType if len(found) == 1 else StructType([StructField(f.name, f.dataType, True) for f in found])
            return StructField(START, kind, True)
    return StructField(START, TimestampType(), True)


def with_history_columns(options: WriteOptions, spark_schema: StructType) -> StructType:
    """The table columns a history write stores: the DataFrame's and the two bounds."""
    if not options.history:
        return spark_schema
    bound = bound_field_type(options, spark_schema)
    return StructType([*spark_schema.fields, StructField(START, bound.dataType, True), StructField(END, bound.dataType, True)])


def plan_history(
    options: WriteOptions, schema: Schema, key: tuple[str, ...], sequence: tuple[str, ...], identifier: str
) -> HistoryPlan | None:
    """The history plan against the table's schema, or None without `history`."""
    names = {f.name.lower(): f.name for f in schema.fields}
    if not options.history:
        if START in names and END in names and options.operation in ("upsert", "cdc"):
            raise OptionError(
                f"table {identifier} is a history table ({START}, {END}): write it with option history=true, or its "
                "versions would be replaced as plain rows"
            )
        return None
    missing = [c for c in (START, END) if c not in names]
    if missing:
        raise OptionError(
            f"option 'history': table {identifier} has no {', '.join(missing)} column(s); lakesink keeps history in a table it "
            "creates with history=true (a table of current rows has no known starts): write the history to a new table"
        )
    bounds = {names[START], names[END]}
    key_lower = {k.lower() for k in key}
    sequence_lower = {s.lower() for s in sequence}
    data = tuple(f.name for f in schema.fields if f.name not in bounds and f.name.lower() not in key_lower and f.name.lower() not in sequence_lower)
    tracked = data
    partial = False
    given = options.track_history_columns or options.track_history_except_columns
    if given:
        unknown = [c for c in given if c.lower() not in names]
        if unknown:
            option = "track_history_columns" if options.track_history_columns else "track_history_except_columns"
            raise OptionError(f"option '{option}': column '{unknown[0]}' is not in table {identifier} ({', '.join(schema.column_names)})")
        chosen = {c.lower() for c in given}
        if options.track_history_columns:
            tracked = tuple(c for c in data if c.lower() in chosen)
        else:
            tracked = tuple(c for c in data if c.lower() not in chosen)
        partial = tracked != data
    return HistoryPlan(
        start=names[START], end=names[END], tracked=tracked, data=data, partial=partial,
        at=None if options.sequence_column else time.time(),
    )
