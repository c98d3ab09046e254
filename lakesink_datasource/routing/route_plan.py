"""The driver's plan of a write routed to many tables: what every task gets.

The tables a batch touches are only known once its rows are read, so the driver checks the
options and the DataFrame's columns and names the write; each task plans the tables it meets
(`table.setup.plan_routed_table`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping

import msgspec
from pyspark.sql.types import BinaryType, IntegerType, LongType, MapType, StringType, StructType

from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.index.key_shards import SHARD_BY_TEXT, SHARD_COLUMN
from lakesink_datasource.options import OptionError
from lakesink_datasource.routing.route_options import RoutingOptions, parse_routing


class RoutedWrite(msgspec.Struct, frozen=True, kw_only=True):
    options: RoutingOptions
    write_id: str

    def table_write_id(self, identifier: str) -> str:
        """One table's write id in this write: the same in every task (a table's files and
        index tokens of one batch are one write's)."""
        return hashlib.sha256(f"{self.write_id}:{identifier}".encode()).hexdigest()[:32]


def plan_routed_write(raw: Mapping[str, str], schema: StructType, overwrite: bool) -> RoutedWrite:
    """Check a routed write before any task runs; refuse, naming the option or column, what
    cannot be written."""
    options = parse_routing(raw)
    if overwrite:
        what = "cdc_format" if options.debezium is not None else "table_column"
        raise OptionError(f"option '{what}' routes rows into tables by appending or by key; an overwrite of many tables is not supported")
    if options.debezium is not None:
        return RoutedWrite(options=msgspec.structs.replace(options, debezium=_kafka_columns(options.debezium, schema)), write_id=uuid.uuid4().hex)
    route = next((f for f in schema.fields if f.name == SHARD_COLUMN), None)
    if route is not None and not route.metadata.get(SHARD_BY_TEXT):
        raise OptionError(
            "the DataFrame was routed by cluster_by_key to one table's key shards: write it without 'table_column', or "
            "route it with cluster_by_key(df, table_column=..., ...) to write many tables"
        )
    names = {f.name.lower(): f for f in schema.fields}
    column = names.get(options.table_column.lower())
    if column is None:
        raise OptionError(f"option 'table_column': column '{options.table_column}' is not in the DataFrame ({', '.join(schema.fieldNames())})")
    if not isinstance(column.dataType, StringType):
        raise OptionError(f"option 'table_column': column '{options.table_column}' is {column.dataType.simpleString()}, not a string")
    for role in ("payload_column", "key_column"):
        given = getattr(options, role)
        if given is None:
            continue
        field = names.get(given.lower())
        if field is None:
            raise OptionError(f"option '{role}': column '{given}' is not in the DataFrame ({', '.join(schema.fieldNames())})")
        if not isinstance(field.dataType, (StringType, StructType, MapType)):
            raise OptionError(
                f"option '{role}': column '{given}' is {field.dataType.simpleString()}: give a JSON string, a struct or a map"
            )
    if options.key_column is not None and options.payload_column is None:
        raise OptionError("option 'key_column' needs 'payload_column': the key's fields complete each table's row there")
    options = msgspec.structs.replace(
        options, table_column=column.name,
        payload_column=names[options.payload_column.lower()].name if options.payload_column else None,
        key_column=names[options.key_column.lower()].name if options.key_column else None,
    )
    return RoutedWrite(options=options, write_id=uuid.uuid4().hex)


def _kafka_columns(debezium: DebeziumOptions, schema: StructType) -> DebeziumOptions:
    """The DataFrame's columns of Spark's Kafka source, as named (value, key) or found (topic,
    partition, offset: without them, errors name records by their place in the input and
    the Kafka offset does not break ties)."""
    names = {f.name.lower(): f for f in schema.fields}
    value = names.get(debezium.value_column.lower())
    if value is None:
        raise OptionError(
            f"option 'value_column': column '{debezium.value_column}' is not in the DataFrame ({', '.join(schema.fieldNames())}); "
            "cdc_format=debezium reads Spark's Kafka source: give its 'value' column (or name yours with value_column)"
        )
    if not isinstance(value.dataType, (BinaryType, StringType, StructType)):
        raise OptionError(
            f"option 'value_column': column '{value.name}' is {value.dataType.simpleString()}: give the record's value as "
            "Kafka's bytes or a string of JSON, or Debezium's envelope as a struct (decoded from Avro or Protobuf)"
        )
    key = names.get(debezium.key_column.lower())
    if key is None:
        raise OptionError(
            f"option 'key_column': column '{debezium.key_column}' is not in the DataFrame ({', '.join(schema.fieldNames())}); "
            "Debezium's message key holds each row's primary key: keep Kafka's 'key' column (or name yours with key_column)"
        )
    if not isinstance(key.dataType, (BinaryType, StringType, StructType)):
        raise OptionError(f"option 'key_column': column '{key.name}' is {key.dataType.simpleString()}: give Kafka's bytes, JSON text or a struct")
    found = {}
    for role, expected in (("topic", StringType), ("partition", IntegerType), ("offset", LongType)):
        field = names.get(role)
        found[role] = field.name if field is not None and isinstance(field.dataType, expected) else None
    return msgspec.structs.replace(
        debezium, value_column=value.name, key_column=key.name, topic_column=found["topic"], partition_column=found["partition"],
        offset_column=found["offset"],
    )
