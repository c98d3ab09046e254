"""Stage a new partition spec before the tasks write (`evolve_partition`).

As with an evolved schema (`schema_staging.py`), the spec is added to the table's spec list
without becoming the default: readers and other writers see no change, but its spec id and
any new partition field ids are taken, so the files the tasks write name a spec that exists.
The data commit makes it the default (`commit/spec_update.py`), in the data's snapshot.

Field ids follow Iceberg's rule for evolution: a field that partitions by the same source
and transform as a field of any earlier spec keeps that field's id (and name), so readers
see one partition field across specs; every other field gets a fresh id past
`last-partition-id`. A spec laid out like an existing one is not added again: that one is
reused (a stream whose first batch is planned twice, or a table going back to an earlier
layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AddPartitionSpecUpdate, AssertLastAssignedPartitionId
from pyiceberg.transforms import BucketTransform, TruncateTransform

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.commit_loop import CommitLoop, Done
from lakesink_datasource.iceberg.retry import RetryClock
from lakesink_datasource.table.partition_spec import same_layout
from lakesink_datasource.table.schema_staging import StagingRaced, staging_spent

_FIRST_PARTITION_FIELD_ID = 1000


@dataclass(frozen=True)
class StagedSpec:
    table: Table  # as staging left it (unchanged when an existing spec was reused)
    spec: PartitionSpec
    evolved_from: int  # the default spec id when it was staged


def existing_spec(metadata: TableMetadata, wanted: PartitionSpec) -> PartitionSpec | None:
    """The table's spec laid out like `wanted`, if it has one."""
    return next((s for s in metadata.partition_specs if same_layout(s, wanted)), None)


def _unique_name(field: PartitionField, taken: set[str]) -> str:
    # Java names evolved fields by their parameter too (id_bucket_8): use that, then the id.
    name = field.name
    if name in taken and isinstance(field.transform, (BucketTransform, TruncateTransform)):
        width = field.transform.num_buckets if isinstance(field.transform, BucketTransform) else field.transform.width
        name = f"{field.name}_{width}"
    return name if name not in taken else f"{field.name}_{field.field_id}"


def assign_field_ids(metadata: TableMetadata, wanted: PartitionSpec) -> PartitionSpec:
    """`wanted` (ids as parsed) with the ids and names evolution gives it in this table."""
    known: dict[tuple[int, str], PartitionField] = {}
    names: set[str] = set()
    for spec in metadata.partition_specs:
        for f in spec.fields:
            known.setdefault((f.source_id, str(f.transform)), f)
            names.add(f.name)
    next_id = max(metadata.last_partition_id or _FIRST_PARTITION_FIELD_ID - 1, _FIRST_PARTITION_FIELD_ID - 1) + 1
    fields = []
    for f in wanted.fields:
        earlier = known.get((f.source_id, str(f.transform)))
        if earlier is not None:
            fields.append(earlier)
            continue
        fresh = PartitionField(f.source_id, next_id, f.transform, f.name)
        # A name an earlier spec gave another field would make two fields one to a reader
        # that goes by name.
        fields.append(PartitionField(f.source_id, next_id, f.transform, _unique_name(fresh, names | {g.name for g in fields})))
        next_id += 1
    spec_id = max(s.spec_id for s in metadata.partition_specs) + 1
    return PartitionSpec(*fields, spec_id=spec_id)


def stage_spec(table: Table, wanted: PartitionSpec, *, clock: RetryClock) -> StagedSpec:
    """Make sure the table has a spec laid out like `wanted` (adding it, not as the default,
    when it has none) and return it. `clock`: the planning's: after a race or a lost answer
    the table is read again, and a spec laid out like `wanted` there (this staging's, landed
    after all, or another writer's) is the one."""
    identifier = ".".join(table.name())
    what = f"staging the new partition spec of {identifier}"
    catalog = table.catalog

    def build(table: Table) -> tuple[TableMetadata, PartitionSpec] | Done[StagedSpec]:
        # Decided on the table as it is: a spec laid out like `wanted` there is the one.
        metadata = table.metadata
        reuse = existing_spec(metadata, wanted)
        if reuse is not None:
            return Done(StagedSpec(table, reuse, metadata.default_spec_id))
        return metadata, assign_field_ids(metadata, wanted)

    def send(table: Table, attempt: tuple[TableMetadata, PartitionSpec]) -> StagedSpec:
        metadata, spec = attempt
        response = sql_commit.commit(
            table,
            # Another writer adding a spec (or partition field) meanwhile moves last-partition-id.
            requirements=(AssertLastAssignedPartitionId(last_assigned_partition_id=metadata.last_partition_id),),
            updates=(AddPartitionSpecUpdate(spec=spec),),
        )
        staged = Table(table.name(), metadata=response.metadata, metadata_location=response.metadata_location, io=table.io, catalog=table.catalog)
        # As the catalog stored it: a REST catalog may assign the spec id itself.
        stored = existing_spec(response.metadata, wanted)
        if stored is None:
            raise StagingRaced(f"the catalog did not keep the new partition spec of {identifier}")
        return StagedSpec(staged, stored, metadata.default_spec_id)

    def landed(table: Table) -> StagedSpec | None:
        found = existing_spec(table.metadata, wanted)
        return StagedSpec(table, found, table.metadata.default_spec_id) if found is not None else None

    loop: CommitLoop[tuple[TableMetadata, PartitionSpec], StagedSpec] = CommitLoop(
        clock.scoped(what), what, catalog, identifier, build, send, landed,
        exhausted=staging_spent(what, f"catalog {catalog.name!r}"),
    )
    return loop.run(table)
