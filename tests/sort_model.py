"""Iceberg's sort order as a plain-Python model: what a sorted data file's rows must look
like, written without lakesink's code (tests compare `RowOrder` and written files with it).

Per sort field, the transformed source value (pyiceberg's scalar transforms, which take
timestamps as microseconds), ascending or descending, nulls first or last; strings compare
by their UTF-8 bytes, as Iceberg's comparator does; ties keep their input order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import VoidTransform

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _internal(value: object) -> object:
    """A source value as pyiceberg's scalar transforms take it (timestamps as micros)."""
    if isinstance(value, dt.datetime):
        epoch = _EPOCH_UTC if value.tzinfo is not None else _EPOCH
        return (value - epoch) // dt.timedelta(microseconds=1)
    return value


def _comparable(value: object) -> object:
    return value.encode() if isinstance(value, str) else value


def model_sorted(rows: list[dict], order: SortOrder, schema: Schema) -> list[dict]:
    """`rows` in `order`: a plain stable sort per field, last field first."""
    out = list(rows)
    for field in reversed(order.fields):
        if isinstance(field.transform, VoidTransform):
            continue
        source = schema.find_field(field.source_id)
        fn = field.transform.transform(source.field_type)

        def key(row: dict, name: str = source.name, fn: Callable = fn) -> object:
            value = _internal(row[name])
            return None if value is None else fn(value)

        present = [r for r in out if key(r) is not None]
        missing = [r for r in out if key(r) is None]
        # sort(reverse=True) keeps ties in input order (Python's sort is stable both ways).
        present.sort(key=lambda r: _comparable(key(r)), reverse=field.direction == SortDirection.DESC)
        out = missing + present if field.null_order == NullOrder.NULLS_FIRST else present + missing
    return out


def is_sorted(rows: list[dict], order: SortOrder, schema: Schema) -> bool:
    """Whether `rows` are in `order` (ties in any order)."""
    resorted = model_sorted(rows, order, schema)
    keys = [f for f in order.fields if not isinstance(f.transform, VoidTransform)]

    def key_of(row: dict) -> tuple:
        out = []
        for field in keys:
            source = schema.find_field(field.source_id)
            value = _internal(row[source.name])
            out.append(None if value is None else field.transform.transform(source.field_type)(value))
        return tuple(out)

    return [key_of(r) for r in rows] == [key_of(r) for r in resorted]


__all__ = ["SortField", "is_sorted", "model_sorted"]
