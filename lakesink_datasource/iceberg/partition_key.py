"""Partition values as bytes: the key tasks group rows by and messages carry.

A partition key is a tuple with one Iceberg single-value serialization per partition field
(None for null), the same bytes as manifest bounds, so every partition type round-trips
exactly between executors and the driver.
"""

from __future__ import annotations

import uuid
from typing import Any

from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import DecimalType, IcebergType, PrimitiveType, UUIDType
from pyiceberg.utils.decimal import decimal_to_bytes

PartitionKey = tuple[bytes | None, ...]


def decode_partition(spec: PartitionSpec, schema: Schema, key: PartitionKey) -> Record:
    """Turn serialized partition values back into a Record of Iceberg internal values."""
    fields = spec.partition_type(schema).fields
    if len(fields) != len(key):
        raise ValueError(f"Partition key has {len(key)} values, spec {spec.spec_id} has {len(fields)} fields")
    return Record(*[None if b is None else value_from_bytes(f.field_type, b) for f, b in zip(fields, key)])


def encode_partition(spec: PartitionSpec, schema: Schema, record: Record) -> PartitionKey:
    """A manifest's partition Record -> the serialized key tasks and messages use."""
    fields = spec.partition_type(schema).fields
    return tuple(None if record[i] is None else value_to_bytes(_primitive(f.field_type), record[i]) for i, f in enumerate(fields))


def partition_path(spec: PartitionSpec, schema: Schema, key: PartitionKey) -> str:
    """The Hive-style `name=value/...` directory of a partition ("" when unpartitioned)."""
    if spec.is_unpartitioned():
        return ""
    return spec.partition_to_path(decode_partition(spec, schema, key), schema)


def value_to_bytes(kind: PrimitiveType, value: Any) -> bytes:
    if isinstance(kind, DecimalType):
        # truncate[W] can round a decimal past its declared precision (truncate[50] of
        # -9999999.51 in decimal(9,2) is -10000000.00); pyiceberg's to_bytes rejects that,
        # while Java serializes the unscaled value regardless. Do the same.
        return decimal_to_bytes(value)
    return to_bytes(kind, value)


def _primitive(kind: IcebergType) -> PrimitiveType:
    # Partition fields are results of transforms of primitive columns: always primitive.
    assert isinstance(kind, PrimitiveType), f"partition field of type {kind}"
    return kind


def value_from_bytes(kind: IcebergType, value: bytes) -> Any:
    decoded = from_bytes(_primitive(kind), value)
    # from_bytes leaves UUIDs as 16 bytes; pyiceberg reads manifests' UUID partitions back as
    # uuid.UUID, and only that renders as the canonical string in partition paths.
    if isinstance(kind, UUIDType) and isinstance(decoded, bytes):
        return uuid.UUID(bytes=decoded)
    return decoded
