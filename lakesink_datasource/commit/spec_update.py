"""The default partition spec a commit sets, so that new files go to the evolved layout
(`evolve_partition`).

The spec was staged before the tasks wrote (`table/spec_staging.py`): it is in the table's
spec list, so the files name an existing spec whatever the commit does. The commit makes it
the default in the data's snapshot. The default spec only says how *new* files are laid out
(files of every spec stay valid and readable), so when another writer changed the default
meanwhile, this commit's layout wins: it is what this write was asked for, and the next
write with another `partition_by` changes it again.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import SetDefaultSpecUpdate, TableUpdate

from lakesink_datasource.commit.validation import ConflictError, ConflictKind


def default_spec_updates(base: TableMetadata, spec_id: int) -> list[TableUpdate]:
    """The updates that make `spec_id` the default spec of `base` (none if it is)."""
    if spec_id not in base.specs():
        # Only a metadata clean-up by another engine (removing unused specs) gets here.
        raise ConflictError(
            ConflictKind.SPEC_REMOVED,
            f"partition spec {spec_id}, which this batch's files were written with, was removed from the table "
            "meanwhile; the batch is refused (restart the query to write it again)"
        )
    return [] if base.default_spec_id == spec_id else [SetDefaultSpecUpdate(spec_id=spec_id)]
