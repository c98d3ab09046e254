"""Which table a source table's events go to (option `table_name`), and the checks that keep
two source tables out of one table: in a task, across a batch's tasks, across batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from lakesink_datasource.debezium.envelope import (
    DebeziumInputError,
)
from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.debezium.records import RECORD, Records, SourceName


def check_connector(connectors: dict[str, str], identifier: str, connector: str, task: Records, i: int) -> None:
    held = connectors.setdefault(identifier, connector)
    if held != connector:
        raise DebeziumInputError(f"{task.where(i)}: table {identifier} gets events of connectors {held!r} and {connector!r}")


def table_named(task: Records, naming: tuple[Any, ...]) -> str:
    """The table a source table's events go to; two source tables the default template names
    alike (`public.orders`, `sales.orders`) are refused, before their rows mix."""
    identifier = _identifier(task.options, naming)
    source: SourceName = (naming[0], naming[1], naming[2])
    held = task.sources.setdefault(identifier, source)
    if held != source and not task.options.table_name_given:
        raise DebeziumInputError(f"{RECORD}: {merged_sources(identifier, [held, source])}")
    return identifier


def merged_sources(identifier: str, sources: Sequence[Sequence[str | None]]) -> str:
    """Why the events of two source tables cannot go to one table under the default template,
    and the template that keeps them apart."""
    names = sorted({".".join(str(p) for p in s if p is not None) for s in sources})
    parts = ["{db}"] if len({s[0] for s in sources}) > 1 else []
    parts += ["{schema}"] if len({s[1] for s in sources}) > 1 else []
    template = "_".join([*(parts or ["{schema}"]), "{table}"])
    return (
        f"table {identifier} would get the events of source tables {' and '.join(names)}: option 'table_name' (default "
        f"'{{table}}') names both so, and their rows would mix. Give option table_name a template that keeps them apart, "
        f"e.g. '{template}' ({{db}}, {{schema}}, {{table}}, {{topic}} are the source's names). Nothing was written"
    )


# The table property a table made from one source table's events records it in (JSON: db,
# schema, table), so a later batch of another source table of the same name is refused.
SOURCE_PROPERTY = "lakesink.debezium.source"


def source_property(source: SourceName) -> str:
    return msgspec.json.encode(list(source)).decode()


def check_table_source(identifier: str, source: SourceName, properties: Mapping[str, str]) -> None:
    """Refuse events of `source` for a table another source table's events made."""
    recorded = properties.get(SOURCE_PROPERTY)
    if recorded is None or recorded == source_property(source):
        return
    try:
        held = msgspec.json.decode(recorded, type=tuple[str | None, str | None, str])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # not lakesink's: nothing to compare
    raise DebeziumInputError(merged_sources(identifier, [held, source]))


def check_batch_sources(sources: Iterable[Mapping[str, Sequence[str | None]]]) -> None:
    """The driver's check over a batch's tasks (each saw some Kafka partitions): one source
    table per table."""
    seen: dict[str, Sequence[str | None]] = {}
    for task in sources:
        for identifier, source in task.items():
            held = seen.setdefault(identifier, source)
            if list(held) != list(source):
                raise DebeziumInputError(merged_sources(identifier, [held, source]))


def _identifier(options: DebeziumOptions, naming: tuple[Any, ...]) -> str:
    db, schema, table, topic = naming
    if not table:
        raise DebeziumInputError(f"{RECORD} is a change event without source.table: lakesink cannot tell its table. Nothing was written")
    parts = {"db": db, "schema": schema, "table": table, "topic": topic}
    try:
        name = options.table_name.format(**{k: _name_part(v) for k, v in parts.items()})
    except (KeyError, IndexError, ValueError) as exc:
        raise DebeziumInputError(f"option 'table_name' {options.table_name!r}: {exc!r} (use {{db}}, {{schema}}, {{table}}, {{topic}})") from None
    if "." in name:
        return name
    if options.namespace is None:
        raise DebeziumInputError(f"option 'table_name' gives {name!r} for {RECORD}: give option 'namespace' for its namespace")
    return f"{options.namespace}.{name}"


def _name_part(value: Any) -> str:
    # A source name becomes one part of a table name: a dot would start another part, and
    # slashes would make directories.
    text = "" if value is None else str(value)
    return text.replace(".", "_").replace("/", "_").replace("\\", "_")
