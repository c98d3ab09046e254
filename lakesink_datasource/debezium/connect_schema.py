"""Kafka Connect schemas (as JsonConverter writes them beside each payload) -> Arrow types,
and a payload column read as JSON -> the values those types hold.

A Connect field has a base type (`int32`, `bytes`, `struct`...) and, for logical types, a
`name` and `parameters`: Kafka's `Decimal` is base64 bytes of a big-endian two's complement
integer with `parameters.scale`; Debezium's `io.debezium.time.*` are integers in a unit since
the epoch or midnight; `ZonedTimestamp` is ISO-8601 text with an offset. Arrow's JSON reader
reads each column in its JSON form (`read_type`); `convert` turns a column so read into the
Iceberg-ready Arrow type (`arrow_type`), vectorised, one column at a time.

Decisions (docs/usage.md, "From Debezium"):
- `VariableScaleDecimal` (an unconstrained NUMERIC: a scale per value) becomes the exact
  decimal text: no Iceberg decimal holds every scale, and a double would round. A `Decimal`
  of scale past 38, or a value of more than 38 digits, is refused naming the field (Iceberg's
  decimals stop at 38 digits; the connector's `decimal.handling.mode=string` sends text).
- `NanoTime`/`NanoTimestamp`, and a `ZonedTimestamp`'s 7 to 9 fractional digits, are cut to
  microseconds, Iceberg's unit for time and timestamp.
- PostgreSQL's `infinity`/`-infinity` dates and timestamps (Debezium's sentinels) and, where
  a column is an Iceberg `time`, a TIME outside a day (MySQL's durations) become null,
  counted for the batch's progress line (`nulls_counted`): one value never refuses a batch.
  PostgreSQL's `24:00:00` is the day's last microsecond, 23:59:59.999999.
- `Bits` (BIT(n), n > 1) is binary in the database's byte order: Debezium sends it
  little-endian, the database and other sinks show it big-endian, `ceil(n / 8)` bytes.
- `Uuid`, `Json`, `Xml`, `Enum`, `ZonedTime`, `Interval` stay strings.
- Time types become Iceberg `time` where PySpark has a time type (4.1+); on 4.0, Spark
  cannot describe one, so they stay microseconds since midnight (a long), whatever their value.
- JsonConverter names Connect's FLOAT32/FLOAT64 `float`/`double` (`float32`/`float64`, the
  Connect type names, are read too).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.errors import LakesinkError


class DebeziumSchemaError(LakesinkError, ValueError):
    """A Connect schema or a value lakesink cannot read as Debezium writes them."""


class ConnectSchema(msgspec.Struct, frozen=True, omit_defaults=True):
    """One node of a Kafka Connect schema as JsonConverter writes it."""

    type: str = "struct"
    fields: list[ConnectSchema] | None = None
    items: ConnectSchema | None = None  # array
    keys: ConnectSchema | None = None  # map
    values: ConnectSchema | None = None  # map
    optional: bool = True
    name: str | None = None
    version: int | None = None
    parameters: dict[str, str] | None = None
    field: str | None = None
    default: Any = None

    def child(self, name: str) -> ConnectSchema | None:
        return next((f for f in self.fields or () if f.field == name), None)


_decode_schema = msgspec.json.Decoder(ConnectSchema)


def parse_schema(raw: bytes) -> ConnectSchema:
    try:
        return _decode_schema.decode(raw)
    except msgspec.ValidationError as exc:
        raise DebeziumSchemaError(f"not a Kafka Connect schema: {exc}") from None


def _has_time_type() -> bool:
    try:
        from pyspark.sql.types import TimeType  # noqa: F401  (PySpark 4.1+)
    except ImportError:
        return False
    return True


TIME_AS_TIME = _has_time_type()

KAFKA_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
_DATES = ("org.apache.kafka.connect.data.Date", "io.debezium.time.Date")
# name -> (unit of the integer, per microsecond factor: value * num // den microseconds)
_TIMES = {
    "org.apache.kafka.connect.data.Time": (1000, 1),
    "io.debezium.time.Time": (1000, 1),
    "io.debezium.time.MicroTime": (1, 1),
    "io.debezium.time.NanoTime": (1, 1000),
}
_TIMESTAMPS = {
    "org.apache.kafka.connect.data.Timestamp": (1000, 1),
    "io.debezium.time.Timestamp": (1000, 1),
    "io.debezium.time.MicroTimestamp": (1, 1),
    "io.debezium.time.NanoTimestamp": (1, 1000),
}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
BITS = "io.debezium.data.Bits"
# JsonConverter's own names (JsonSchema: "float", "double") and Connect's (FLOAT32, FLOAT64).
_PRIMITIVES = {
    "int8": pa.int32(), "int16": pa.int32(), "int32": pa.int32(), "int64": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "float32": pa.float32(), "float64": pa.float64(),
    "boolean": pa.bool_(), "string": pa.string(),
}
_INTEGERS = ("int8", "int16", "int32")
MAX_DIGITS = 38  # an Iceberg decimal's largest precision
_DECIMAL_HINT = "set the connector's decimal.handling.mode=string (the column becomes its exact decimal text)"

# PostgreSQL's infinity and -infinity as Debezium writes them (its PostgreSQL connector's
# documentation, "TIMESTAMP type", and PostgresValueConverter): MicroTimestamp the JDBC
# driver's PGStatement.DATE_POSITIVE/NEGATIVE_INFINITY, NanoTimestamp Long.MAX/MIN_VALUE,
# ZonedTimestamp the text itself; a Date an epoch day far before any date PostgreSQL holds
# (streamed: the days of -5877611-06-21/22; snapshotted: that day count wrapped to 32 bits).
_INFINITE_MICROS = (9_223_372_036_825_200_000, -9_223_372_036_832_400_000)
_INFINITE_NANOS = ((1 << 63) - 1, -(1 << 63))
_INFINITE_TEXTS = ("infinity", "-infinity")
FIRST_DAY = -2_440_588  # 4714-11-24 BC (Julian day 0), PostgreSQL's first date; others start later
DAY_MICROS = 86_400_000_000

# Values `convert` writes as null (they have no value in their Iceberg type), by what they
# were: the task's decode counts them for the batch's progress line.
_NULLED: ContextVar[dict[str, int] | None] = ContextVar("lakesink_debezium_nulled", default=None)


@contextmanager
def nulls_counted() -> Iterator[dict[str, int]]:
    """While the block runs, `convert` counts here the values it writes as null. A context
    rather than a parameter: the readers that call `convert` sit deep in the decoding."""
    counts: dict[str, int] = {}
    token = _NULLED.set(counts)
    try:
        yield counts
    finally:
        _NULLED.reset(token)


def _count_nulled(what: str, n: int) -> None:
    counts = _NULLED.get()
    if counts is not None and n:
        counts[what] = counts.get(what, 0) + n


def _null_where(values: pa.Array, mask: pa.Array, what: str) -> pa.Array:
    """`values` with null where `mask` holds (counted as `what`)."""
    n = pc.sum(mask.cast(pa.int64())).as_py() or 0
    if not n:
        return values
    _count_nulled(what, n)
    return pc.if_else(mask, pa.nulls(len(values), values.type), values)


def _infinite(field: str) -> str:
    return f"PostgreSQL infinity/-infinity values of column '{field}' (stored as null)"


def decimal_type(schema: ConnectSchema) -> pa.Decimal128Type:
    params = schema.parameters or {}
    try:
        scale = int(params.get("scale", "0"))
        precision = int(params.get("connect.decimal.precision", str(MAX_DIGITS)))
    except ValueError:
        raise DebeziumSchemaError(f"field '{schema.field}': Decimal parameters {params} are not numbers") from None
    if scale > MAX_DIGITS:
        raise DebeziumSchemaError(
            f"column '{schema.field}' is a decimal of scale {scale}: an Iceberg decimal holds at most {MAX_DIGITS} digits, "
            f"{MAX_DIGITS} of them after the point; {_DECIMAL_HINT}. Nothing was written"
        )
    # The precision Debezium gives is the column's (or absent: 38); Iceberg holds up to 38, and
    # a wider column's values are stored while they fit (one that does not is refused, named).
    return pa.decimal128(max(1, min(max(precision, scale), MAX_DIGITS)), scale)


def arrow_type(schema: ConnectSchema) -> pa.DataType:
    """The Arrow type a field's values take in the table."""
    name = schema.name
    if name == KAFKA_DECIMAL:
        return decimal_type(schema)
    if name == VARIABLE_DECIMAL:
        return pa.string()
    if name in _DATES:
        return pa.date32()
    if name in _TIMES:
        return pa.time64("us") if TIME_AS_TIME else pa.int64()
    if name in _TIMESTAMPS:
        return pa.timestamp("us")
    if name == ZONED_TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    kind = schema.type
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "bytes":
        return pa.binary()
    if kind == "array":
        if schema.items is None:
            raise DebeziumSchemaError(f"field '{schema.field}': an array schema without 'items'")
        return pa.list_(arrow_type(schema.items))
    if kind == "map":
        if schema.keys is None or schema.values is None:
            raise DebeziumSchemaError(f"field '{schema.field}': a map schema without 'keys' and 'values'")
        return pa.map_(arrow_type(schema.keys), arrow_type(schema.values))
    if kind == "struct":
        return pa.struct([pa.field(f.field or "", arrow_type(f)) for f in schema.fields or ()])
    raise DebeziumSchemaError(f"field '{schema.field}': Kafka Connect type {kind!r} is not one lakesink knows")


