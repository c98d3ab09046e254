"""Property test: random sequences of schema evolutions (added columns, added nested fields,
promotions, omitted columns, structs sent with fewer or reordered fields) and partition
evolutions interleaved with append and upsert batches and compactions, written with
`merge_schema=true` (and `evolve_partition=true`) through the production path and checked
after every batch against a plain-Python model (key -> row) with DuckDB and pyiceberg."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

import pyarrow as pa
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from lakesink_testing import duckdb_rows, expected_rows, load, pyiceberg_rows
from pyspark.sql import types as T

from lakesink_datasource.datasource import _commit
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import write_task

IDENT = "db.t"
NAMES = ["c0", "c1", "c2", "c3"]


@dataclass
class Source:
    """The upstream schema as it drifts: which value columns it sends, whether each is still
    int or already long, and which fields its struct column `s` has."""

    ints: dict[str, bool] = field(default_factory=lambda: {"c0": False})  # name -> promoted to long
    nested: list[str] = field(default_factory=lambda: ["a", "b"])
    table_columns: set[str] = field(default_factory=set)  # every column a write has sent

    def spark(self) -> T.StructType:
        fields = [T.StructField("id", T.LongType(), False)]
        fields += [T.StructField(n, T.LongType() if wide else T.IntegerType()) for n, wide in self.ints.items()]
        fields.append(T.StructField("s", T.StructType([T.StructField(f, T.StringType()) for f in self.nested])))
        return T.StructType(fields)

    def arrow(self) -> pa.Schema:
        fields = [pa.field("id", pa.int64(), False)]
        fields += [pa.field(n, pa.int64() if wide else pa.int32()) for n, wide in self.ints.items()]
        fields.append(pa.field("s", pa.struct([(f, pa.string()) for f in self.nested])))
        return pa.schema(fields)

    def row(self, key: int, version: int) -> dict:
        values = {n: (2**40 + version if wide else version) for n, wide in self.ints.items()}
        return {"id": key, **values, "s": {f: f"{f}{version}" for f in self.nested}}


steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(NAMES)),
        st.tuples(st.just("promote"), st.sampled_from(NAMES)),
        st.tuples(st.just("omit"), st.sampled_from(NAMES)),
        st.tuples(st.just("nested"), st.sampled_from(["c", "d"])),
        # A writer whose struct lacks a field the table has, or orders its fields differently.
        st.tuples(st.just("nested_drop"), st.sampled_from(["a", "b", "c", "d"])),
        st.tuples(st.just("nested_reverse"), st.none()),
        st.tuples(st.just("append"), st.lists(st.integers(0, 1000), min_size=1, max_size=4, unique=True)),
        st.tuples(st.just("upsert"), st.lists(st.integers(0, 12), min_size=1, max_size=6, unique=True)),
        # Partition evolution: later writes ask for this layout with evolve_partition=true.
        st.tuples(st.just("partition"), st.sampled_from(["bucket(2, id)", "bucket(4, id)", "truncate(5, id)"])),
        st.tuples(st.just("compact"), st.none()),
    ),
    min_size=2,
    max_size=12,
)


def _spec_ids(warehouse: str) -> list[int]:
    """The partition spec of each live data file."""
    table = load(warehouse, IDENT)
    return [e.data_file.spec_id for e in live_data_files(table.io, table.current_snapshot())]


def _model_row(row: dict, source: Source) -> dict:
    """What a reader sees for a row `source` wrote: every column the table has, null where
    the row's source did not send it (s as its fields, missing ones null)."""
    out = {"id": row["id"]}
    for name in source.table_columns:
        out[name] = row.get(name)
    return out


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=steps)
def test_evolutions_interleaved_with_appends_and_upserts_match_the_model(plan: list[tuple]) -> None:
    warehouse = tempfile.mkdtemp(prefix="evolve-")
    source = Source()
    live: dict[int, dict] = {}
    appended: list[dict] = []
    version = 0
    fresh = 1000
    first = True
    layout: str | None = None
    for step, arg in plan:
        note(f"{step} {arg}")
        event(step)
        if step == "add" and arg not in source.ints:
            source.ints[arg] = False
        elif step == "promote" and arg in source.ints:
            source.ints[arg] = True
        elif step == "omit" and arg in source.ints and len(source.ints) > 1:
            del source.ints[arg]
        elif step == "nested" and arg not in source.nested:
            source.nested.append(arg)
        elif step == "nested_drop" and arg in source.nested and len(source.nested) > 1:
            source.nested.remove(arg)
        elif step == "nested_reverse":
            source.nested.reverse()
        elif step == "partition":
            layout = arg
        elif step == "compact" and not first:
            # Rewrites every small file, old-spec ones into the current spec: rows unchanged.
            compact(load(warehouse, IDENT), budget_bytes=1 << 40, tiered=False)
            assert set(_spec_ids(warehouse)) <= {load(warehouse, IDENT).metadata.default_spec_id}
        if step in ("append", "upsert"):
            version += 1
            if step == "append":  # appends use fresh keys only
                keys = list(range(fresh, fresh + len(arg)))
                fresh += len(arg)
            else:
                keys = arg
            source.table_columns |= set(source.ints)
            records = [source.row(k, version) for k in keys]
            options = {"table": IDENT, "warehouse": warehouse, "progress": "false", "merge_schema": "true",
                       "index_dir": f"{warehouse}/idx", "operation": "upsert" if step == "upsert" else "append"}
            if first:  # the table is created keyed (appends then use fresh keys only)
                options.update(primary_key="id", operation="upsert")
            if layout is not None:
                options.update(partition_by=layout, evolve_partition="true")
            written = plan_write(parse_options(options), source.spark(), overwrite=False)
            _commit(written, [write_task(written, iter([pa.RecordBatch.from_pylist(records, schema=source.arrow())]))], None)
            first = False
            for r in records:
                if step == "upsert":
                    live[r["id"]] = r
                else:
                    appended.append(r)
        if step in ("append", "upsert") or (step == "compact" and not first):
            table = load(warehouse, IDENT)
            columns = ["id", *sorted(source.table_columns)]
            assert sorted(f.name for f in table.schema().fields) == sorted([*columns, "s"])
            expected = expected_rows([_model_row(r, source) for r in [*live.values(), *appended]], columns)
            assert pyiceberg_rows(table, columns) == expected
            assert duckdb_rows(table.metadata_location, columns) == expected
            nested = {r["id"]: r["s"] for r in table.scan().to_arrow().to_pylist()}
            for r in [*live.values(), *appended]:
                assert {k: v for k, v in nested[r["id"]].items() if v is not None} == r["s"]
