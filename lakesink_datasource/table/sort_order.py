"""The `sort_by` option: the sort order of a table lakesink creates, in Spark's and Iceberg's
`WRITE ORDERED BY` words: `"id"`, `"days(ts), id DESC"`, `"bucket(16, k) ASC NULLS LAST"`.

Each term is a `partition_by` expression (a column, or identity / bucket / truncate / years /
months / days / hours of one) then an optional direction (ASC, the default, or DESC) and null
order (NULLS FIRST or NULLS LAST; by default first when ascending, last when descending, as
Spark and Iceberg Java default).
"""

from __future__ import annotations

import re

from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder

from lakesink_datasource.options import OptionError
from lakesink_datasource.table.partition_spec import describe_term, parse_term, source_field, split_terms

_SUFFIX = re.compile(r"^(.*?)(?:\s+(ASC|DESC))?(?:\s+NULLS\s+(FIRST|LAST))?\s*$", re.IGNORECASE | re.DOTALL)


def parse_sort_order(text: str | None, schema: Schema) -> SortOrder | None:
    """The sort order `text` names against `schema` (None for no option); OptionError names
    the option and the term it cannot use."""
    if text is None or not text.strip():
        return None
    fields = []
    for term in split_terms(text, "sort_by"):
        found = _SUFFIX.match(term)
        assert found is not None  # every string matches: the groups are optional
        expression, direction, nulls = found.group(1).strip(), (found.group(2) or "ASC").upper(), found.group(3)
        if not expression:
            raise OptionError(f"option 'sort_by' has an empty term: {text!r}")
        transform, column, _ = parse_term(expression, "sort_by")
        source = source_field(schema, transform, column, expression, "sort_by")
        descending = direction == "DESC"
        null_order = (NullOrder.NULLS_LAST if descending else NullOrder.NULLS_FIRST) if nulls is None else (
            NullOrder.NULLS_FIRST if nulls.upper() == "FIRST" else NullOrder.NULLS_LAST
        )
        fields.append(SortField(
            source_id=source.field_id, transform=transform,
            direction=SortDirection.DESC if descending else SortDirection.ASC, null_order=null_order,
        ))
    return SortOrder(*fields, order_id=1)


def describe_order(order: SortOrder, schema: Schema) -> str:
    """`order` in the `sort_by` syntax ("unsorted" for none)."""
    if order.is_unsorted:
        return "unsorted"
    terms = []
    for f in order.fields:
        expression = describe_term(f.transform, f.source_id, schema)
        direction = "DESC" if f.direction == SortDirection.DESC else "ASC"
        nulls = "NULLS FIRST" if f.null_order == NullOrder.NULLS_FIRST else "NULLS LAST"
        terms.append(f"{expression} {direction} {nulls}")
    return ", ".join(terms)


def same_order(a: SortOrder, b: SortOrder) -> bool:
    """The same fields in the same order (ids aside)."""
    return [(f.source_id, str(f.transform), f.direction, f.null_order) for f in a.fields] == [
        (f.source_id, str(f.transform), f.direction, f.null_order) for f in b.fields
    ]