def read_type(schema: ConnectSchema, numeric_decimals: bool = False) -> pa.DataType:
    """The Arrow type Arrow's JSON reader reads a field's JSON form as (bytes are base64 text,
    a Decimal base64 text or, with JsonConverter's `decimal.format=NUMERIC`, a number)."""
    name = schema.name
    if name == KAFKA_DECIMAL:
        # A number is read wider than Iceberg's decimals, so that one past 38 digits is refused
        # naming its column (`convert`) rather than failing the whole read.
        return pa.decimal256(2 * MAX_DIGITS, decimal_type(schema).scale) if numeric_decimals else pa.string()
    if name == VARIABLE_DECIMAL:
        return pa.struct([pa.field("scale", pa.int32()), pa.field("value", pa.string())])
    if name in _DATES:
        return pa.int32()
    if name in _TIMES or name in _TIMESTAMPS:
        return pa.int64()
    if name == ZONED_TIMESTAMP:
        return pa.string()
    kind = schema.type
    if kind in _PRIMITIVES:
        return pa.int64() if kind in _INTEGERS else _PRIMITIVES[kind]
    if kind == "bytes":
        return pa.string()
    if kind == "array":
        assert schema.items is not None
        return pa.list_(read_type(schema.items, numeric_decimals))
    if kind == "struct":
        return pa.struct([pa.field(f.field or "", read_type(f, numeric_decimals)) for f in schema.fields or ()])
    # A map's JSON form is an object (string keys) or a list of pairs: Arrow's reader has no map.
    raise DebeziumSchemaError(f"field '{schema.field}': {kind} values are not read in bulk")


