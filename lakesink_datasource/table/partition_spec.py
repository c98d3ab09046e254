"""Parse the `partition_by` option into an Iceberg partition spec.

Syntax follows Spark SQL's PARTITIONED BY transforms:
`days(ts), bucket(16, id), truncate(4, name), category`.
"""

from __future__ import annotations

import re

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import NestedField

from lakesink_datasource.options import OptionError

_FIRST_PARTITION_FIELD_ID = 1000
_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\(\s*(.*?)\s*\)\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")

_TIME = {
    "years": (YearTransform, "year"),
    "year": (YearTransform, "year"),
    "months": (MonthTransform, "month"),
    "month": (MonthTransform, "month"),
    "days": (DayTransform, "day"),
    "day": (DayTransform, "day"),
    "date": (DayTransform, "day"),
    "hours": (HourTransform, "hour"),
    "hour": (HourTransform, "hour"),
    "date_hour": (HourTransform, "hour"),
}


def split_terms(text: str, option: str = "partition_by") -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    if depth != 0:
        raise OptionError(f"option '{option}' has unbalanced parentheses: {text!r}")
    return [t.strip() for t in terms]


def parse_term(term: str, option: str = "partition_by") -> tuple[Transform, str, str]:
    """(transform, source column, partition field name suffix) for one term."""
    call = _CALL.match(term)
    if call is None:
        if not _NAME.match(term):
            raise OptionError(f"option '{option}': cannot parse {term!r}")
        return IdentityTransform(), term, ""
    func, args = call.group(1).lower(), [a.strip() for a in call.group(2).split(",")]
    if func in _TIME and len(args) == 1:
        cls, suffix = _TIME[func]
        return cls(), args[0], f"_{suffix}"
    if func in ("bucket", "truncate") and len(args) == 2:
        try:
            width = int(args[0])
        except ValueError:
            raise OptionError(f"option '{option}': {func} needs an integer first argument in {term!r}") from None
        if width <= 0:
            raise OptionError(f"option '{option}': {func} width must be positive in {term!r}")
        if func == "bucket":
            return BucketTransform(width), args[1], "_bucket"
        return TruncateTransform(width), args[1], "_trunc"
    if func == "identity" and len(args) == 1:
        return IdentityTransform(), args[0], ""
    if func == "void" and len(args) == 1:
        return VoidTransform(), args[0], "_null"
    raise OptionError(
        f"option '{option}': unknown transform {term!r} (use identity, bucket(N, col), truncate(W, col), "
        "years/months/days/hours(col), void(col))"
    )


def source_field(schema: Schema, transform: Transform, column: str, term: str, option: str = "partition_by") -> NestedField:
    """The column a term's transform applies to; OptionError when it is not in `schema` or the
    transform cannot take its type."""
    try:
        source = schema.find_field(column, case_sensitive=False)
    except ValueError:
        raise OptionError(f"option '{option}': column '{column}' is not in the schema") from None
    if not transform.can_transform(source.field_type):
        raise OptionError(f"option '{option}': {term!r} cannot be applied to column '{column}' of type {source.field_type}")
    return source


def parse_partition_spec(text: str | None, schema: Schema) -> PartitionSpec:
    """Build a spec against `schema`; OptionError names the option and the bad term."""
    if text is None or not text.strip():
        return PartitionSpec()
    fields = []
    names: set[str] = set()
    for offset, term in enumerate(split_terms(text)):
        if not term:
            raise OptionError(f"option 'partition_by' has an empty term: {text!r}")
        transform, column, suffix = parse_term(term)
        source = source_field(schema, transform, column, term)
        name = source.name + suffix if "." not in column else column.replace(".", "_") + suffix
        if name in names:
            raise OptionError(f"option 'partition_by': partition field {name!r} appears twice")
        names.add(name)
        fields.append(PartitionField(source.field_id, _FIRST_PARTITION_FIELD_ID + offset, transform, name))
    return PartitionSpec(*fields)


def describe_spec(spec: PartitionSpec, schema: Schema) -> str:
    """`spec` in the `partition_by` syntax ("days(ts), bucket(4, id)"; "unpartitioned")."""
    terms = [describe_term(f.transform, f.source_id, schema) for f in spec.fields]
    return ", ".join(terms) or "unpartitioned"


def describe_term(t: Transform, source_id: int, schema: Schema) -> str:
    """A transform of a column in the option syntax: "id", "bucket(4, id)", "days(ts)"."""
    column = schema.find_column_name(source_id) or f"field {source_id}"
    if isinstance(t, IdentityTransform):
        return column
    if isinstance(t, BucketTransform):
        return f"bucket({t.num_buckets}, {column})"
    if isinstance(t, TruncateTransform):
        return f"truncate({t.width}, {column})"
    if isinstance(t, (YearTransform, MonthTransform, DayTransform, HourTransform)):
        return f"{t!s}s({column})"
    return f"{t}({column})"


def same_layout(a: PartitionSpec, b: PartitionSpec) -> bool:
    """Do two specs partition rows alike (same sources and transforms, in order)? Names and
    field ids do not matter."""
    return [(f.source_id, str(f.transform)) for f in a.fields] == [(f.source_id, str(f.transform)) for f in b.fields]
