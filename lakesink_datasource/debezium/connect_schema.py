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
  decimal text: no Iceberg decimal holds every scale, and a double would round.
- `NanoTime`/`NanoTimestamp` are cut to microseconds, Iceberg's unit for time and timestamp.
- `Uuid`, `Json`, `Xml`, `Enum`, `ZonedTime`, `Interval` stay strings; `Bits` stays binary.
- Time types become Iceberg `time` where PySpark has a time type (4.1+); on 4.0, Spark
  cannot describe one, so they stay microseconds since midnight (a long).
"""

from __future__ import annotations

import base64
import binascii
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
_PRIMITIVES = {
    "int8": pa.int32(), "int16": pa.int32(), "int32": pa.int32(), "int64": pa.int64(),
    "float32": pa.float32(), "float64": pa.float64(), "boolean": pa.bool_(), "string": pa.string(),
}


def decimal_type(schema: ConnectSchema) -> pa.Decimal128Type:
    params = schema.parameters or {}
    try:
        scale = int(params.get("scale", "0"))
        precision = int(params.get("connect.decimal.precision", "38"))
    except ValueError:
        raise DebeziumSchemaError(f"field '{schema.field}': Decimal parameters {params} are not numbers") from None
    # The precision Debezium gives is the column's (or absent: 38); Iceberg holds up to 38.
    return pa.decimal128(max(1, min(max(precision, scale), 38)), scale)


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
        return decimal_type(schema) if numeric_decimals else pa.string()
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
        return pa.int64() if kind in ("int8", "int16", "int32") else _PRIMITIVES[kind]
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
            return values.cast(target)
        return decimal_from_base64(values, target, schema.field or "")
    if name == VARIABLE_DECIMAL:
        return _variable_decimal_text(values)
    if name in _DATES:
        return values.cast(pa.int32()).cast(pa.date32())
    if name in _TIMES:
        per, den = _TIMES[name]
        micros = pc.divide(pc.multiply(values.cast(pa.int64()), per), den) if den != 1 else pc.multiply(values.cast(pa.int64()), per)
        return micros.cast(pa.time64("us")) if TIME_AS_TIME else micros
    if name in _TIMESTAMPS:
        per, den = _TIMESTAMPS[name]
        micros = _floor_divide(values.cast(pa.int64()), den) if den != 1 else pc.multiply(values.cast(pa.int64()), per)
        return micros.cast(pa.timestamp("us"))
    if name == ZONED_TIMESTAMP:
        try:
            return values.cast(pa.timestamp("us", tz="UTC"))
        except pa.ArrowInvalid as exc:
            raise DebeziumSchemaError(f"field '{schema.field}': a ZonedTimestamp is not ISO-8601 text: {exc}") from None
    kind = schema.type
    if kind == "bytes":
        return binary_from_base64(values, schema.field or "")
    if kind == "array" and schema.items is not None:
        assert isinstance(values, pa.ListArray)
        # `offsets` index into the whole child array (`values`), sliced or not.
        inner = convert(values.values, schema.items)
        return pa.ListArray.from_arrays(values.offsets, inner, type=target, mask=values.is_null() if values.null_count else None)
    if kind == "struct":
        assert isinstance(values, pa.StructArray)
        children = [convert(values.field(i), f) for i, f in enumerate(schema.fields or ())]
        return pa.StructArray.from_arrays(
            children, fields=list(target), mask=values.is_null() if values.null_count else None
        )
    return values.cast(target)


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
        raise DebeziumSchemaError(f"field '{field}': a decimal wider than 128 bits does not fit an Iceberg decimal")
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
    unscaled = pa.Array.from_buffers(pa.decimal128(38, target.scale), n, [pa.array(valid).buffers()[1] if not valid.all() else None, pa.py_buffer(little.tobytes())])
    if target.precision == 38:
        return unscaled
    try:
        return unscaled.cast(target)
    except pa.ArrowInvalid:
        raise DebeziumSchemaError(f"field '{field}': a decimal value has more digits than its precision {target.precision}") from None


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