def has_map(schema: ConnectSchema) -> bool:
    if schema.type == "map":
        return True
    return any(has_map(c) for c in (*(schema.fields or ()), *(x for x in (schema.items,) if x is not None)))


def convert(values: pa.Array, schema: ConnectSchema) -> pa.Array:
    """A column read in its JSON form (`read_type`) as the values of `arrow_type`."""
    target = arrow_type(schema)
    name = schema.name
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if name == KAFKA_DECIMAL:
        if pa.types.is_decimal(values.type):
            return _narrowed(values, target, schema.field or "")
        return decimal_from_base64(values, target, schema.field or "")
    if name == VARIABLE_DECIMAL:
        return _variable_decimal_text(values)
    field = schema.field or ""
    if name in _DATES:
        days = values.cast(pa.int32())
        return _null_where(days, pc.less(days, FIRST_DAY), _infinite(field)).cast(pa.date32())
    if name in _TIMES:
        per, den = _TIMES[name]
        micros = pc.divide(pc.multiply(values.cast(pa.int64()), per), den) if den != 1 else pc.multiply(values.cast(pa.int64()), per)
        return _time_of_day(micros, field) if TIME_AS_TIME else micros
    if name in _TIMESTAMPS:
        return _timestamp_micros(values.cast(pa.int64()), name, field).cast(pa.timestamp("us"))
    if name == ZONED_TIMESTAMP:
        return _zoned_timestamps(values, field)
    kind = schema.type
    if name == BITS and kind == "bytes":
        return _bits_big_endian(binary_from_base64(values, field), schema)
    if kind == "bytes":
        return binary_from_base64(values, schema.field or "")
    if kind == "array" and schema.items is not None:
        assert isinstance(values, pa.ListArray)
        # `offsets` index into the whole child array (`values`), sliced or not.
        items = schema.items if schema.items.field else msgspec.structs.replace(schema.items, field=schema.field)  # errors name the column
        inner = convert(values.values, items)
        return pa.ListArray.from_arrays(values.offsets, inner, type=target, mask=values.is_null() if values.null_count else None)
    if kind == "struct":
        assert isinstance(values, pa.StructArray)
        children = [convert(values.field(i), f) for i, f in enumerate(schema.fields or ())]
        return pa.StructArray.from_arrays(
            children, fields=list(target), mask=values.is_null() if values.null_count else None
        )
    return values.cast(target)


