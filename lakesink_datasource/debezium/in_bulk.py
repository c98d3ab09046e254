"""Debezium records read in bulk: a topic's records of one JsonConverter schema, their
payloads cut out of the wrapper and parsed by Arrow's JSON reader in one call against the
Connect schema (op, the `source` fields a position needs, `before` and `after`).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.debezium.connect_schema import (
    arrow_type,
    convert,
    has_map,
    read_type,
)
from lakesink_datasource.debezium.envelope import (
    DELETE_OP,
    TRUNCATE_OP,
    DebeziumInputError,
    key_prefix,
    read_key,
)
from lakesink_datasource.debezium.json_rows import envelope_schema, key_schema, parse_blob, read_json, row_schema
from lakesink_datasource.debezium.naming import check_connector, table_named
from lakesink_datasource.debezium.one_by_one import TableEvents, json_keys
from lakesink_datasource.debezium.positions import SOURCE_FIELDS, positions_of
from lakesink_datasource.debezium.records import CHANGE_OPS, RECORD, Part, Records, payloads


def read_in_bulk(
    task: Records, topic: Any, prefix: bytes, schema: bytes, members: np.ndarray, blob: bytes, parts: dict[str, list[Part]],
    connectors: dict[str, str],
) -> bool:
    """A topic's records of one schema, their payloads parsed by Arrow in one call. False
    when the payloads are not all what the bulk read takes: read one by one instead."""
    envelope = envelope_schema(schema)
    row = row_schema(schema)
    if row is None or has_map(row):
        return False
    first = msgspec.json.decode(blob[: blob.index(b"\n")], type=dict[str, Any])
    connector = str((first.get("source") or {}).get("connector") or "")
    fields = SOURCE_FIELDS.get(connector.lower())
    if fields is None or envelope is None:
        return False
    if blob.count(b"\n") != len(members):
        return False  # a payload written across lines
    source = pa.struct([pa.field(n, pa.string()) for n in ("connector", "db", "schema", "table")] + [pa.field(n, t) for n, t in fields.items()])
    for numeric in (False, True):
        row_type = read_type(row, numeric)
        explicit = pa.schema([("op", pa.string()), ("before", row_type), ("after", row_type), ("source", source)])
        try:
            parsed = read_json(blob, explicit, "ignore")
            break
        except pa.ArrowInvalid as exc:
            if numeric or "number" not in str(exc):
                return False
    ops = parsed.column("op").combine_chunks()
    if not pc.all(pc.is_in(ops, value_set=pa.array(CHANGE_OPS))).as_py() or ops.null_count:
        return False  # other records in the topic (logical messages...): read one by one
    src = parsed.column("source").combine_chunks()
    if src.null_count or pc.any(pc.not_equal(src.field("connector"), connector)).as_py():
        return False
    indices = members
    after, before = parsed.column("after").combine_chunks(), parsed.column("before").combine_chunks()
    deleting = pc.equal(ops, DELETE_OP)
    image = pc.if_else(deleting, before, after) if pc.any(deleting).as_py() else after
    columns = [convert(image.field(j), f) for j, f in enumerate(row.fields or ())]
    rows = pa.Table.from_arrays(columns, schema=pa.schema([pa.field(f.field or "", arrow_type(f)) for f in row.fields or ()]))
    keys, keyless = _bulk_keys(task, topic, members, ops)
    position = positions_of(connector, src.field, len(members), ops)
    # A topic normally holds one table; grouped by source naming all the same.
    naming = pc.dictionary_encode(pc.binary_join_element_wise(
        pc.fill_null(src.field("db"), ""), pc.fill_null(src.field("schema"), ""), pc.fill_null(src.field("table"), ""), "\x00"
    ))
    codes = naming.indices.to_numpy(zero_copy_only=False)
    for code, name in enumerate(naming.dictionary.to_pylist()):
        db, schema_name, table = name.split("\x00")
        if not table:
            return False
        chosen = np.flatnonzero(codes == code)
        try:
            identifier = table_named(task, (db or None, schema_name or None, table, topic))
        except DebeziumInputError as exc:
            raise DebeziumInputError(str(exc).replace(RECORD, task.where(int(members[int(chosen[0])])))) from None
        take = pa.array(chosen)
        check_connector(connectors, identifier, connector, task, int(members[int(chosen[0])]))
        parts.setdefault(identifier, []).append(Part(
            indices[chosen], ops.take(take), rows.take(take), keys.take(take) if keys is not None else None, keyless[chosen], position.take(take),
        ))
    return True


def _bulk_keys(task: Records, topic: Any, members: np.ndarray, ops: pa.Array) -> tuple[pa.Table | None, np.ndarray]:
    """The message keys of a bulk read: by their own JsonConverter prefix where it is known
    (one Arrow read), else one by one. A truncate's key is none whatever it holds."""
    texts = task.keys
    truncate = pc.equal(ops, TRUNCATE_OP).to_numpy(zero_copy_only=False)
    keyless = ~texts._valid[members] | truncate
    present = np.flatnonzero(~keyless)
    if not len(present):
        return None, keyless
    known = key_prefix(topic)
    if known is not None:
        mask, blob = payloads(texts.array.take(pa.array(members[present])), known[0])
        if mask.all():
            keys = parse_blob(blob, len(present), key_schema(known[1]), None)
            if len(present) == len(members):
                return keys, keyless
            at = np.full(len(members), len(present), dtype=np.int64)
            at[present] = np.arange(len(present))
            padded = pa.concat_tables([keys, pa.Table.from_arrays([pa.nulls(1, f.type) for f in keys.schema], schema=keys.schema)])
            return padded.take(pa.array(at)), keyless
    return _keys_one_by_one(task, members, keyless, topic)


def _keys_one_by_one(task: Records, members: np.ndarray, keyless: np.ndarray, topic: Any) -> tuple[pa.Table | None, np.ndarray]:
    table = TableEvents("")
    for j, i in enumerate(members.tolist()):
        try:
            fields, schema = (None, None) if keyless[j] else read_key(task.keys[i], RECORD, topic)
        except DebeziumInputError as exc:  # named by its place in Kafka, as the one-by-one read names it
            raise DebeziumInputError(str(exc).replace(RECORD, task.where(i))) from None
        table.keys.append(fields)
        table.key_schemas.append(schema)
    return json_keys(table), keyless
