"""Row filters in Iceberg's expression syntax (`replace_where`): parse, check rows, place files.

A filter is parsed with pyiceberg's parser and bound to the table schema (names matched
case-insensitively, as Spark matches them). A row matches when the filter is true for it; a
row for which it is false or unknown (a null) does not, as in SQL's WHERE and Delta's
`replaceWhere`.

A data file is placed with what the table already knows before any row is read: its
partition (strict and inclusive projections through the spec) and its column bounds (strict
and inclusive metrics). Only a file that may hold both kinds of rows is read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import (
    _InclusiveMetricsEvaluator,
    _StrictMetricsEvaluator,
    bind,
    expression_evaluator,
    extract_field_ids,
    inclusive_projection,
    strict_projection,
)
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import expression_to_pyarrow, schema_to_pyarrow
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyparsing import ParseBaseException
from pyroaring import BitMap64

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.row_lineage import field_ids


class FilterError(LakesinkError, ValueError):
    """A filter that does not parse or names a column the table lacks."""


class Placement(Enum):
    ALL = "all"  # every row of the file matches
    NONE = "none"  # no row does
    SOME = "some"  # the file must be read to tell


@dataclass(frozen=True)
class RowFilter:
    """A parsed filter: bound to the schema for evaluating rows, unbound for pyiceberg's
    projections and metrics evaluators (which bind it themselves)."""

    text: str
    unbound: BooleanExpression
    bound: BooleanExpression
    schema: Schema


def parse_filter(text: str, schema: Schema) -> RowFilter:
    """The filter, checked against `schema`; FilterError saying what is wrong. Spark SQL's
    typed literals (`DATE '2026-11-01'`, `TIMESTAMP '...'`, `5L`), which Delta's
    replaceWhere takes, are read as the plain literals Iceberg's syntax has (the column's
    type decides what they mean)."""
    try:
        unbound = parse(_plain_literals(text))
    except (ParseBaseException, ValueError):
        raise FilterError(
            f"cannot parse {text!r} as a filter{_first_bad_part(text)}; write e.g. \"day = '2024-01-01'\" or "
            "\"region IN ('eu', 'us') AND id >= 100\""
        ) from None
    try:
        return RowFilter(text, unbound, bind(schema, unbound, case_sensitive=False), schema)
    except ValueError as exc:
        columns = ", ".join(f.name for f in schema.fields)
        reason = str(exc).replace(", case_sensitive=False", "")
        raise FilterError(f"filter {text!r}: {reason} (the table's columns: {columns})") from None


# Outside quoted strings: a Spark SQL type keyword before a quoted literal, and integer
# suffixes (bigint, smallint, tinyint, double, decimal).
_TYPED_LITERAL = re.compile(r"\b(?:DATE|TIMESTAMP|TIMESTAMP_NTZ|TIMESTAMP_LTZ)\s*$", re.IGNORECASE)
_NUMBER_SUFFIX = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:L|S|Y|D|BD)\b", re.IGNORECASE)
_QUOTED = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")")


def _plain_literals(text: str) -> str:
    parts = _QUOTED.split(text)  # odd indices are quoted strings: left alone
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = _NUMBER_SUFFIX.sub(r"\1", part)
            typed = _TYPED_LITERAL.search(part) if i + 1 < len(parts) and parts[i + 1].startswith("'") else None
            if typed is not None:
                part = part[: typed.start()]  # the keyword right before a quoted literal
                if typed.group(0).strip().upper().startswith("TIMESTAMP"):
                    # Spark writes '2026-11-01 00:00:00'; Iceberg's literals are ISO-8601.
                    parts[i + 1] = re.sub(r"^'(\d{4}-\d{2}-\d{2}) ", r"'\1T", parts[i + 1])
                    parts[i + 1] = re.sub(r"^'(\d{4}-\d{2}-\d{2})'$", r"'\1T00:00:00'", parts[i + 1])
        out.append(part)
    return "".join(out)


_CONNECTIVE = re.compile(r"\b(?:AND|OR)\b", re.IGNORECASE)


def _first_bad_part(text: str) -> str:
    """Where the filter goes wrong: the first of its AND/OR parts (outside quotes and
    parentheses) that does not parse alone. pyparsing itself reports the start of the whole
    expression for most mistakes."""
    depth, start, quoted = 0, 0, ""
    bounds = []
    i = 0
    while i < len(text):
        c = text[i]
        if quoted:
            quoted = "" if c == quoted else quoted
        elif c in "'\"":
            quoted = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth == 0 and (m := _CONNECTIVE.match(text, i)) and (i == 0 or not text[i - 1].isalnum()):
            bounds.append((start, i))
            start = i = m.end()
            continue
        i += 1
    bounds.append((start, len(text)))
    for begin, end in bounds:
        part = text[begin:end].strip()
        try:
            parse(_plain_literals(part.strip("()") if part.startswith("(") and part.endswith(")") else part))
        except (ParseBaseException, ValueError):
            offset = begin + (len(text[begin:end]) - len(text[begin:end].lstrip()))
            return f": {part!r} (at character {offset + 1}) is not a comparison it knows"
    return ""


def filter_columns(row_filter: RowFilter) -> list[str]:
    """Top-level table columns the filter reads."""
    ids = extract_field_ids(row_filter.bound)
    return [f.name for f in row_filter.schema.fields if f.field_id in ids]


def matches(row_filter: RowFilter, rows: pa.Table) -> np.ndarray:
    """Per row: does the filter hold? `rows` has the table's column names."""
    expression, schema = row_filter.bound, row_filter.schema
    if isinstance(expression, AlwaysTrue):
        return np.ones(rows.num_rows, dtype=bool)
    if isinstance(expression, AlwaysFalse):
        return np.zeros(rows.num_rows, dtype=bool)
    # Arrow filters with a compute expression (dropping false and null); the positions of
    # the rows it keeps make the mask.
    indexed = rows.append_column(_POSITION, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    kept = indexed.filter(expression_to_pyarrow(expression, schema)).column(_POSITION)
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[np.asarray(kept.to_numpy(), dtype=np.int64)] = True
    return mask


_POSITION = "__lakesink_position"


def placer(row_filter: RowFilter, spec: PartitionSpec) -> Callable[[DataFile], Placement]:
    """Where a data file of `spec` stands against the filter, from its partition and column
    bounds. The projections and evaluators are built once per spec, not per file."""
    expression, schema = row_filter.unbound, row_filter.schema
    if isinstance(expression, AlwaysTrue):
        return lambda _: Placement.ALL
    if isinstance(expression, AlwaysFalse):
        return lambda _: Placement.NONE
    may_partition = surely_partition = None
    if spec.fields:
        partition = Schema(*spec.partition_type(schema).fields)
        may_partition = expression_evaluator(partition, inclusive_projection(schema, spec, case_sensitive=False)(expression), case_sensitive=False)
        surely_partition = expression_evaluator(partition, strict_projection(schema, spec, case_sensitive=False)(expression), case_sensitive=False)
    may_rows = _InclusiveMetricsEvaluator(schema, expression, case_sensitive=False)
    surely_rows = _StrictMetricsEvaluator(schema, expression, case_sensitive=False)

    def place(data_file: DataFile) -> Placement:
        if may_partition is not None and not may_partition(data_file.partition):
            return Placement.NONE
        if surely_partition is not None and surely_partition(data_file.partition):
            return Placement.ALL
        if not may_rows.eval(data_file):
            return Placement.NONE
        if surely_rows.eval(data_file):
            return Placement.ALL
        return Placement.SOME

    return place


def matching_positions(io: FileIO, path: str, row_filter: RowFilter) -> BitMap64:
    """Positions of the rows of data file `path` the filter matches (hidden rows included:
    hiding one twice changes nothing)."""
    schema = row_filter.schema
    needed = set(filter_columns(row_filter))
    wanted = {f.field_id: f.name for f in schema.fields if f.name in needed}
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        by_id = field_ids(parquet.schema_arrow)
        names = parquet.schema_arrow.names
        columns = {wanted[i]: names[c] for i, c in by_id.items() if i in wanted}
        read = parquet.read(columns=list(columns.values()))
    arrays = {table_name: read.column(file_name) for table_name, file_name in columns.items()}
    arrow_types = schema_to_pyarrow(schema)
    for name in wanted.values():
        if name not in arrays:  # a column added after the file was written reads as null
            arrays[name] = pa.nulls(read.num_rows, type=arrow_types.field(name).type)
    hit = matches(row_filter, pa.table(arrays))
    return BitMap64(np.flatnonzero(hit).astype(np.uint64))