def _time_of_day(micros: pa.Array, field: str) -> pa.Array:
    """Microseconds since midnight as Iceberg `time`: PostgreSQL's 24:00:00 (a day's end) is
    its last microsecond; a MySQL TIME outside a day (a duration: negative, or 24 hours and
    more) has no time of day and is null, counted."""
    end = pc.equal(micros, DAY_MICROS)
    if pc.any(end).as_py():
        micros = pc.if_else(end, DAY_MICROS - 1, micros)
    outside = pc.or_(pc.less(micros, 0), pc.greater_equal(micros, DAY_MICROS))
    what = f"TIME values of column '{field}' outside 00:00:00-24:00:00 (stored as null)"
    return _null_where(micros, outside, what).cast(pa.time64("us"))


def _timestamp_micros(values: pa.Array, name: str, field: str) -> pa.Array:
    """A Timestamp, MicroTimestamp or NanoTimestamp as microseconds since the epoch,
    PostgreSQL's ±infinity null (counted)."""
    per, den = _TIMESTAMPS[name]
    if den != 1:  # nanoseconds
        values = _null_where(values, pc.is_in(values, value_set=pa.array(_INFINITE_NANOS, pa.int64())), _infinite(field))
        return _floor_divide(values, den)
    if per != 1:  # milliseconds: infinity's microseconds, or a count no microsecond count holds
        limit = ((1 << 63) - 1) // per
        values = _null_where(values, pc.or_(pc.greater(values, limit), pc.less(values, -limit)), _infinite(field))
        values = pc.multiply(values, per)
    return _null_where(values, pc.is_in(values, value_set=pa.array(_INFINITE_MICROS, pa.int64())), _infinite(field))


