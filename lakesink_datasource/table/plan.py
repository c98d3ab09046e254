"""The write plan: the small picklable object the driver hands to every task.

It pins the table state the batch was planned against (a metadata file location),
so tasks read table metadata from storage once per process instead of asking the
catalog, and so a task can tell that its batch was already committed.
"""

from __future__ import annotations

from typing import Optional

import msgspec

from lakesink_datasource.catalog.loader import CatalogConfig
from lakesink_datasource.options import WriteOptions


class WritePlan(msgspec.Struct, frozen=True, kw_only=True):
    write_id: str  # unique per planned write; recorded in the snapshot summary
    options: WriteOptions
    catalog: CatalogConfig
    identifier: str
    metadata_location: str
    io_properties: dict[str, str]
    format_version: int
    overwrite: bool
    column_sources: list[Optional[str]]  # per table column, the DataFrame column feeding it
    planned_snapshot_id: Optional[int]
