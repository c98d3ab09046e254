"""Keyed streams on the same keys keep running: keys another commit wrote while a batch was in
flight are decided at commit, and no query stops (commit/key_conflicts.py).

Four streaming queries run at once in the test session, 50 micro-batches each: two upsert
streams on the same 1,000 keys of one table, two cdc streams with a sequence column (late
and early sequences interleaved, deletes among them) on the same 1,000 keys of another.
The streams share one index directory, as queries on one host do (each query keeps its own
index in it). The cdc table runs lakesink's maintenance (compaction, expiry) beside them.
All four finish every batch they were given; the upsert table holds, for every key, the row
of the last commit that wrote it (commit order read back from the table's history); the cdc
table holds, for every key, the change with the highest sequence of all the input (a
delete: no row). DuckDB and pyiceberg agree, and `check` finds nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lakesink_testing import assert_readers_see, expected_rows, load
from pyiceberg.manifest import DataFileContent, ManifestEntryStatus
from pyiceberg.table.snapshots import Operation

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.live_files import entries_changed_by
from lakesink_datasource.iceberg.summary_keys import KEYS_REDECIDED
from lakesink_datasource.table.idempotency import last_epoch_property

pytestmark = pytest.mark.slow
KEYS = 1000
# Per stream. Each batch of one stream is usually overtaken by the other's commit, so its
# host's index starts over (index/sync.py, `_overtaken`): 150 batches took 7 minutes of CI.
BATCHES = 50
ROWS = 400  # per batch


def _write_sources(root: Path, stream: int, *, cdc: bool) -> Path:
    """One Parquet file per micro-batch: ROWS distinct keys each. cdc: the sequence grows
    with the batch number, jittered by up to +-1.5 batches, so each stream has changes both
    older and newer than the other's (no two changes share a sequence: the low digits count
    the stream's rows, the lowest bit is the stream); one change in ten is a delete."""
    rng = random.Random(stream * 7919 + cdc)
    counter = iter(range(1, 1 << 30))
    folder = root / f"{'cdc' if cdc else 'upsert'}-{stream}"
    folder.mkdir(parents=True)
    for b in range(BATCHES):
        ids = rng.sample(range(KEYS), ROWS)
        columns: dict[str, pa.Array] = {"id": pa.array(ids, pa.int64()), "v": pa.array([f"s{stream}b{b}k{i}" for i in ids])}
        if cdc:
            columns["seq"] = pa.array([(b * 100 + rng.randint(-150, 150)) * 200_000 + next(counter) * 2 + stream for _ in ids], pa.int64())
            columns["op"] = pa.array([rng.choice("uuuuuuuuud") for _ in ids])
        pq.write_table(pa.table(columns), folder / f"part-{b:04d}.parquet")
    return folder


def _upsert_expected(warehouse: str, ident: str) -> Counter:
    """The last row committed for each key, by commit order: every keyed batch's added rows
    applied in the order of the table's history (its own hidden rows aside, a batch adds one
    row per key it wrote: each key once in each batch's input)."""
    table = load(warehouse, ident)
    live: dict[int, dict] = {}
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0):
        if snapshot.summary is None or snapshot.summary.operation == Operation.REPLACE:
            continue  # a compaction moves rows, it writes none
        for entry in entries_changed_by(table.io, snapshot, ManifestEntryStatus.ADDED):
            if entry.data_file.content != DataFileContent.DATA:
                continue
            with table.io.new_input(entry.data_file.file_path).open() as f:
                for row in pq.read_table(f, columns=["id", "v"]).to_pylist():
                    live[row["id"]] = row
    return expected_rows(list(live.values()), ["id", "v"])


def _cdc_expected(sources: list[Path], base: list[dict]) -> Counter:
    """The change with the highest sequence of every key over the base rows and all the input
    (no two share a sequence: a tie would go to the later commit, which the test does not
    control)."""
    best: dict[int, dict] = {r["id"]: {**r, "op": "u"} for r in base}
    for folder in sources:
        for path in sorted(folder.glob("*.parquet")):
            for row in pq.read_table(path).to_pylist():
                if row["id"] not in best or row["seq"] > best[row["id"]]["seq"]:
                    best[row["id"]] = row
    return expected_rows([{"id": r["id"], "v": r["v"], "seq": r["seq"]} for r in best.values() if r["op"] != "d"], ["id", "v", "seq"])


def test_keyed_streams_on_the_same_keys_all_keep_committing_and_the_tables_are_exact(spark, tmp_path: Path, warehouse: str) -> None:  # type: ignore[no-untyped-def]
    spark.createDataFrame([(i, "base") for i in range(KEYS)], "id long, v string").write.format("lakesink").option(
        "warehouse", warehouse).option("operation", "upsert").option("primary_key", "id").option("maintenance", "off").mode("append").save("db.up")
    cdc_base = [{"id": i, "v": "base", "seq": -(10**12)} for i in range(KEYS)]
    # A keyed write creates it, so the table's identifier field is the key (`check` then looks for duplicates).
    spark.createDataFrame(cdc_base, "id long, v string, seq long").write.format("lakesink").option(
        "warehouse", warehouse).option("operation", "upsert").option("primary_key", "id").mode("append").save("db.cdc")
    upsert_sources = [_write_sources(tmp_path, s, cdc=False) for s in (0, 1)]
    cdc_sources = [_write_sources(tmp_path, s, cdc=True) for s in (0, 1)]
    queries = []
    for n, folder in enumerate(upsert_sources):
        df = spark.readStream.schema("id long, v string").option("maxFilesPerTrigger", 1).parquet(str(folder))
        queries.append(
            df.repartition(2, "id").writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / f"ck-up{n}"))
            .option("warehouse", warehouse).option("table", "db.up").option("operation", "upsert").option("primary_key", "id")
            .option("maintenance", "off").option("progress", "false").option("index_dir", str(tmp_path / "index"))
            .trigger(availableNow=True).start()
        )
    for n, folder in enumerate(cdc_sources):
        df = spark.readStream.schema("id long, v string, seq long, op string").option("maxFilesPerTrigger", 1).parquet(str(folder))
        queries.append(
            df.repartition(2, "id").writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / f"ck-cdc{n}"))
            .option("warehouse", warehouse).option("table", "db.cdc").option("operation", "cdc").option("primary_key", "id")
            .option("op_column", "op").option("sequence_column", "seq").option("progress", "false")
            .option("index_dir", str(tmp_path / "index")).trigger(availableNow=True).start()
        )
    for query in queries:
        query.awaitTermination()
        assert query.exception() is None, query.exception()

    for ident, per_query in (("db.up", [q.id for q in queries[:2]]), ("db.cdc", [q.id for q in queries[2:]])):
        table = load(warehouse, ident)
        for query_id in per_query:  # every batch of both queries committed
            assert table.metadata.properties.get(last_epoch_property(str(query_id))) == str(BATCHES - 1), (ident, query_id)
        # The streams did collide: keys were decided at commit (else this test shows nothing).
        props = [s.summary.additional_properties for s in table.metadata.snapshots if s.summary is not None]
        decided = sum(int(p.get(KEYS_REDECIDED, 0)) for p in props)
        print(f"{ident}: {decided} keys decided at commit over {len(props)} snapshots")
        assert decided > 0, ident
        assert check_table(table) == []

    assert_readers_see(warehouse, "db.up", _upsert_expected(warehouse, "db.up"), ["id", "v"])
    assert_readers_see(warehouse, "db.cdc", _cdc_expected(cdc_sources, cdc_base), ["id", "v", "seq"])