def _zoned_timestamps(values: pa.Array, field: str) -> pa.Array:
    """ISO-8601 text with an offset (Java's ISO_OFFSET_DATE_TIME, Debezium's form: 0 to 9
    fractional digits, `Z` or `+hh:mm[:ss]`, years past 9999 signed) as UTC microseconds;
    PostgreSQL's `infinity`/`-infinity` null (counted)."""
    values = values.cast(pa.string())
    values = _null_where(values, pc.fill_null(pc.is_in(values, value_set=pa.array(_INFINITE_TEXTS)), False), _infinite(field))
    # The usual forms in Arrow's own parser (whose failure alone costs 2 us a value): up to 6
    # digits as they are, 7 to 9 in a column of one layout cut to 6 first.
    usual = _fixed_fraction_cut(values)
    try:
        return (values if usual is None else usual).cast(pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid:
        return _iso_offset_micros(values, field)


_FRACTION_AT = len("2024-01-31T10:15:30.")
_FIXED_FRACTION = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.(\d{7,9})(Z|[+-]\d\d:\d\d)")


def _fixed_fraction_cut(values: pa.Array) -> pa.Array | None:
    """A column whose every value has one layout with 7 to 9 fractional digits (SQL Server's
    datetimeoffset(7), Debezium's fixed fraction width) cut to 6 digits for Arrow's parser,
    by position: 20 times faster than taking each value apart. None: not such a column."""
    at = pc.index(values.is_valid(), True).as_py()
    matched = _FIXED_FRACTION.fullmatch(values[at].as_py()) if at >= 0 else None
    if matched is None:
        return None
    first = matched.group(0)
    valid = values.drop_null() if values.null_count else values
    end = _FRACTION_AT + len(matched.group(1))
    same = pc.and_(pc.equal(pc.utf8_length(valid), len(first)), pc.equal(pc.utf8_slice_codeunits(valid, _FRACTION_AT - 1, _FRACTION_AT), "."))
    same = pc.and_(same, pc.is_in(pc.utf8_slice_codeunits(valid, end, end + 1), value_set=pa.array(["Z", "+", "-"])))
    if not pc.all(same).as_py():
        return None
    return pc.utf8_replace_slice(values, start=_FRACTION_AT + 6, stop=end, replacement="")


_ISO_OFFSET = (
    r"^(?P<year>[+-]?\d{4,})-(?P<month>\d{2})-(?P<day>\d{2})T(?P<hour>\d{2}):(?P<minute>\d{2})"
    r"(?::(?P<second>\d{2})(?:\.(?P<fraction>\d{1,9}))?)?(?P<offset>Z|[+-]\d{2}:\d{2}(?::\d{2})?)$"
)


def _iso_offset_micros(values: pa.Array, field: str) -> pa.Array:
    """The forms Arrow's parser does not take (7-9 fractional digits, an offset with seconds,
    a year past 9999 or before 0), from their parts: vectorised, the fraction cut (not
    rounded) to microseconds as the Nano types are."""
    parts = pc.extract_regex(values, pattern=_ISO_OFFSET)
    unmatched = pc.and_(values.is_valid(), parts.is_null())
    if pc.any(unmatched).as_py():
        bad = values.filter(unmatched)[0].as_py()
        raise DebeziumSchemaError(
            f"field '{field}': ZonedTimestamp {bad!r} is not ISO-8601 text with an offset (as 2024-01-31T10:15:30.1234567+02:00). "
            "Nothing was written"
        )

    def number(name: str, width: int | None = None) -> np.ndarray:
        text = parts.field(name)
        if width is not None:  # the fraction's digits, as a count of microseconds
            text = pc.utf8_slice_codeunits(pc.utf8_rpad(text, width=9, padding="0"), 0, width)
        text = pc.if_else(pc.equal(text, ""), "0", pc.replace_substring(text, "+", ""))
        return np.asarray(pc.fill_null(text, "0").cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)

    offset = pc.fill_null(parts.field("offset"), "Z")
    zone = pc.if_else(pc.equal(offset, "Z"), "+00:00:00", pc.utf8_rpad(offset, width=9, padding="0"))
    sign = np.where(np.asarray(pc.starts_with(zone, "-").to_numpy(zero_copy_only=False), dtype=bool), -1, 1)
    zone_seconds = [np.asarray(pc.utf8_slice_codeunits(zone, a, a + 2).cast(pa.int64()).to_numpy(zero_copy_only=False)) for a in (1, 4, 7)]
    offset_seconds = sign * (zone_seconds[0] * 3600 + zone_seconds[1] * 60 + zone_seconds[2])
    days = _days_from_civil(number("year"), number("month"), number("day"))
    seconds = ((days * 24 + number("hour")) * 60 + number("minute")) * 60 + number("second") - offset_seconds
    if (np.abs(seconds) > ((1 << 63) - 1) // 1_000_000 - 1).any():
        raise DebeziumSchemaError(f"field '{field}': a ZonedTimestamp lies past what microseconds since 1970 hold. Nothing was written")
    micros = seconds * 1_000_000 + number("fraction", 6)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return pa.array(micros, pa.timestamp("us", tz="UTC"), mask=~valid)


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates (H. Hinnant's algorithm, on arrays)."""
    year = year - (month <= 2)
    era = np.floor_divide(year, 400)
    year_of_era = year - era * 400
    day_of_year = (153 * (month + np.where(month > 2, -3, 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def _bits_big_endian(raw: pa.Array, schema: ConnectSchema) -> pa.Array:
    """Debezium's Bits (little-endian, Debezium's wire order) in the database's order:
    big-endian, `ceil(length / 8)` bytes (a PostgreSQL BIT VARYING without a length, whose
    `length` is Integer.MAX_VALUE, keeps its own bytes)."""
    try:
        length = int((schema.parameters or {}).get("length", "0"))
    except ValueError:
        raise DebeziumSchemaError(f"field '{schema.field}': Bits parameter length {schema.parameters} is not a number") from None
    width = (length + 7) // 8 if 0 < length < (1 << 31) - 1 else 0
    return pa.array([None if v is None else v[::-1].rjust(width, b"\x00") for v in raw.to_pylist()], pa.binary())


def _floor_divide(values: pa.Array, by: int) -> pa.Array:
    # Towards minus infinity (a time before 1970 keeps its microsecond, not the next one's).
    array = values.to_numpy(zero_copy_only=False) if values.null_count == 0 else np.asarray(pc.fill_null(values, 0))
    out = pa.array(np.floor_divide(array.astype(np.int64), by))
    return out if values.null_count == 0 else pc.if_else(values.is_null(), pa.nulls(len(values), pa.int64()), out)


def binary_from_base64(values: pa.Array, field: str) -> pa.Array:
    """Base64 text (JsonConverter's form of bytes) as the bytes it encodes: the whole column
    in one numpy pass (a decimal column is one per change), value by value only when some
    value is not plain padded base64 (which then fails naming the field)."""
    fast = _base64_column(values)
    if fast is not None:
        return fast
    try:
        return pa.array([None if v is None else base64.b64decode(v, validate=True) for v in values.to_pylist()], pa.binary())
    except (binascii.Error, ValueError):
        raise DebeziumSchemaError(f"field '{field}': a bytes value is not base64 text") from None


_SEXTETS = np.full(256, 255, dtype=np.uint8)
_SEXTETS[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8)] = np.arange(64, dtype=np.uint8)
_PAD = ord("=")


def _base64_column(values: pa.Array) -> pa.Array | None:
    """The decoded column, or None when a value is not a whole number of 4-character groups
    of the standard alphabet with its padding at the end (left to the value-by-value path)."""
    if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)):
        return None
    n = len(values)
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=n + 1, offset=values.offset * 4).astype(np.int64)
    data = values.buffers()[2]
    text = np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if (lengths % 4).any() or (lengths[~valid] != 0).any():
        return None
    ends = offsets[1:] - offsets[0]
    last = np.zeros(n, dtype=bool)
    second = np.zeros(n, dtype=bool)
    has = lengths > 0
    last[has] = text[ends[has] - 1] == _PAD
    second[has] = text[ends[has] - 2] == _PAD
    pads = last.astype(np.int64) + (second & last)
    if int((text == _PAD).sum()) != int(pads.sum()) or (second & ~last).any():
        return None  # padding elsewhere than at a value's end
    sextets = _SEXTETS[text]
    sextets[text == _PAD] = 0
    if (sextets == 255).any():
        return None
    quads = sextets.reshape(-1, 4).astype(np.uint8)
    out = np.empty((len(quads), 3), dtype=np.uint8)
    out[:, 0] = (quads[:, 0] << 2) | (quads[:, 1] >> 4)
    out[:, 1] = ((quads[:, 1] & 0x0F) << 4) | (quads[:, 2] >> 2)
    out[:, 2] = ((quads[:, 2] & 0x03) << 6) | quads[:, 3]
    flat = out.reshape(-1)
    decoded_ends = ends // 4 * 3
    keep = np.ones(len(flat), dtype=bool)
    keep[decoded_ends[pads >= 1] - 1] = False
    keep[decoded_ends[pads == 2] - 2] = False
    new_lengths = lengths // 4 * 3 - pads
    new_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(new_lengths, out=new_offsets[1:])
    validity = None if valid.all() else pa.array(valid).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(new_offsets.tobytes()), pa.py_buffer(flat[keep].tobytes())])


