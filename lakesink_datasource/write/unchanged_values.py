"""Values a change did not send: keep what the table holds for the key.

Debezium sends an unchanged TOASTed PostgreSQL value (large text, bytea, arrays, json) as a
placeholder, `__debezium_unavailable_value` (option `unavailable_value`; for binary columns
its bytes, for arrays a list of it). Written as is, the placeholder would replace the real
value. Here each placeholder takes the key's value from the change before it in this task
(in sequence order, none deleted in between), else from the row the table holds for the key
(`current_rows.py`). A key the table holds no row for keeps the placeholder: there is no
value to keep, and a visible placeholder can be found and repaired, where a null could not.

Runs on a keyed task's whole input before any of it is written (a key's earlier change in
this task must not be in a file yet, `current_rows.py`), and only when a placeholder is there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO

from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.sharded_index import ShardedIndex
from lakesink_datasource.options import placeholder_bytes
from lakesink_datasource.schema.arrow_align import BatchAligner
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.write.changes import op_kinds
from lakesink_datasource.write.current_rows import read_current_rows

log = logging.getLogger("lakesink")


@dataclass(frozen=True)
class Filled:
    rows: pa.Table
    from_task: int = 0  # placeholders filled from an earlier change in the task
    from_table: int = 0  # ... from the row the table holds
    kept: int = 0  # placeholders of keys the table holds no row for


def placeholder_mask(column: pa.Array | pa.ChunkedArray, text: str) -> np.ndarray | None:
    """Where `column` holds the placeholder, in the form its type takes (None: a type that
    never does)."""
    raw = placeholder_bytes(text)
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _mask(pc.is_in(column, value_set=pa.array(_text_forms(raw), t)))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _mask(pc.equal(column, pa.scalar(raw, t)))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        forms = _nested_forms(raw, t)
        return _nested_mask(column, forms) if forms else None
    return None


def _text_forms(raw: bytes) -> list[str]:
    """A text column's placeholders: the text (text, json, xml, uuid, bytea in hex or base64
    mode...), and an hstore's in `hstore.handling.mode=json` (a one-entry JSON object, as
    Jackson writes it: no spaces)."""
    text = raw.decode(errors="replace")
    return [text, json.dumps({text: text}, ensure_ascii=False, separators=(",", ":"))]


def _nested_forms(raw: bytes, t: pa.DataType) -> list[Any]:
    """The placeholders of a list or map column, as `to_pylist` gives its values: Debezium's
    `UnchangedToastedPlaceholder` by element type (other arrays have no placeholder: its
    converter fails on them, and by default sends null)."""
    text = raw.decode(errors="replace")
    if pa.types.is_map(t):
        return [[(text, text)]]  # hstore, hstore.handling.mode=map
    item = t.value_type
    if pa.types.is_string(item) or pa.types.is_large_string(item):
        return [[text], [_name_uuid(raw)]]  # text[], varchar[], char[], json[], jsonb[]; uuid[]
    if pa.types.is_binary(item) or pa.types.is_large_binary(item):
        return [[raw]]  # bytea[]
    if pa.types.is_integer(item) or pa.types.is_date32(item):
        # integer[], bigint[], date[]: the placeholder's bytes as Java's (signed) numbers; a
        # date[] holds them as days since 1970-01-01.
        numbers = pa.array([b - 256 if b > 127 else b for b in raw], pa.int64())
        return [numbers.cast(pa.int32() if pa.types.is_date32(item) else item).cast(item).to_pylist()]
    return []


def _nested_mask(column: pa.Array | pa.ChunkedArray, forms: list[Any]) -> np.ndarray:
    """Where a list or map column holds one of `forms`: only values of a form's length are
    converted to Python to compare."""
    if pa.types.is_map(column.type):  # no list kernels for maps: their entries' offsets
        whole = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        sizes = np.diff(np.asarray(whole.offsets.to_numpy(zero_copy_only=False), dtype=np.int64))
        lengths = np.where(np.asarray(whole.is_valid().to_numpy(zero_copy_only=False), dtype=bool), sizes, -1)
    else:
        lengths = np.asarray(pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False))
    candidates = np.flatnonzero(np.isin(lengths, [len(f) for f in forms]))
    mask = np.zeros(len(column), dtype=bool)
    if len(candidates):
        values = column.take(pa.array(candidates)).to_pylist()
        mask[candidates] = np.fromiter((v in forms for v in values), dtype=bool, count=len(candidates))
    return mask


def _mask(result: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(result, False).to_numpy(zero_copy_only=False), dtype=bool)


def _name_uuid(raw: bytes) -> str:
    """Java's UUID.nameUUIDFromBytes (a version 3 UUID of the bytes, no namespace)."""
    digest = bytearray(hashlib.md5(raw).digest())
    digest[6] = (digest[6] & 0x0F) | 0x30
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def fill_unchanged(rows: pa.Table, plan: WritePlan, aligner: BatchAligner, index: ShardedIndex, io: FileIO) -> Filled:
    """`rows` (a keyed task's whole input) with every placeholder replaced where a value exists."""
    keyed, text = plan.keyed, plan.options.unavailable_value
    if keyed is None or text is None or rows.num_rows == 0:
        return Filled(rows)
    masks: dict[str, np.ndarray] = {}
    for source in plan.column_sources:
        if source is None or source in keyed.key_sources or source in keyed.sequence_sources:
            continue
        mask = placeholder_mask(rows.column(source), text)
        if mask is not None and mask.any():
            masks[source] = mask
    if not masks:
        return Filled(rows)
    n = rows.num_rows
    aligned = aligner.align(rows)
    keys = encode_keys([aligned.column(c) for c in keyed.table_key_columns], names=list(keyed.table_key_columns))
    deleting = (
        op_kinds(rows.column(keyed.op_source), keyed.op_source, plan.options.delete_ops) if keyed.op_source else np.zeros(n, dtype=bool)
    )
    sort_columns = {"k": pa.array(keys, pa.binary())}
    if keyed.sequence_sources:
        sort_columns["s"] = pa.array(encode_keys([rows.column(c) for c in keyed.sequence_sources], names=list(keyed.sequence_sources)), pa.binary())
    sort_columns["r"] = pa.array(np.arange(n, dtype=np.int64))
    order = pc.sort_indices(pa.table(sort_columns), sort_keys=[(name, "ascending") for name in sort_columns]).to_numpy()
    sorted_keys = sort_columns["k"].take(pa.array(order))
    at = np.arange(n)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = pc.not_equal(sorted_keys.slice(1), sorted_keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    segment = np.maximum.accumulate(np.where(starts, at, 0))
    deleted_at = np.maximum.accumulate(np.where(deleting[order], at, -1))
    reset = np.maximum(segment, deleted_at)
    table_rows = None
    out = rows
    totals = [0, 0, 0]
    for source, mask in masks.items():
        placeholder = (mask & ~deleting)[order]
        valid = ~mask[order] & ~deleting[order]
        last_valid = np.maximum.accumulate(np.where(valid, at, -1))
        in_task = placeholder & (last_valid >= reset)
        from_table = placeholder & ~in_task & (deleted_at < segment)
        take = np.arange(n, dtype=np.int64)  # into [the column, the table's values]
        take[order[in_task]] = order[last_valid[in_task]]
        column = rows.column(source).combine_chunks()
        values = column
        if from_table.any():
            if table_rows is None:
                wanted = [keys[i] for i in order[from_table]]
                table_rows = _table_values(index, io, wanted, plan, aligner, list(masks))
            found_keys, present, current = table_rows
            by_key = {k: j for j, k in enumerate(found_keys)}
            table_column = current.column(source).combine_chunks()
            for i in order[from_table].tolist():
                j = by_key.get(keys[i])
                if j is not None and present[j]:
                    take[i] = n + j
                    totals[1] += 1
                else:
                    totals[2] += 1
            values = pa.concat_arrays([column, table_column.cast(column.type) if table_column.type != column.type else table_column])
        totals[0] += int(in_task.sum())
        out = out.set_column(out.schema.get_field_index(source), out.schema.field(source), values.take(pa.array(take)))
    if totals[2]:
        log.warning(
            "lakesink: %d unchanged value(s) (option unavailable_value) of %s are for keys the table holds no row for: "
            "they keep the placeholder", totals[2], plan.identifier,
        )
    return Filled(out, *totals)


def _table_values(
    index: ShardedIndex, io: FileIO, keys: list[bytes], plan: WritePlan, aligner: BatchAligner, sources: list[str]
) -> tuple[list[bytes], np.ndarray, pa.Table]:
    """The table's current values of the source columns `sources` for `keys` (unique)."""
    unique = list(dict.fromkeys(keys))
    table_of = {s: t for t, s in zip(aligner.schema.names, plan.column_sources) if s is not None}
    schema = pa.schema([aligner.schema.field(table_of[s]) for s in sources])
    current = read_current_rows(index, io, unique, schema)
    renamed = current.rows.rename_columns(sources)
    return unique, current.present, renamed
