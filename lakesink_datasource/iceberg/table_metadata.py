"""Typed access to the parts of table metadata that differ between format versions.

lakesink writes format versions 2 and 3 (v1 tables are refused when a write is planned).
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata, TableMetadataV2, TableMetadataV3


def last_sequence_number(metadata: TableMetadata) -> int:
    return metadata.last_sequence_number if isinstance(metadata, (TableMetadataV2, TableMetadataV3)) else 0


def next_row_id(metadata: TableMetadata) -> int | None:
    """The table's next row id (v3), None for tables without row lineage."""
    return (metadata.next_row_id or 0) if isinstance(metadata, TableMetadataV3) else None
