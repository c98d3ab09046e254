"""The schema a commit makes current, so that the files it adds read right (`merge_schema`).

A write that evolves the schema stages the evolved schema before its tasks write: it is added
to the table's schema list but not made current (readers see nothing), which reserves its new
field ids (`last-column-id` moves past them, so no other writer, lakesink or another engine,
can hand them out again). The files are written with that schema. The data commit then makes
it current, in the same snapshot as the data:

* the current schema is still the one the write evolved from: the staged schema becomes
  current as it is;
* another writer changed the schema meanwhile (added its own columns, promoted a type): the
  two are merged by field id, the other writer's columns kept, this write's added, each type
  the wider of the two, and the result is added as a new schema and made current. A change
  that cannot be merged (both promoted one column differently) fails the commit naming the
  column; the table is unchanged.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import AddSchemaUpdate, SetCurrentSchemaUpdate, TableUpdate
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType

from lakesink_datasource.commit.validation import ConflictError, ConflictKind
from lakesink_datasource.schema.evolution import promotion


def _wider(name: str, current: IcebergType, written: IcebergType, format_version: int) -> IcebergType:
    if current == written:
        return current
    if isinstance(current, StructType) and isinstance(written, StructType):
        return StructType(*_fields(name + ".", list(current.fields), list(written.fields), format_version))
    if isinstance(current, ListType) and isinstance(written, ListType):
        element = _wider(f"{name}.element", current.element_type, written.element_type, format_version)
        return ListType(current.element_id, element, element_required=current.element_required and written.element_required)
    if isinstance(current, MapType) and isinstance(written, MapType):
        key = _wider(f"{name}.key", current.key_type, written.key_type, format_version)
        value = _wider(f"{name}.value", current.value_type, written.value_type, format_version)
        return MapType(current.key_id, key, current.value_id, value, value_required=current.value_required and written.value_required)
    if promotion(current, written, format_version) is not None:
        return written  # this write promoted it
    if promotion(written, current, format_version) is not None:
        return current  # another writer promoted it: this write's narrower values read as the wider type
    raise ConflictError(
        ConflictKind.COLUMN_TYPE_CHANGED,
        f"column '{name}' changed type concurrently: {current} in the table now, {written} in this write's files; "
        "the batch is refused (restart the query to write it against the new schema)"
    )


def _fields(prefix: str, current: list[NestedField], written: list[NestedField], format_version: int) -> list[NestedField]:
    ours = {f.field_id: f for f in written}
    out = []
    for f in current:
        mine = ours.pop(f.field_id, None)
        if mine is None:
            out.append(f)  # a column this write does not know: another writer's, kept
            continue
        field_type = _wider(prefix + f.name, f.field_type, mine.field_type, format_version)
        out.append(NestedField(f.field_id, f.name, field_type, required=f.required and mine.required, doc=f.doc))
    out.extend(f for f in written if f.field_id in ours)  # this write's additions, ids reserved
    return out


def schema_updates(base: TableMetadata, written: Schema, evolved_from: int) -> tuple[Schema, list[TableUpdate]]:
    """The schema current after the commit, and the updates that make it so."""
    current = base.schema()
    if current.schema_id == written.schema_id:
        return current, []
    if current.schema_id == evolved_from and base.schema_by_id(written.schema_id) == written:
        return written, [SetCurrentSchemaUpdate(schema_id=written.schema_id)]
    fields = _fields("", list(current.fields), list(written.fields), base.format_version)
    merged = Schema(*fields, schema_id=max(s.schema_id for s in base.schemas) + 1, identifier_field_ids=list(current.identifier_field_ids))
    if merged.as_struct() == current.as_struct():
        return current, []
    return merged, [AddSchemaUpdate(schema_=merged), SetCurrentSchemaUpdate(schema_id=-1)]
