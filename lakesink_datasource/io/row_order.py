"""A table's sort order applied to rows: what a data file's rows are sorted by within it.

Iceberg sorts by each sort field's transformed source value (identity, bucket, truncate,
year, month, day, hour, void), ascending or descending, nulls first or last, field after
field; a writer that sorted a file records the order's id in the file's manifest entry, and
Parquet's own `sorting_columns` say it for the leading identity fields (Parquet cannot name a
transform). Strings and binary compare by their bytes, as Iceberg's comparators do; NaN sorts
as Arrow sorts it (after every number, either direction), where Iceberg puts it last
ascending and first descending.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import IdentityTransform, VoidTransform

from lakesink_datasource.io.partitioning import PartitionSplitter

_FIRST_FIELD_ID = 1000  # ids of the stand-in partition fields that compute the sort keys


@dataclass(frozen=True)
class RowOrder:
    """`order` (the table's sort order `order_id`) over rows of `schema`'s Arrow form."""

    order_id: int
    order: SortOrder
    schema: Schema

    @classmethod
    def of(cls, order: SortOrder | None, schema: Schema) -> RowOrder | None:
        """The row order of a sort order; None for the unsorted order (or none)."""
        if order is None or order.is_unsorted:
            return None
        return cls(order.order_id, order, schema)

    @cached_property
    def _keys(self) -> PartitionSplitter:
        fields = [
            PartitionField(f.source_id, _FIRST_FIELD_ID + i, f.transform, f"sort_{i}") for i, f in enumerate(self.order.fields)
        ]
        return PartitionSplitter(PartitionSpec(*fields), self.schema)

    def indices(self, table: pa.Table) -> pa.Array:
        """The row order that sorts `table` (stable: ties keep their input order)."""
        columns = self._keys.transformed(table)
        keys = []
        arrays = {}
        for i, (field, values) in enumerate(zip(self.order.fields, columns)):
            if isinstance(field.transform, VoidTransform):
                continue  # always null: orders nothing
            name = f"k{i}"
            arrays[name] = values
            keys.append((
                name,
                "ascending" if field.direction == SortDirection.ASC else "descending",
                "at_start" if field.null_order == NullOrder.NULLS_FIRST else "at_end",
            ))
        if not keys:
            return pa.array(range(table.num_rows), pa.int64())
        # Ties broken by input position: a stable sort, whatever the kernel does.
        arrays["_position"] = pa.array(range(table.num_rows), pa.int64())
        keys.append(("_position", "ascending", "at_end"))
        return pc.sort_indices(pa.table(arrays), sort_keys=keys)

    def follows(self, last: pa.Table, first: pa.Table) -> bool:
        """Whether the one row of `first` may come after the one row of `last` in a run
        sorted by this order (ties may: the sort is stable)."""
        return self.indices(pa.concat_tables([last, first])).to_pylist() == [0, 1]

    def sort(self, table: pa.Table) -> pa.Table:
        return table.take(self.indices(table)) if table.num_rows > 1 else table

    def sorting_columns(self, arrow_schema: pa.Schema) -> list[pq.SortingColumn] | None:
        """Parquet's sorting columns: the leading identity sort fields on top-level columns
        (the rest of the order is a transform Parquet cannot name, or nested)."""
        out = []
        names = {f.field_id: f.name for f in self.schema.fields}
        for field in self.order.fields:
            name = names.get(field.source_id)
            if not isinstance(field.transform, IdentityTransform) or name is None:
                break
            out.append(pq.SortingColumn(
                arrow_schema.get_field_index(name), descending=field.direction == SortDirection.DESC,
                nulls_first=field.null_order == NullOrder.NULLS_FIRST,
            ))
        return out or None
