"""Iceberg v3 row lineage as stored in data files.

Every row of a v3 table has a `_row_id`: written into the file (a rewrite keeps the ids of
the rows it moves) or, where the column is absent or null, inherited as the file's
`first_row_id` + the row's position. Readers know the two lineage columns by their
reserved field ids, whatever they are named in a file.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

ROW_ID_FIELD_ID = 2147483540
LAST_UPDATED_FIELD_ID = 2147483539
ROW_ID = "_row_id"
LAST_UPDATED = "_last_updated_sequence_number"
FIELD_ID_KEY = b"PARQUET:field_id"
UNKNOWN_ROW_ID = -1  # no id stored and none to inherit (a v2 file, a rewrite without lineage)


def field_ids(schema: pa.Schema) -> dict[int, int]:
    """Parquet field id -> column index, for top-level columns that have one."""
    out = {}
    for i, f in enumerate(schema):
        if f.metadata and FIELD_ID_KEY in f.metadata:
            out[int(f.metadata[FIELD_ID_KEY])] = i
    return out


def row_ids(table: pa.Table, positions: np.ndarray, first_row_id: int | None) -> np.ndarray:
    """The `_row_id` of the rows at `positions` of a data file read into `table` (with its
    Parquet field ids): stored ids where present, else `first_row_id` + position, else
    UNKNOWN_ROW_ID."""
    inherited = positions.astype(np.int64) + first_row_id if first_row_id is not None else None
    column = field_ids(table.schema).get(ROW_ID_FIELD_ID)
    if column is None:
        return inherited if inherited is not None else np.full(len(positions), UNKNOWN_ROW_ID, dtype=np.int64)
    stored = table.column(column).take(pa.array(positions)).cast(pa.int64())
    fallback = pa.array(inherited) if inherited is not None else pa.array(np.full(len(positions), UNKNOWN_ROW_ID, dtype=np.int64))
    return np.asarray(pc.coalesce(stored, fallback).to_numpy(zero_copy_only=False), dtype=np.int64)


def read_with_row_ids(io: FileIO, path: str, columns: Sequence[str]) -> pa.Table:
    """The `columns` of a data file plus its stored `_row_id` column, if it has one (found by
    field id), and nothing else: enough for `row_ids` without reading the whole file."""
    with io.new_input(path).open() as stream:
        parquet = pq.ParquetFile(stream)
        schema = parquet.schema_arrow
        wanted = list(columns)
        stored = field_ids(schema).get(ROW_ID_FIELD_ID)
        if stored is not None and schema.names[stored] not in wanted:
            wanted.append(schema.names[stored])
        return parquet.read(columns=wanted)
