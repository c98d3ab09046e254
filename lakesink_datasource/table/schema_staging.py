"""Stage an evolved schema before the tasks write (`merge_schema`).

The evolved schema is added to the table's schema list without becoming current: readers see
no change, but its new field ids are taken (`last-column-id` moves past them), so files written
with it can never meet another column under the same id. The data commit makes it current
(`commit/schema_update.py`); a write that never commits leaves an unused schema entry behind,
which Iceberg allows and any engine's metadata cleanup may drop.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AddSchemaUpdate, AssertCurrentSchemaId, AssertLastAssignedFieldId, SetCurrentSchemaUpdate
from pyspark.sql.types import StructType

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.commit_loop import CommitLoop, Done
from lakesink_datasource.catalog.transient import catalog_unavailable
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.retry import Exhausted, Failure, RetryClock, Spent
from lakesink_datasource.schema.evolution import merge_schema


class StagingRaced(LakesinkError, RuntimeError):
    """Other writers kept changing the table's schema or specs while this write staged its own."""


@dataclass(frozen=True)
class StagedSchema:
    table: Table  # as the staging commit left it
    schema: Schema
    evolved_from: int  # id of the schema it evolved from
    changes: list[str]


def staging_spent(what: str, catalog: str) -> Exhausted:
    """The error once staging's budget is spent: other writers' races, or the catalog."""
    unavailable = catalog_unavailable(catalog, f"{what}: ")

    def build(spent: Spent) -> BaseException:
        if spent.kind is Failure.RACE:
            return StagingRaced(f"could not finish {what}: other writers kept changing the table ({spent.describe()})")
        return unavailable(spent)

    return build


def _staged(metadata: TableMetadata, base: TableMetadata, schema: Schema) -> Schema | None:
    """The schema of `metadata` a staging of `schema` on `base` left: one `base` lacks with
    the same fields (the lost commit landed, or another writer staged the same evolution)."""
    known = {s.schema_id for s in base.schemas}
    return next((s for s in metadata.schemas if s.schema_id not in known and s.fields == schema.fields), None)


def stage_evolution(
    table: Table, incoming: StructType, key_columns: tuple[str, ...], *, clock: RetryClock, make_current: bool = False
) -> StagedSchema | None:
    """Stage the schema that accepts `incoming` (None when the current one already does).

    `make_current`: the evolved schema becomes current at once, in the same metadata commit
    (a routed write's tasks evolve the tables they meet: several tasks can then write with
    one schema, where a staged one would be each task's own). `clock`: the planning's: a
    race is staged again on the table as it is then, and a commit whose answer was lost is
    settled by reading the table (as the data commit settles its own), never sent blindly."""
    identifier = ".".join(table.name())
    what = f"staging the evolved schema of {identifier}"
    catalog = table.catalog
    sent: list[_Attempt] = []  # the attempt last sent

    def build(table: Table) -> _Attempt | Done[StagedSchema | None]:
        metadata = table.metadata
        current = metadata.schema()
        evolution = merge_schema(
            current, incoming, last_column_id=metadata.last_column_id, format_version=metadata.format_version,
            key_columns=key_columns,
        )
        if not evolution.changed:
            return Done(None)
        schema = Schema(
            *evolution.schema.fields,
            schema_id=max(s.schema_id for s in metadata.schemas) + 1,
            identifier_field_ids=list(current.identifier_field_ids),
        )
        sent[:] = [_Attempt(metadata, schema, evolution.changes)]
        return sent[0]

    def send(table: Table, attempt: _Attempt) -> StagedSchema | None:
        base = attempt.base
        response = sql_commit.commit(
            table,
            requirements=(
                AssertCurrentSchemaId(current_schema_id=base.current_schema_id),
                AssertLastAssignedFieldId(last_assigned_field_id=base.last_column_id),
            ),
            updates=(AddSchemaUpdate(schema_=attempt.schema), *((SetCurrentSchemaUpdate(schema_id=-1),) if make_current else ())),
        )
        staged = Table(table.name(), metadata=response.metadata, metadata_location=response.metadata_location, io=table.io, catalog=table.catalog)
        return StagedSchema(staged, attempt.schema, base.current_schema_id, attempt.changes)

    def landed(table: Table) -> StagedSchema | None:
        # The staging sent last, found in the table (or another writer's of the same schema).
        attempt = sent[0]
        found = _staged(table.metadata, attempt.base, attempt.schema)
        if found is None or (make_current and table.metadata.current_schema_id != found.schema_id):
            return None
        return StagedSchema(table, found, attempt.base.current_schema_id, attempt.changes)

    loop: CommitLoop[_Attempt, StagedSchema | None] = CommitLoop(
        clock.scoped(what), what, catalog, identifier, build, send, landed,
        exhausted=staging_spent(what, f"catalog {catalog.name!r}"),
    )
    return loop.run(table)


@dataclass(frozen=True)
class _Attempt:
    base: TableMetadata
    schema: Schema
    changes: list[str]
