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
from typing import Any

import msgspec
import pyarrow as pa

from lakesink_datasource.debezium.connect_schema import DebeziumSchemaError

POSITION_COLUMN = "__source_position"
KAFKA_OFFSET = "kafka_offset"
_SCN = pa.decimal128(38, 0)


def _int(value: Any) -> int:
    if value is None:
        return -1
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DebeziumSchemaError(f"source position part {value!r} is not a number") from None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _binlog_number(name: Any) -> int:
    """`mysql-bin.000003` -> 3 (files are numbered in the order MySQL writes them)."""
    if name is None:
        return -1
    digits = str(name).rsplit(".", 1)[-1]
    if not digits.isdigit():
        raise DebeziumSchemaError(f"binlog file name {name!r} does not end in a number")
    return int(digits)


def _last_committed(sequence: Any) -> int:
    if sequence is None:
        return -1
    try:
        parts = msgspec.json.decode(sequence) if isinstance(sequence, (str, bytes)) else sequence
    except msgspec.DecodeError:
        raise DebeziumSchemaError(f"PostgreSQL source.sequence {sequence!r} is not a JSON array") from None
    return _int(parts[0]) if parts else -1


Part = tuple[str, pa.DataType, Callable[[Any], Any]]
# connector -> the position's parts: (name, type, getter from the source mapping)
_CONNECTORS: dict[str, tuple[Part, ...]] = {
    "postgresql": (
        ("lsn", pa.int64(), lambda s: _int(s.get("lsn"))),
        ("last_commit_lsn", pa.int64(), lambda s: _last_committed(s.get("sequence"))),
    ),
    "mysql": (
        ("file_number", pa.int64(), lambda s: _binlog_number(s.get("file"))),
        ("pos", pa.int64(), lambda s: _int(s.get("pos"))),
        ("row", pa.int64(), lambda s: _int(s.get("row"))),
    ),
    "sqlserver": (
        ("change_lsn", pa.string(), lambda s: _text(s.get("change_lsn"))),
        ("commit_lsn", pa.string(), lambda s: _text(s.get("commit_lsn"))),
        ("event_serial_no", pa.int64(), lambda s: _int(s.get("event_serial_no"))),
    ),
    "oracle": (
        ("scn", _SCN, lambda s: _int(s.get("scn"))),
        ("commit_scn", _SCN, lambda s: _int(s.get("commit_scn"))),
    ),
}
_CONNECTORS["mariadb"] = _CONNECTORS["mysql"]
CONNECTORS = tuple(sorted(_CONNECTORS))


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


def positions(connector: str | None, sources: Sequence[dict[str, Any]], offsets: Sequence[int | None] | None) -> pa.StructArray:
    """Each record's position, from its `source` (and Kafka offset, when the input has one)."""
    parts = parts_of(connector)
    arrays = [pa.array([get(s) for s in sources], kind) for _, kind, get in parts]
    names = [name for name, _, _ in parts]
    if offsets is not None:
        arrays.append(pa.array([-1 if o is None else o for o in offsets], pa.int64()))
        names.append(KAFKA_OFFSET)
    return pa.StructArray.from_arrays(arrays, fields=list(position_type(connector, offsets is not None)))
