"""Stage an evolved schema before the tasks write (`merge_schema`).

The evolved schema is added to the table's schema list without becoming current: readers see
no change, but its new field ids are taken (`last-column-id` moves past them), so files written
with it can never meet another column under the same id. The data commit makes it current
(`commit/schema_update.py`); a write that never commits leaves an unused schema entry behind,
which Iceberg allows and any engine's metadata cleanup may drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.update import AddSchemaUpdate, AssertCurrentSchemaId, AssertLastAssignedFieldId, SetCurrentSchemaUpdate
from pyspark.sql.types import StructType

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.transient import retrying
from lakesink_datasource.schema.evolution import merge_schema

_ATTEMPTS = 10


@dataclass(frozen=True)
class StagedSchema:
    table: Table  # as the staging commit left it
    schema: Schema
    evolved_from: int  # id of the schema it evolved from
    changes: list[str]


def stage_evolution(
    table: Table, incoming: StructType, key_columns: tuple[str, ...], *, make_current: bool = False
) -> StagedSchema | None:
    """Stage the schema that accepts `incoming` (None when the current one already does).

    `make_current`: the evolved schema becomes current at once, in the same metadata commit
    (a routed write's tasks evolve the tables they meet: several tasks can then write with
    one schema, where a staged one would be each task's own)."""
    for _ in range(_ATTEMPTS):
        metadata = table.metadata
        current = metadata.schema()
        evolution = merge_schema(
            current, incoming, last_column_id=metadata.last_column_id, format_version=metadata.format_version,
            key_columns=key_columns,
        )
        if not evolution.changed:
            return None
        schema = Schema(
            *evolution.schema.fields,
            schema_id=max(s.schema_id for s in metadata.schemas) + 1,
            identifier_field_ids=list(current.identifier_field_ids),
        )
        try:
            response = retrying(
                partial(
                    sql_commit.commit,
                    table,
                    requirements=(
                        AssertCurrentSchemaId(current_schema_id=current.schema_id),
                        AssertLastAssignedFieldId(last_assigned_field_id=metadata.last_column_id),
                    ),
                    updates=(AddSchemaUpdate(schema_=schema), *((SetCurrentSchemaUpdate(schema_id=-1),) if make_current else ())),
                ),
                what=f"staging the evolved schema of {'.'.join(table.name())}", catalog=f"catalog {table.catalog.name!r}",
            )
        except CommitFailedException:
            table = sql_commit.load_table(table.catalog, ".".join(table.name()))
            continue
        staged = Table(table.name(), metadata=response.metadata, metadata_location=response.metadata_location, io=table.io, catalog=table.catalog)
        return StagedSchema(staged, schema, current.schema_id, evolution.changes)
    raise CommitFailedException(f"could not stage the evolved schema of {'.'.join(table.name())}: other writers kept changing it")
