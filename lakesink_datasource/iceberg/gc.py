"""`gc.enabled=false`: a table whose files no maintenance may delete.

Iceberg's `snapshot` procedure and `add_files` make tables that reference files another
table owns; `gc.enabled=false` is what keeps those files alive. Iceberg Java refuses to
expire snapshots or remove orphans of such a table ("GC is disabled (deleting files may
corrupt other tables)"). lakesink deletes none of its referenced or unreferenced files
either: no orphan removal, and expired snapshots leave the metadata only (the metadata
stays bounded; their files stay where they are). Files lakesink itself wrote and no
snapshot ever referenced (a lost commit attempt's, an aborted batch's) still go: they
cannot be another table's.
"""

from __future__ import annotations

from collections.abc import Mapping

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.properties import GC_ENABLED, gc_enabled

GC_OFF_NOTE = (
    f"maintenance that deletes files is off: table property {GC_ENABLED}=false (its files may be shared with another "
    "table); expired snapshots leave the metadata, their files and orphans stay"
)


class GcDisabled(LakesinkError, RuntimeError):
    """A deletion of table files refused because the table has gc.enabled=false."""


def refuse_deleting(properties: Mapping[str, str], table: str, what: str) -> None:
    """Raise GcDisabled naming the property when `table` may not have its files deleted."""
    if not gc_enabled(properties):
        raise GcDisabled(
            f"cannot {what} of {table}: table property {GC_ENABLED}=false (deleting its files may corrupt other tables "
            f"that share them, as Iceberg Java refuses too); nothing was deleted. If no other table shares its files, "
            f"set {GC_ENABLED}=true first"
        )