def decimal_from_base64(values: pa.Array, target: pa.Decimal128Type, field: str) -> pa.Array:
    """Base64 big-endian two's complement integers (Kafka's Decimal) as decimals of `target`'s
    scale, built as Arrow's little-endian 16-byte values in one pass over the column."""
    raw = binary_from_base64(values, field)
    n = len(raw)
    valid = np.asarray(raw.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32, count=n + 1, offset=raw.offset * 4)
    lengths = np.diff(offsets)
    if (lengths > 16).any():
        raise _too_many_digits(field)
    data = np.frombuffer(raw.buffers()[2], dtype=np.uint8) if raw.buffers()[2] is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    negative = np.zeros(n, dtype=bool)
    has = lengths > 0
    negative[has] = data[starts[has]] >= 0x80
    out = np.where(negative[:, None], np.uint8(0xFF), np.uint8(0)).repeat(16, axis=1) if n else np.zeros((0, 16), np.uint8)
    # Right-align each value's bytes in its 16-byte big-endian slot.
    rows = np.repeat(np.arange(n), lengths)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, 16 - np.repeat(lengths, lengths) + within] = data[np.repeat(starts, lengths) + within]
    little = np.ascontiguousarray(out[:, ::-1])
    if (lengths == 16).any() and _past_38_digits(little).any():
        raise _too_many_digits(field)
    unscaled = pa.Array.from_buffers(pa.decimal128(38, target.scale), n, [pa.array(valid).buffers()[1] if not valid.all() else None, pa.py_buffer(little.tobytes())])
    if target.precision == 38:
        return unscaled
    try:
        return unscaled.cast(target)
    except pa.ArrowInvalid:
        raise DebeziumSchemaError(f"field '{field}': a decimal value has more digits than its precision {target.precision}") from None


