"""Spark's pushed filters -> Iceberg expressions, for the filters whose meaning is the same.

A filter is taken only when Iceberg evaluates it exactly as Spark does, because a taken
filter is not evaluated again by Spark: it prunes partitions and files (by their column
bounds) and row groups, and drops rows. Comparisons, IN, IS [NOT] NULL and LIKE 'abc%' on
integer, string, boolean, decimal, date and timestamp columns qualify (a null never matches
either side). Left to Spark: float and double columns (Spark orders NaN above every number,
Iceberg and Arrow do not), NOT, null-safe equality, LIKE '%abc' / '%abc%', and literals whose
type does not fit the column.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    NotNull,
    StartsWith,
)
from pyiceberg.expressions.literals import (
    BooleanLiteral,
    DateLiteral,
    DecimalLiteral,
    Literal,
    LongLiteral,
    StringLiteral,
    TimestampLiteral,
)
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import datasource as spark

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# pyiceberg's predicates build through __new__, which its annotations do not describe.
_MAKE: dict[str, Any] = {
    "EqualTo": EqualTo, "GreaterThan": GreaterThan, "GreaterThanOrEqual": GreaterThanOrEqual, "LessThan": LessThan,
    "LessThanOrEqual": LessThanOrEqual, "In": In, "IsNull": IsNull, "IsNotNull": NotNull, "StringStartsWith": StartsWith,
}
# Spark's filter classes (PySpark 4.1+; 4.0 pushes no filter to a Python source, and has none).
FILTER_PUSHDOWN = hasattr(spark, "Filter")
_COMPARISONS = {
    getattr(spark, name) for name in ("EqualTo", "GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual")
    if hasattr(spark, name)
}


def _micros(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _literal(value: Any, column_type: IcebergType) -> Literal[Any] | None:
    """`value` as an Iceberg literal of `column_type`, or None when it does not fit exactly."""
    if value is None:
        return None
    if isinstance(column_type, (IntegerType, LongType)) and isinstance(value, int) and not isinstance(value, bool):
        return LongLiteral(value)
    if isinstance(column_type, StringType) and isinstance(value, str):
        return StringLiteral(value)
    if isinstance(column_type, BooleanType) and isinstance(value, bool):
        return BooleanLiteral(value)
    if isinstance(column_type, DecimalType) and isinstance(value, Decimal):
        return DecimalLiteral(value)
    if isinstance(column_type, DateType) and isinstance(value, date) and not isinstance(value, datetime):
        return DateLiteral((value - date(1970, 1, 1)).days)
    if isinstance(column_type, TimestamptzType) and isinstance(value, datetime) and value.tzinfo is not None:
        return TimestampLiteral(_micros(value))
    if isinstance(column_type, TimestampType) and isinstance(value, datetime) and value.tzinfo is None:
        return TimestampLiteral(_micros(value.replace(tzinfo=timezone.utc)))  # wall-clock time, no zone
    return None


def _column(schema: Schema, path: tuple[str, ...]) -> tuple[str, IcebergType] | None:
    name = ".".join(path)
    try:
        field = schema.find_field(name, case_sensitive=False)
    except ValueError:
        return None
    return schema.find_column_name(field.field_id) or name, field.field_type


def to_iceberg(f: spark.Filter, schema: Schema) -> BooleanExpression | None:
    """The Iceberg expression that means exactly what `f` means to Spark, or None."""
    column = _column(schema, tuple(f.attribute)) if hasattr(f, "attribute") else None
    if column is None:
        return None
    name, column_type = column
    make: Any = _MAKE.get(type(f).__name__)
    if make is None:
        return None  # NOT, null-safe equality, LIKE '%abc' and '%abc%'
    value = getattr(f, "value", None)
    if isinstance(f, (spark.IsNull, spark.IsNotNull)):
        return make(name)
    if isinstance(f, spark.StringStartsWith):
        return make(name, value) if isinstance(column_type, StringType) and isinstance(value, str) else None
    if isinstance(f, spark.In):
        literals = [_literal(v, column_type) for v in value or ()]
        if not literals or any(lit is None for lit in literals):
            return None  # an IN list with a null or a mistyped value: Spark's three-valued logic
        return make(name, literals)
    if type(f) not in _COMPARISONS:
        return None
    lit = _literal(value, column_type)
    if lit is None or (isinstance(lit, BooleanLiteral) and not isinstance(f, spark.EqualTo)):
        return None
    return make(name, lit)


def conjunction(expressions: list[BooleanExpression]) -> BooleanExpression:
    out: BooleanExpression = AlwaysTrue()
    for e in expressions:
        out = e if isinstance(out, AlwaysTrue) else And(out, e)
    return out
