"""JSON rows and keys of Debezium records -> Arrow columns, by their Connect schema (each
column read in its JSON form, then converted) or typed as the table has them; the schemas
parsed once per process (`memo.py`).
"""

from __future__ import annotations

import decimal
import io
import re
from collections.abc import Sequence
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.json as pa_json

from lakesink_datasource.debezium.connect_schema import (
    ConnectSchema,
    DebeziumSchemaError,
    arrow_type,
    convert,
    has_map,
    parse_schema,
    read_type,
)
from lakesink_datasource.debezium.memo import Memo
from lakesink_datasource.debezium.positions import POSITION_COLUMN
from lakesink_datasource.debezium.records import OP_COLUMN, Json

_CACHED = 4096  # schemas kept per process (a long-lived worker meets many versions)
_envelopes: Memo[bytes, ConnectSchema | None] = Memo(_CACHED)
_row_schemas: Memo[bytes, ConnectSchema | None] = Memo(_CACHED)
_key_schemas: Memo[bytes, ConnectSchema] = Memo(_CACHED)


def envelope_schema(raw: bytes) -> ConnectSchema | None:
    return _envelopes.get(raw, parse_schema)


def row_schema(envelope: bytes) -> ConnectSchema | None:
    """The Connect schema of an envelope's rows (its `after`, else `before`), parsed once."""

    def rows_of(raw: bytes) -> ConnectSchema | None:
        parsed = envelope_schema(raw)
        return parsed.child("after") or parsed.child("before") if parsed is not None else None

    return _row_schemas.get(envelope, rows_of)


def key_schema(raw: bytes) -> ConnectSchema:
    return _key_schemas.get(raw, parse_schema)


def parse_rows(raws: Sequence[Json | None], connect: ConnectSchema | None, existing: pa.Schema | None = None) -> pa.Table:
    """Rows as JSON objects -> their columns: by their Connect schema (each column read in its
    JSON form, then converted), else typed as the table has them (`existing`) or as the JSON
    gives them."""
    return parse_blob(_lines(raws), len(raws), connect, existing)


def parse_blob(blob: bytes, n: int, connect: ConnectSchema | None, existing: pa.Schema | None) -> pa.Table:
    """`n` newline-delimited JSON objects as columns (see `parse_rows`)."""
    if connect is not None:
        fields = list(connect.fields or ())
        if not fields:
            return pa.table({"__empty": pa.nulls(n)}).drop_columns(["__empty"])
        if has_map(connect):
            bad = next(f.field for f in fields if has_map(f))
            raise DebeziumSchemaError(
                f"column '{bad}' is a map (PostgreSQL hstore with hstore.handling.mode=map?): lakesink reads maps only as "
                "JSON text; set the connector's hstore.handling.mode=json"
            )
        for numeric in (False, True):
            explicit = pa.schema([pa.field(f.field or "", read_type(f, numeric)) for f in fields])
            try:
                parsed = read_json(blob, explicit, "ignore")
                break
            except pa.ArrowInvalid as exc:
                if numeric or "number" not in str(exc):
                    raise DebeziumSchemaError(f"the rows do not match their Connect schema: {exc}") from None
        columns = [convert(parsed.column(f.field or ""), f) for f in fields]
        return pa.Table.from_arrays(columns, schema=pa.schema([pa.field(f.field or "", arrow_type(f)) for f in fields]))
    # Every column may be absent from a row (a delete's row is its key alone): all nullable.
    explicit = pa.schema([pa.field(f.name, f.type) for f in existing if f.name not in (OP_COLUMN, POSITION_COLUMN)]) if existing is not None else None
    try:
        parsed = read_json(blob, explicit, "infer")
    except pa.ArrowInvalid as exc:
        raise DebeziumSchemaError(f"the rows cannot be read as the table's columns: {exc}") from None
    return _typed_only(parsed)


def _typed_only(parsed: pa.Table) -> pa.Table:
    """Rows read without a schema, less what no value typed: a field null in every row, an
    array empty in every row, a struct's field null throughout. Such a field is no column (yet):
    any type chosen for it could refuse the value that later gives it one (a string column
    given a number); the table's own columns were read in their types already."""
    for name in list(parsed.column_names):
        kind = parsed.schema.field(name).type
        typed = _typed_part(kind)
        if typed is None:
            parsed = parsed.drop_columns([name])
        elif typed != kind:
            parsed = parsed.set_column(parsed.column_names.index(name), name, parsed.column(name).cast(typed))
    return parsed


def _typed_part(kind: pa.DataType) -> pa.DataType | None:
    """`kind` less its parts of Arrow's null type (None: nothing is left)."""
    if pa.types.is_null(kind):
        return None
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = _typed_part(kind.value_type)
        if item is None:
            return None
        field = kind.value_field.with_type(item)
        return pa.list_(field) if pa.types.is_list(kind) else pa.large_list(field)
    if pa.types.is_struct(kind):
        fields = [f.with_type(t) for f in kind if (t := _typed_part(f.type)) is not None]
        return pa.struct(fields) if fields else None
    return kind