def _narrowed(values: pa.Array, target: pa.Decimal128Type, field: str) -> pa.Array:
    """Decimals read as numbers, in the column's type (a value too wide refused, named)."""
    try:
        return values.cast(target)
    except pa.ArrowInvalid:
        try:
            values.cast(pa.decimal128(MAX_DIGITS, target.scale))
        except pa.ArrowInvalid:
            raise _too_many_digits(field) from None
        raise DebeziumSchemaError(f"field '{field}': a decimal value has more digits than its precision {target.precision}") from None


_TEN_38 = 10**MAX_DIGITS
_MASK_64 = (1 << 64) - 1


def _halves(value: int) -> tuple[int, int]:
    """A 128-bit two's complement value's high half (signed) and low half (unsigned)."""
    bits = value & ((1 << 128) - 1)
    high = bits >> 64
    return (high - (1 << 64) if high >= 1 << 63 else high), bits & _MASK_64


_UPPER = _halves(_TEN_38)  # 10^38: the first value of 39 digits
_LOWER = _halves(-_TEN_38)


def _past_38_digits(little: np.ndarray) -> np.ndarray:
    """Which 16-byte little-endian two's complement values have more than 38 digits (a
    value Arrow's decimal128(38) would hold without complaint, and fail to validate)."""
    low = little[:, :8].copy().view("<u8").ravel()
    high = little[:, 8:].copy().view("<i8").ravel()
    too_big = (high > _UPPER[0]) | ((high == _UPPER[0]) & (low >= np.uint64(_UPPER[1])))
    too_small = (high < _LOWER[0]) | ((high == _LOWER[0]) & (low <= np.uint64(_LOWER[1])))
    return too_big | too_small


def _too_many_digits(field: str) -> DebeziumSchemaError:
    return DebeziumSchemaError(
        f"column '{field}': a decimal value has more than {MAX_DIGITS} digits, more than an Iceberg decimal holds; "
        f"{_DECIMAL_HINT}. Nothing was written"
    )


def _variable_decimal_text(values: pa.Array) -> pa.Array:
    """Debezium's VariableScaleDecimal ({scale, value: base64 unscaled}) as exact decimal text."""
    out: list[str | None] = []
    for v in values.to_pylist():
        if v is None or v.get("value") is None:
            out.append(None)
            continue
        unscaled = int.from_bytes(base64.b64decode(v["value"]), "big", signed=True)
        scale = int(v.get("scale") or 0)
        out.append(_decimal_text(unscaled, scale))
    return pa.array(out, pa.string())


def _decimal_text(unscaled: int, scale: int) -> str:
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled))
    if scale <= 0:
        return sign + digits + "0" * (-scale)
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"
