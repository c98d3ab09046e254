"""Where a change sits in its source database's log: the order lakesink applies a key's
changes in, per connector.

Each connector writes its own position into `source`:
- PostgreSQL: `lsn`, and `sequence` (the text `["<last committed lsn>", "<lsn>"]`): by lsn,
  then the last committed transaction's lsn;
- MySQL and MariaDB: the binlog `file` (`mysql-bin.000003`: its number counts), `pos`, `row`
  (`pos` starts low again in each new file, and rows of one statement share it);
- SQL Server: `change_lsn`, `commit_lsn` (fixed-width hex text, so text order is log order;
  null during a snapshot) and `event_serial_no`;
- Oracle: `scn`, `commit_scn` (decimal text: compared as numbers).
The Kafka partition offset comes last: events re-sent after a connector restart keep their
position and come again later, and a snapshot's rows share one position.

A position is one struct column, `__source_position`, stored in the table (a rebuilt key index
takes each live row's position from it) and given to the keyed write as its sequence. A
missing part sorts first (-1, or empty text): a snapshot row has no `change_lsn`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.debezium.connect_schema import DebeziumSchemaError
from lakesink_datasource.debezium.envelope import Source

POSITION_COLUMN = "__source_position"
KAFKA_OFFSET = "kafka_offset"
_SCN = pa.decimal128(38, 0)


def _numbers(values: pa.Array, kind: pa.DataType, what: str) -> pa.Array:
    """Numbers as the connector writes them (JSON numbers, or digits as text), -1 for none."""
    if pa.types.is_null(values.type):
        return pa.repeat(pa.scalar(-1, kind), len(values))
    try:
        array = values.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bad = next(v for v in values.to_pylist() if v is not None and not str(v).lstrip("-").isdigit())
        raise DebeziumSchemaError(f"source.{what} {bad!r} is not a number") from None
    return pc.fill_null(array, pa.scalar(-1, kind))


def _texts(values: pa.Array) -> pa.Array:
    return pc.fill_null(values.cast(pa.string()), "")


def _number_in(values: pa.Array, pattern: str, what: str) -> pa.Array:
    """The number a text holds where `pattern` (its group `n`) finds it; -1 for none."""
    texts = values.cast(pa.string())
    found = pc.extract_regex(texts, pattern)  # null where the pattern does not match
    digits = found.field("n")
    # A group that took no part in the match reads as empty text.
    digits = pc.if_else(pc.equal(digits, ""), pa.scalar(None, pa.string()), digits)
    missing = pc.and_(texts.is_valid(), found.is_null())
    if pc.any(missing).as_py():
        bad = texts.filter(missing)[0].as_py()
        raise DebeziumSchemaError(f"source.{what} {bad!r} holds no number where lakesink expects one")
    return pc.fill_null(digits.cast(pa.int64()), -1)


# A source field's values as one column (null where absent).
Field = Callable[[str], pa.Array]
Part = tuple[str, pa.DataType, Callable[[Field], pa.Array]]
# connector -> the position's parts: (name, type, the part's column from the sources' fields)
_CONNECTORS: dict[str, tuple[Part, ...]] = {
    "postgresql": (
        ("lsn", pa.int64(), lambda f: _numbers(f("lsn"), pa.int64(), "lsn")),
        # source.sequence is the text ["<last committed lsn>", "<lsn>"]
        ("last_commit_lsn", pa.int64(), lambda f: _number_in(f("sequence"), r'^\[\s*"?(?P<n>-?\d+)|^\[\s*(?P<n2>null)', "sequence")),
    ),
    "mysql": (
        # mysql-bin.000003 -> 3: binlog files are numbered in the order MySQL writes them
        ("file_number", pa.int64(), lambda f: _number_in(f("file"), r"(?P<n>\d+)$", "file")),
        ("pos", pa.int64(), lambda f: _numbers(f("pos"), pa.int64(), "pos")),
        ("row", pa.int64(), lambda f: _numbers(f("row"), pa.int64(), "row")),
    ),
    "sqlserver": (
        ("change_lsn", pa.string(), lambda f: _texts(f("change_lsn"))),
        ("commit_lsn", pa.string(), lambda f: _texts(f("commit_lsn"))),
        ("event_serial_no", pa.int64(), lambda f: _numbers(f("event_serial_no"), pa.int64(), "event_serial_no")),
    ),
    "oracle": (
        ("scn", _SCN, lambda f: _numbers(f("scn"), _SCN, "scn")),
        ("commit_scn", _SCN, lambda f: _numbers(f("commit_scn"), _SCN, "commit_scn")),
    ),
}
_CONNECTORS["mariadb"] = _CONNECTORS["mysql"]
CONNECTORS = tuple(sorted(_CONNECTORS))
# The source fields a position reads, per connector, in their JSON form (Arrow's JSON reader
# reads them with these types; a value of another form sends the record the slow way).
SOURCE_FIELDS: dict[str, dict[str, pa.DataType]] = {
    "postgresql": {"lsn": pa.int64(), "sequence": pa.string()},
    "mysql": {"file": pa.string(), "pos": pa.int64(), "row": pa.int64()},
    "mariadb": {"file": pa.string(), "pos": pa.int64(), "row": pa.int64()},
    "sqlserver": {"change_lsn": pa.string(), "commit_lsn": pa.string(), "event_serial_no": pa.int64()},
    "oracle": {"scn": pa.string(), "commit_scn": pa.string()},
}


def parts_of(connector: str | None) -> tuple[Part, ...]:
    parts = _CONNECTORS.get((connector or "").lower())
    if parts is None:
        raise DebeziumSchemaError(
            f"source.connector {connector!r}: lakesink orders the changes of Debezium's {', '.join(CONNECTORS)} connectors "
            "(by each one's log position); write other connectors' events with operation=cdc and your own sequence_column"
        )
    return parts


def position_type(connector: str | None, with_offset: bool) -> pa.StructType:
    fields = [pa.field(name, kind) for name, kind, _ in parts_of(connector)]
    if with_offset:
        fields.append(pa.field(KAFKA_OFFSET, pa.int64()))
    return pa.struct(fields)


def positions(connector: str | None, sources: Sequence[Source], offsets: Sequence[int | None] | None) -> pa.StructArray:
    """Each record's position, from its `source` (and Kafka offset, when the input has one)."""

    def field(name: str) -> pa.Array:
        values = [getattr(s, name) for s in sources]
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return pa.array([None if v is None else str(v) for v in values], pa.string())

    return positions_of(connector, field, len(sources), pa.array(offsets, pa.int64()) if offsets is not None else None)


def positions_of(connector: str | None, field: Field, n: int, offsets: pa.Array | None) -> pa.StructArray:
    """Positions from the sources' fields as columns (`field`), and the Kafka offsets."""
    parts = parts_of(connector)
    arrays = [column(field) for _, _, column in parts]
    if offsets is not None:
        arrays.append(pc.fill_null(offsets.cast(pa.int64()), -1))
    if not arrays[0].__len__() == n:
        raise AssertionError("a position part of another length")
    return pa.StructArray.from_arrays(arrays, fields=list(position_type(connector, offsets is not None)))
