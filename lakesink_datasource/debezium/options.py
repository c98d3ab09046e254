"""The options of `cdc_format=debezium`: which columns hold Spark's Kafka records, and how a
source table is named in the catalog. Everything else (tables, keys, ops, order, types) comes
from the events."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from lakesink_datasource.options import OptionError

CDC_FORMATS = ("debezium",)
DEFAULT_PLACEHOLDER = "__debezium_unavailable_value"
# Options of the Debezium format itself (the rest apply to every table, as in a routed write).
DEBEZIUM_OPTIONS = ("cdc_format", "key_column", "value_column", "table_name")
# What the events decide: refused, named, when given.
DECIDED_BY_EVENTS = ("table_column", "payload_column", "operation", "primary_key", "op_column", "sequence_column", "delete_ops")


class DebeziumOptions(msgspec.Struct, frozen=True, kw_only=True):
    key_column: str = "key"
    value_column: str = "value"
    # Spark's Kafka source's other columns, where the DataFrame has them (None: it has not).
    topic_column: str | None = "topic"
    partition_column: str | None = "partition"
    offset_column: str | None = "offset"
    table_name: str = "{table}"
    table_name_given: bool = False  # False: the default, which refuses two source tables of one name
    namespace: str | None = None


def parse_debezium(raw: Mapping[str, str]) -> DebeziumOptions:
    given = {k.lower(): v for k, v in raw.items()}
    fmt = given.get("cdc_format", "").strip().lower()
    if fmt not in CDC_FORMATS:
        raise OptionError(f"option 'cdc_format' must be one of {', '.join(CDC_FORMATS)}, got {given.get('cdc_format')!r}")
    for name in DECIDED_BY_EVENTS:
        if name in given or any(k.startswith("tables.") and k.rsplit(".", 1)[-1] == name for k in given):
            raise OptionError(
                f"option '{name}' cannot be given with cdc_format=debezium: the events say each record's table, key, op and "
                "order (its position in the source's log); leave it out"
            )
    template = given.get("table_name", "{table}").strip() or "{table}"
    if not any(f"{{{p}}}" in template for p in ("table", "topic")):
        raise OptionError(f"option 'table_name' {template!r} must contain {{table}} or {{topic}}: every source table needs a table of its own")
    namespace = given.get("namespace", "").strip() or None
    if namespace is None and "." not in template:
        raise OptionError(
            "cdc_format=debezium needs option 'namespace' (each source table becomes <namespace>.<table>), or a 'table_name' "
            "template with a namespace part, e.g. '{db}.{table}'"
        )
    return DebeziumOptions(
        key_column=given.get("key_column", "key").strip() or "key",
        value_column=given.get("value_column", "value").strip() or "value",
        table_name=template,
        table_name_given=bool(given.get("table_name", "").strip()),
        namespace=namespace,
    )