def _lines(raws: Sequence[Json | None]) -> bytes:
    # One JSON object per line: a null row (a delete's) is an object of nulls. A value written
    # across lines (pretty-printed JSON) is written again on one.
    texts = [r if r is not None else b"{}" for r in raws]
    blob = b"\n".join(texts)
    if blob.count(b"\n") != len(texts) - 1:
        blob = b"\n".join(msgspec.json.encode(msgspec.json.decode(r)) if b"\n" in bytes(r) else r for r in texts)
    return blob


def read_json(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> pa.Table:
    """Newline-delimited JSON objects as columns: the `explicit` ones in their types, others
    ignored or (`infer`) typed as the JSON gives them: text stays text (Arrow's reader would
    make timestamps of some), and JsonConverter's texts for a float's NaN and infinities are
    those floats."""
    if b'"NaN"' in blob or b'Infinity"' in blob:
        blob = _float_texts(blob, explicit, unexpected)
    parsed = _arrow_read(blob, explicit, unexpected)
    if unexpected != "infer":
        return parsed
    texts = _texts_kept(parsed.schema, explicit)
    return parsed if texts is None else _arrow_read(blob, texts, "ignore")


def _arrow_read(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> pa.Table:
    parse = pa_json.ParseOptions(explicit_schema=explicit, unexpected_field_behavior=unexpected)
    # Inferring, one block for the whole blob: Arrow infers a block's types on its own, and
    # blocks that disagree (a field null in one, text in the next) would fail the read. With
    # every column's type given, blocks of 1 MiB are parsed on Arrow's threads.
    inferring = unexpected == "infer"
    read = pa_json.ReadOptions(block_size=max(1 << 20, len(blob) + 1) if inferring else 1 << 20)
    return pa_json.read_json(io.BytesIO(blob), read_options=read, parse_options=parse)


def _texts_kept(inferred: pa.Schema, explicit: pa.Schema | None) -> pa.Schema | None:
    """The schema that reads again, as text, what Arrow's inference made temporal (ISO dates
    and timestamps in text; pyarrow's JSON reader has no option to stop it); None: nothing was."""
    given = set(explicit.names) if explicit is not None else set()
    fields = [f if f.name in given else f.with_type(_as_text(f.type)) for f in inferred]
    if all(f.type == g.type for f, g in zip(fields, inferred)):
        return None
    return pa.schema(fields)


def _as_text(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_temporal(kind):
        return pa.string()
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_as_text(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_as_text(f.type)) for f in kind])
    return kind


# JsonConverter (Jackson) writes a float's NaN and infinities as these texts; Arrow's reader
# takes them as floats only unquoted, so they are written back as raw tokens (msgspec 0.23
# refuses to write a non-finite Decimal as a number).
_FLOAT_TEXTS = {text: msgspec.Raw(text.encode()) for text in ("NaN", "Infinity", "-Infinity")}
# One of those texts where a value (not a key) stands.
_FLOAT_TEXT_VALUE = re.compile(rb'(?<=[:\[,])(\s*)"(?:NaN|-?Infinity)"(?=\s*[,\]}])')
# Numbers are read and written back as their own digits (a decimal of 40 digits stays exact).
_exact_decoder = msgspec.json.Decoder(float_hook=decimal.Decimal)
_exact_encoder = msgspec.json.Encoder(decimal_format="number")


def _float_texts(blob: bytes, explicit: pa.Schema | None, unexpected: str) -> bytes:
    """`blob` with the NaN and infinity texts of float fields unquoted. A float field is one
    `explicit` types so or, inferring, one whose other values are numbers (a field never
    seen as a number keeps its text). Only the lines holding such a text are rewritten."""
    types: pa.Schema | None = explicit
    if unexpected == "infer":
        try:
            types = _arrow_read(_FLOAT_TEXT_VALUE.sub(rb"\1null", blob), explicit, "infer").schema
        except pa.ArrowInvalid:
            return blob  # the read names what is wrong
    if types is None or not _has_float(pa.struct(list(types))):
        return blob
    row = pa.struct(list(types))
    lines = blob.split(b"\n")
    for i, line in enumerate(lines):
        if _FLOAT_TEXT_VALUE.search(line) is not None:
            try:
                lines[i] = _exact_encoder.encode(_floats_of(_exact_decoder.decode(line), row))
            except msgspec.DecodeError:
                pass  # not JSON: the read names it
    return b"\n".join(lines)


def _has_float(kind: pa.DataType) -> bool:
    if pa.types.is_floating(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_float(kind.value_type)
    return pa.types.is_struct(kind) and any(_has_float(f.type) for f in kind)


def _floats_of(value: Any, kind: pa.DataType) -> Any:
    """`value` with the texts `_FLOAT_TEXTS` names as those numbers where `kind` is a float."""
    if isinstance(value, str):
        return _FLOAT_TEXTS.get(value, value) if pa.types.is_floating(kind) else value
    if isinstance(value, list) and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return [_floats_of(v, kind.value_type) for v in value]
    if isinstance(value, dict) and pa.types.is_struct(kind):
        for field in kind:
            if field.name in value and _has_float(field.type):
                value[field.name] = _floats_of(value[field.name], field.type)
    return value
