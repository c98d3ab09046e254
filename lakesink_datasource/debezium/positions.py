"""Where a change sits in its source database's history: the order lakesink applies a key's
changes in, per connector, as the connector itself orders them.

Debezium sends a database's changes in commit order. A change's own log position is not
monotonic in that order (transactions interleave in the log; a transaction in flight while
the snapshot ran has changes below the snapshot's position and is sent after it), so each
connector's position is read commit first:
- PostgreSQL: `source.sequence` is the text `["<last commit LSN>", "<LSN>"]` (the commit
  LSN of the transaction sent before this change's, then the change's own WAL position):
  last commit LSN, then whether the change is streamed, then `lsn`. A snapshot read carries
  the snapshot's LSN and the last commit LSN streaming resumes from, the same as the first
  streamed transaction after it; it is ordered before that transaction, whose changes may sit
  below the snapshot's LSN;
- Oracle: `commit_scn` (the transaction's commit SCN; a snapshot row has none and is placed
  at its `scn`, the snapshot's SCN), then whether streamed, then `scn` (decimal text);
- SQL Server: `commit_lsn`, `change_lsn`, `event_serial_no`, as Debezium's own
  `TxLogPosition.compareTo` (a snapshot row has no `change_lsn`, which sorts first; LSNs are
  fixed-width hex text, so text order is log order);
- MySQL and MariaDB: the failovers the Kafka partition showed before the change
  (failovers.py: another server's binlog positions are its own), the binlog's `file` number
  (`mysql-bin.000003`), `pos`, whether streamed, `row` (the binlog is in commit order; `pos`
  restarts in each new file; rows of one statement share `pos`). A snapshot row carries the
  binlog position the snapshot began at (Flink CDC's snapshot rows: an empty `file` and
  `pos` 0, ordered first).
"Streamed" is 0 for a snapshot read (op `r`, `snapshot` other than `incremental`), 1 for
anything else: an incremental snapshot's reads carry the streaming position they were sent at.

The Kafka offset is no part of it: a connector restart re-sends events with their positions
at new offsets, and such a copy is at (not above) the key's stored position, so it is dropped
as stale. A position is one struct column, `__source_position`, stored in the table (a rebuilt
key index takes each live row's position from it) and given to the keyed write as its
sequence; structs compare field by field. Positions are comparable within one source log
only (and MySQL's across the failovers its events show): see docs/limits.md (a re-snapshot
by a connector that lost its offsets).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.debezium.connect_schema import DebeziumSchemaError
from lakesink_datasource.debezium.envelope import Source

POSITION_COLUMN = "__source_position"
STREAMED = "streamed"
FAILOVERS = "failovers"  # MySQL/MariaDB: failovers the partition showed before the change (failovers.py)
GTID = "gtid"  # read with a MySQL/MariaDB position to count failovers, never stored
_SCN = pa.decimal128(38, 0)
SNAPSHOT_READ = "r"
_INT64 = (-(2**63), 2**63 - 1)


def _numbers(values: pa.Array, kind: pa.DataType, what: str) -> pa.Array:
    """Numbers as the connector writes them (JSON numbers, or digits as text), -1 for none."""
    if pa.types.is_null(values.type):
        return pa.repeat(pa.scalar(-1, kind), len(values))
    try:
        array = values.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bad = next((v for v in values.to_pylist() if v is not None and not str(v).lstrip("-").isdigit()), None)
        if bad is not None or kind != pa.int64():
            raise DebeziumSchemaError(f"source.{what} {bad!r} is not a number") from None
        # Flink CDC's PostgreSQL snapshot writes Long.MIN_VALUE through a double
        # (-9223372036854776000): beyond int64, it is int64's end.
        array = pa.array([None if v is None else min(max(int(v), _INT64[0]), _INT64[1]) for v in values.to_pylist()], kind)
    return pc.fill_null(array, pa.scalar(-1, kind))


def _texts(values: pa.Array) -> pa.Array:
    return pc.fill_null(values.cast(pa.string()), "")


def _number_in(values: pa.Array, pattern: str, what: str) -> pa.Array:
    """The number a text holds where `pattern` (its group `n`) finds it; -1 for none (and for
    empty text: Flink CDC's snapshot rows name no binlog file)."""
    texts = values.cast(pa.string())
    texts = pc.if_else(pc.equal(texts, ""), pa.scalar(None, pa.string()), texts)
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
# The position's part from the sources' fields and whether each event is streamed (bool array).
Column = Callable[[Field, pa.Array], pa.Array]
Part = tuple[str, pa.DataType, Column]


def _streamed(_f: Field, streamed: pa.Array) -> pa.Array:
    return streamed.cast(pa.int32())


def _oracle_commit_or_scn(f: Field, _streamed: pa.Array) -> pa.Array:
    # A snapshot row has no commit SCN: it sits at its `scn`, the snapshot's SCN.
    commit = _numbers(f("commit_scn"), _SCN, "commit_scn")
    return pc.if_else(pc.equal(commit, pa.scalar(-1, _SCN)), _numbers(f("scn"), _SCN, "scn"), commit)


_CONNECTORS: dict[str, tuple[Part, ...]] = {
    "postgresql": (
        # source.sequence is the text ["<last commit lsn>", "<lsn>"]
        ("last_commit_lsn", pa.int64(), lambda f, s: _number_in(f("sequence"), r'^\[\s*"?(?P<n>-?\d+)|^\[\s*(?P<n2>null)', "sequence")),
        (STREAMED, pa.int32(), _streamed),
        ("lsn", pa.int64(), lambda f, s: _numbers(f("lsn"), pa.int64(), "lsn")),
    ),
    "mysql": (
        # Counted once the table's changes are together (failovers.py); 0 until then.
        (FAILOVERS, pa.int32(), lambda f, s: pa.repeat(pa.scalar(0, pa.int32()), len(s))),
        # mysql-bin.000003 -> 3: binlog files are numbered in the order MySQL writes them
        ("file_number", pa.int64(), lambda f, s: _number_in(f("file"), r"(?P<n>\d+)$", "file")),
        ("pos", pa.int64(), lambda f, s: _numbers(f("pos"), pa.int64(), "pos")),
        (STREAMED, pa.int32(), _streamed),
        ("row", pa.int64(), lambda f, s: _numbers(f("row"), pa.int64(), "row")),
        (GTID, pa.string(), lambda f, s: _texts(f("gtid"))),  # "": none
    ),
    "sqlserver": (
        ("commit_lsn", pa.string(), lambda f, s: _texts(f("commit_lsn"))),
        ("change_lsn", pa.string(), lambda f, s: _texts(f("change_lsn"))),
        ("event_serial_no", pa.int64(), lambda f, s: _numbers(f("event_serial_no"), pa.int64(), "event_serial_no")),
    ),
    "oracle": (
        ("commit_scn", _SCN, _oracle_commit_or_scn),
        (STREAMED, pa.int32(), _streamed),
        ("scn", _SCN, lambda f, s: _numbers(f("scn"), _SCN, "scn")),
    ),
}
_CONNECTORS["mariadb"] = _CONNECTORS["mysql"]
CONNECTORS = tuple(sorted(_CONNECTORS))
# The source fields a position reads, per connector, in their JSON form (Arrow's JSON reader
# reads them with these types; a value of another form sends the record the slow way).
SOURCE_FIELDS: dict[str, dict[str, pa.DataType]] = {
    "postgresql": {"lsn": pa.int64(), "sequence": pa.string(), "snapshot": pa.string()},
    "mysql": {"file": pa.string(), "pos": pa.int64(), "row": pa.int64(), "snapshot": pa.string(), "gtid": pa.string()},
    "mariadb": {"file": pa.string(), "pos": pa.int64(), "row": pa.int64(), "snapshot": pa.string(), "gtid": pa.string()},
    "sqlserver": {"change_lsn": pa.string(), "commit_lsn": pa.string(), "event_serial_no": pa.int64()},
    "oracle": {"scn": pa.string(), "commit_scn": pa.string(), "snapshot": pa.string()},
}


def parts_of(connector: str | None) -> tuple[Part, ...]:
    parts = _CONNECTORS.get((connector or "").lower())
    if parts is None:
        raise DebeziumSchemaError(
            f"source.connector {connector!r}: lakesink orders the changes of Debezium's {', '.join(CONNECTORS)} connectors "
            "(by each one's log position); write other connectors' events with operation=cdc and your own sequence_column"
        )
    return parts


def position_type(connector: str | None) -> pa.StructType:
    return pa.struct([pa.field(name, kind) for name, kind, _ in parts_of(connector)])


def stored_parts(connector: str | None) -> list[str]:
    """The parts of a position as a table stores them."""
    return [name for name, _, _ in parts_of(connector) if name != GTID]


# A MySQL/MariaDB table an earlier lakesink made counts no failovers: its positions stay so.
WITHOUT_FAILOVERS = ["file_number", "pos", STREAMED, "row"]


def check_stored(identifier: str, connector: str | None, stored: Sequence[str] | None) -> None:
    """Refuse a table whose `__source_position` has another layout (a table an earlier lakesink
    wrote, ordered by the change's own log position and the Kafka offset): its stored positions
    and the key index's would compare field by field against positions of another meaning."""
    if stored is None:
        return
    expected = stored_parts(connector)
    if list(stored) != expected and not (FAILOVERS in expected and list(stored) == WITHOUT_FAILOVERS):
        raise DebeziumSchemaError(
            f"table {identifier}: its column {POSITION_COLUMN} holds ({', '.join(stored)}), the order an earlier lakesink "
            f"applied {connector} changes in, which keeps an older value when transactions interleave; lakesink now orders "
            f"by ({', '.join(expected)}) and cannot compare the two. Write these events to a new table (option table_name) "
            "from a new snapshot of the source, or drop this table and re-snapshot. Nothing was written"
        )


def _streamed_flags(ops: Sequence[str | None] | pa.Array, snapshots: pa.Array) -> pa.Array:
    """False for a snapshot's read (op r, not an incremental snapshot's), true for the rest."""
    ops_array = ops if isinstance(ops, pa.Array) else pa.array(list(ops), pa.string())
    incremental = pc.equal(pc.utf8_lower(pc.fill_null(snapshots.cast(pa.string()), "")), "incremental")
    read = pc.equal(pc.fill_null(ops_array.cast(pa.string()), ""), SNAPSHOT_READ)
    return pc.invert(pc.and_(read, pc.invert(incremental)))


def positions(connector: str | None, sources: Sequence[Source], ops: Sequence[str | None]) -> pa.StructArray:
    """Each record's position, from its `source` and its op."""

    def field(name: str) -> pa.Array:
        values = [getattr(s, name) for s in sources]
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return pa.array([None if v is None else str(v) for v in values], pa.string())

    return positions_of(connector, field, len(sources), pa.array(list(ops), pa.string()))


def positions_of(connector: str | None, field: Field, n: int, ops: pa.Array) -> pa.StructArray:
    """Positions from the sources' fields as columns (`field`) and the events' ops."""
    parts = parts_of(connector)
    snapshots = field("snapshot") if any(name == STREAMED for name, _, _ in parts) else pa.nulls(n, pa.string())
    streamed = _streamed_flags(ops, snapshots)
    arrays = [column(field, streamed) for _, _, column in parts]
    if any(len(a) != n for a in arrays):
        raise AssertionError("a position part of another length")
    return pa.StructArray.from_arrays(arrays, fields=list(position_type(connector)))
