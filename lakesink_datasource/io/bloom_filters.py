"""Parquet Bloom filters as the table's properties ask for them, in pyarrow's terms.

Iceberg names them per column (`write.parquet.bloom-filter-enabled.column.<name>`, with
`write.parquet.bloom-filter-fpp.column.<name>`, default 0.01) and caps every filter at
`write.parquet.bloom-filter-max-bytes` (1 MiB); parquet-java then sizes a split-block
filter of that many bytes. pyarrow sizes a filter from an expected number of distinct
values (NDV) and the false-positive probability instead, so the NDV given to it is the
largest one whose optimal filter fits the cap: the same filter size Java writes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import pyarrow as pa

log = logging.getLogger("lakesink")


def ndv_for(max_bytes: int, fpp: float) -> int:
    """The NDV whose optimal split-block Bloom filter at `fpp` takes `max_bytes` (the inverse
    of parquet's OptimalNumOfBits, m = -8 ndv / ln(1 - fpp^(1/8)))."""
    bits = max_bytes * 8
    return max(1, math.floor(-bits * math.log(1 - fpp ** (1 / 8)) / 8))


def column_paths(schema: pa.Schema) -> set[str]:
    """Every leaf column's dotted path, as Parquet names them (structs only: Iceberg's names)."""
    out: set[str] = set()

    def walk(prefix: str, field: pa.Field) -> None:
        name = f"{prefix}{field.name}"
        if pa.types.is_struct(field.type):
            for child in field.type:
                walk(f"{name}.", child)
        else:
            out.add(name)

    for field in schema:
        walk("", field)
    return out


def bloom_filter_options(columns: Mapping[str, float], max_bytes: int, schema: pa.Schema) -> dict[str, dict] | None:
    """pyarrow's `bloom_filter_options` for `columns` (name -> fpp) of `schema`; a column the
    schema does not have is skipped with a warning (it may have been dropped since the
    property was set), None when no filter is asked for."""
    if not columns:
        return None
    present = column_paths(schema)
    out: dict[str, dict] = {}
    for name, fpp in sorted(columns.items()):
        if name not in present:
            log.warning("lakesink: table property write.parquet.bloom-filter-enabled.column.%s names no column of the "
                        "table; no Bloom filter written for it", name)
            continue
        out[name] = {"ndv": ndv_for(max_bytes, fpp), "fpp": fpp}
    return out or None
