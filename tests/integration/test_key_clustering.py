"""cluster_by_key through Spark (issue 36): Spark's hashes and lakesink's replay of them agree,
each Spark partition holds one key shard, routed streams and batches write exactly what the
model says, every value crosses Spark's pandas operator unchanged, and bad input is refused
before anything runs."""

from __future__ import annotations

import datetime as dt
import math
import os
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from lakesink_testing import assert_readers_see, expected_rows, keys_in_shard_index, load, table_exists

from lakesink_datasource.check import check_table
from lakesink_datasource.iceberg.summary_keys import COMPACTION, HOSTS
from lakesink_datasource.index.key_shards import SHARD_COLUMN, decode_shard, shard_of_keys
from lakesink_datasource.index.spark_hash import murmur3_long, xxhash64

pytestmark = pytest.mark.spark

# --------------------------------------------------------------------------- Spark's hashes

_LONG = st.integers(-(1 << 63), (1 << 63) - 1)
_ROWS = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(-(1 << 31), (1 << 31) - 1)),
        st.one_of(st.none(), _LONG),
        st.one_of(st.none(), st.text(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=70)),
        st.one_of(st.none(), st.dates()),
        st.one_of(st.none(), st.booleans()),
        st.one_of(st.none(), st.decimals(min_value=-(10**16) + 1, max_value=10**16 - 1, places=2, allow_nan=False)),
        st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))),
    ),
    min_size=1,
    max_size=30,
)
_HASH_SCHEMA = "i int, l long, s string, b binary, d date, t boolean, dec decimal(18,2), ts timestamp_ntz"


@settings(max_examples=examples(20), deadline=None)
@given(rows=_ROWS)
def test_the_replayed_hashes_equal_sparks(spark, rows: list[tuple]) -> None:
    """Every routable type, nulls, and columns chained as xxhash64(c1, c2, ...) chains them;
    and the Murmur3 of a bigint HashPartitioning takes."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(rows, _HASH_SCHEMA)
    names = ["i", "l", "s", "b", "d", "t", "dec", "ts"]
    got = df.select(
        *names, *(F.xxhash64(n).alias(f"x_{n}") for n in names), F.xxhash64(*names).alias("x_all"),
        F.xxhash64("s", "l").alias("x_sl"), F.hash(F.coalesce("l", F.lit(0))).alias("m_l"),
    ).toArrow()
    for n in names:
        assert xxhash64([got[n]]).tolist() == got[f"x_{n}"].to_pylist(), n
    assert xxhash64([got[n] for n in names]).tolist() == got["x_all"].to_pylist()
    assert xxhash64([got["s"], got["l"]]).tolist() == got["x_sl"].to_pylist()
    assert murmur3_long(got["l"].fill_null(0).to_numpy()).tolist() == got["m_l"].to_pylist()


@pytest.mark.parametrize("shards", [1, 2, 5, 8])
def test_a_routed_batch_gives_each_partition_one_shard(spark, warehouse: str, shards: int) -> None:
    from pyspark.sql import functions as F

    from lakesink_datasource import cluster_by_key

    df = spark.range(0, 4000).select(F.col("id"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("v"))
    routed = cluster_by_key(df, "id", shards=shards, table="db.t", warehouse=warehouse, operation="upsert")
    placed = routed.select(F.spark_partition_id().alias("p"), SHARD_COLUMN, "id").toArrow()
    assert not table_exists(warehouse, "db.t")  # routing creates nothing
    assert routed.rdd.getNumPartitions() == shards
    shard_of = shard_of_keys([placed["id"]], shards)
    for partition, value, shard in zip(placed["p"].to_pylist(), placed[SHARD_COLUMN].to_pylist(), shard_of.tolist()):
        route, _fingerprint = decode_shard(value)
        assert (route.shard, route.shards) == (shard, shards)
        assert partition == shard, "each shard in the partition of its number"
    counts = np.bincount(shard_of, minlength=shards)
    assert counts.min() > 4000 / shards * 0.7, f"uneven shards: {counts}"


def test_shards_default_to_the_task_slots_and_more_shards_than_slots_are_warned_of(spark, warehouse: str, tmp_path,
                                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """local[2] runs two tasks at once: with 8 shuffle partitions a routed write defaults to 2
    shards (one per slot, so each keeps its executor), and a stream given 4 is warned of."""
    from lakesink_datasource import cluster_by_key

    options = {"table": "db.slots", "warehouse": warehouse, "operation": "upsert"}
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    try:
        routed = cluster_by_key(spark.range(0, 100), "id", **options)
        assert routed.rdd.getNumPartitions() == 2
        assert {decode_shard(r[0])[0].shards for r in routed.select(SHARD_COLUMN).collect()} == {2}
        source = tmp_path / "src"
        spark.range(0, 10).write.parquet(str(source))
        stream = spark.readStream.schema("id long").parquet(str(source))
        with caplog.at_level("WARNING", logger="lakesink"):
            cluster_by_key(stream, "id", shards=2, **options)
            assert not [r for r in caplog.records if "task slots" in r.getMessage()]
            cluster_by_key(stream, "id", shards=4, **options)
        (warned,) = [r.getMessage() for r in caplog.records if "task slots" in r.getMessage()]
        assert "4 key shards on 2 task slots" in warned and "give shards=2" in warned
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert not table_exists(warehouse, "db.slots")


# --------------------------------------------------------------------------- routed streams

ROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()), ("name", pa.string()), ("big", pa.int64()), ("x", pa.float64()), ("ts", pa.timestamp("us", tz="UTC")),
        ("local", pa.timestamp("us")), ("amount", pa.decimal128(12, 2)), ("tags", pa.list_(pa.int64())),
        ("info", pa.struct([("a", pa.int32()), ("b", pa.string())])), ("day", pa.date32()), ("raw", pa.binary()), ("flag", pa.bool_()),
    ]
)
SPARK_SCHEMA = (
    "id long, name string, big long, x double, ts timestamp, local timestamp_ntz, amount decimal(12,2), tags array<long>, "
    "info struct<a:int,b:string>, day date, raw binary, flag boolean"
)
COLUMNS = [f.name for f in ROW_SCHEMA]


def _row(key: int, batch: int) -> dict:
    """Values pandas would change if carried naively: bigints past 2^53 beside nulls, NaN
    beside null, timestamps in a DST hour and far from 1970."""
    n = key * 31 + batch
    return {
        "id": key,
        "name": f"b{batch}-{key}",
        "big": None if n % 4 == 0 else (1 << 62) + n,
        "x": None if n % 5 == 0 else (math.nan if n % 5 == 1 else n / 7),
        "ts": None if n % 6 == 0 else dt.datetime(2026, 11, 1, 5, 30, n % 60, tzinfo=dt.timezone.utc) + dt.timedelta(days=n % 3),
        "local": dt.datetime(1500 + n % 900, 3, 29, 2, 30, 0, 123456),
        "amount": Decimal(n) / 100,
        "tags": None if n % 7 == 0 else [n, None, -(1 << 60)],
        "info": {"a": n, "b": None if n % 2 else "x"},
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=n % 40),
        "raw": bytes([n % 256]) * (n % 5),
        "flag": None if n % 3 == 0 else n % 2 == 0,
    }


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def assert_table_holds(warehouse: str, identifier: str, model: dict[int, dict]) -> None:
    got = {r["id"]: r for r in load(warehouse, identifier).scan().to_arrow().to_pylist()}
    assert sorted(got) == sorted(model)
    for key, row in model.items():
        for column in COLUMNS:
            assert _same(got[key][column], row[column]), f"key {key}, column {column}: {got[key][column]!r} != {row[column]!r}"


def write_source(folder: Path, batch: int, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{batch:03d}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=ROW_SCHEMA), path)
    os.utime(path, (1_700_000_000 + batch * 10, 1_700_000_000 + batch * 10))


def test_a_routed_upsert_stream_writes_every_value_exactly_and_each_host_holds_its_shards(spark, tmp_path: Path, warehouse: str) -> None:
    from lakesink_datasource import cluster_by_key

    index_dir = tmp_path / "index"
    options = {"table": "db.routed", "warehouse": warehouse, "operation": "upsert", "index_dir": str(index_dir), "partition_by": "bucket(2, id)"}
    model: dict[int, dict] = {}

    def run_stream() -> None:
        df = spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "source"))
        query = (
            cluster_by_key(df, "id", **options).writeStream.format("lakesink")
            .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
        )
        query.awaitTermination()

    for batch in range(3):
        rows = [_row(k, batch) for k in range(batch * 15, batch * 15 + 40)]
        write_source(tmp_path / "source", batch, rows)
        model.update({r["id"]: r for r in rows})
    run_stream()
    assert_table_holds(warehouse, "db.routed", model)

    # Another writer (an unrouted batch upsert) changes keys of both shards; the stream goes on.
    rows = [_row(k, 7) for k in range(0, 80, 3)]
    spark.createDataFrame(pa.Table.from_pylist(rows, schema=ROW_SCHEMA), SPARK_SCHEMA).write.format("lakesink").options(
        **{k: v for k, v in options.items() if k != "partition_by"}
    ).mode("append").save()
    model.update({r["id"]: r for r in rows})
    rows = [_row(k, 9) for k in range(50, 95)]
    write_source(tmp_path / "source", 3, rows)
    model.update({r["id"]: r for r in rows})
    run_stream()
    assert_table_holds(warehouse, "db.routed", model)
    assert_readers_see(warehouse, "db.routed", expected_rows([{"id": k, "name": r["name"]} for k, r in model.items()], ["id", "name"]), ["id", "name"])
    table = load(warehouse, "db.routed")
    assert check_table(table) == []

    batches = [s for s in table.metadata.snapshots if COMPACTION not in s.summary.additional_properties and HOSTS in s.summary.additional_properties]
    assert len(batches) == 5  # four stream batches and the batch job, one snapshot each
    # Each routed batch ran as two key shards (shuffle partitions = 2), each its own index.
    folders = sorted(p.name[p.name.index("key-shard-"):] for p in index_dir.iterdir() if "key-shard-" in p.name)
    assert folders == ["key-shard-00000-of-00002", "key-shard-00001-of-00002"]
    for shard in (0, 1):
        held = keys_in_shard_index(next(index_dir.glob(f"*.key-shard-{shard:05d}-of-00002")), range(120))
        expected = {k for k in model if shard_of_keys([pa.array([k], pa.int64())], 2)[0] == shard}
        # Synced before the last batch, plus that batch's own keys: a subset of its shard's.
        assert held and held <= expected, f"shard {shard}'s index holds keys of the other shard: {sorted(held - expected)}"


def test_a_routed_cdc_stream_with_late_changes_matches_the_model(spark, tmp_path: Path, warehouse: str) -> None:
    from test_keyed_writes import cdc_model

    from lakesink_datasource import cluster_by_key

    batches = [
        [{"id": i, "name": f"v0-{i}", "seq": 10, "op": "c"} for i in range(30)],
        [{"id": i, "name": None, "seq": 20, "op": "d"} for i in range(0, 30, 4)]
        + [{"id": i, "name": f"v1-{i}", "seq": 21, "op": "u"} for i in range(1, 30, 4)]
        + [{"id": 77, "name": None, "seq": 5, "op": "d"}],
        # late changes (older sequences) are ignored, deleted keys stay deleted
        [{"id": i, "name": "stale", "seq": 15, "op": "u"} for i in range(0, 30, 2)] + [{"id": 3, "name": "v2-3", "seq": 40, "op": "u"}],
    ]
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("seq", pa.int64()), ("op", pa.string())])
    for n, rows in enumerate(batches):
        path = tmp_path / "source" / f"{n}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        os.utime(path, (1_700_000_000 + n * 10, 1_700_000_000 + n * 10))
    df = spark.readStream.schema("id long, name string, seq long, op string").option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "source"))
    routed = cluster_by_key(
        df, "id", table="db.cdc", warehouse=warehouse, operation="cdc", op_column="op", sequence_column="seq",
        index_dir=str(tmp_path / "index"),
    )
    query = routed.writeStream.format("lakesink").option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
    query.awaitTermination()
    columns = ["id", "name", "seq"]
    assert_readers_see(warehouse, "db.cdc", expected_rows(list(cdc_model(batches).values()), columns), columns)
    assert check_table(load(warehouse, "db.cdc")) == []


def test_a_routed_batch_write_gives_each_task_one_shard(spark, tmp_path: Path, warehouse: str) -> None:
    from pyspark.sql import functions as F

    from lakesink_datasource import cluster_by_key

    options = {"table": "db.batch", "warehouse": warehouse, "operation": "upsert", "index_dir": str(tmp_path / "index")}
    model: dict[int, str] = {}
    for round_ in range(2):
        df = spark.range(round_ * 50, round_ * 50 + 200).select("id", F.concat(F.lit(f"r{round_}-"), F.col("id").cast("string")).alias("name"))
        model.update({i: f"r{round_}-{i}" for i in range(round_ * 50, round_ * 50 + 200)})
        cluster_by_key(df, "id", shards=4, **options).write.format("lakesink").options(**options).mode("append").save()
    assert_readers_see(warehouse, "db.batch", expected_rows([{"id": k, "name": v} for k, v in model.items()], ["id", "name"]), ["id", "name"])
    summary = load(warehouse, "db.batch").metadata.current_snapshot().summary
    assert len(summary[HOSTS].split(",")) == 4  # four tasks, each the index of its own shard
    assert len(list((tmp_path / "index").glob("*.key-shard-*-of-00004"))) == 4


@pytest.mark.parametrize(
    "keys, options, message",
    [
        (("nope",), {}, r"key column 'nope' is not in the DataFrame"),
        (("id",), {"operation": "append"}, r"cluster_by_key is for keyed writes: give operation='upsert'"),
        (("id",), {"primary_key": "name"}, r"the key columns \(id\) differ from option 'primary_key' \(name\)"),
        (("x",), {"primary_key": "x"}, r"primary key column 'x' has type double, which cannot be a key"),  # the writer's own
        (("big",), {"primary_key": "big"}, r"key column 'big' has type decimal\(20, 0\), which cannot be clustered"),
        (("id",), {"merge_schema": "true"}, r"merge_schema and evolve_partition are not supported on a clustered stream"),
        (("id",), {"shards": 3}, r"shards=3 exceeds spark.sql.shuffle.partitions=2"),
        (("id",), {"operaton": "upsert"}, r"unknown option 'operaton'; did you mean 'operation'"),
    ],
)
def test_cluster_by_key_refuses_bad_input_before_anything_runs(spark, tmp_path: Path, warehouse: str, keys: tuple, options: dict, message: str) -> None:
    from lakesink_datasource import LakesinkError, cluster_by_key

    df = spark.readStream.schema("id long, name string, x double, big decimal(20,0), ts timestamp").parquet(str(tmp_path))
    given = {"table": "db.bad", "warehouse": warehouse, "operation": "upsert", **options}
    with pytest.raises(LakesinkError, match=message):
        cluster_by_key(df, *keys, **given)
    assert not table_exists(warehouse, "db.bad")


def test_a_nested_timestamp_is_refused_and_sink_options_must_agree(spark, tmp_path: Path, warehouse: str) -> None:
    from pyspark.errors import PySparkException

    from lakesink_datasource import LakesinkError, cluster_by_key

    nested = spark.readStream.schema("id long, info struct<at:timestamp>").parquet(str(tmp_path))
    with pytest.raises(LakesinkError, match=r"column 'info.at' has type timestamp, which cluster_by_key cannot carry exactly"):
        cluster_by_key(nested, "id", table="db.bad", warehouse=warehouse, operation="upsert")

    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}), tmp_path / "src" / "0.parquet")
    df = spark.readStream.schema("id long, name string").parquet(str(tmp_path / "src"))
    routed = cluster_by_key(df, "id", table="db.bad", warehouse=warehouse, operation="upsert", index_dir=str(tmp_path / "index"))
    query = (
        routed.writeStream.format("lakesink").option("operation", "dedupe").option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True).start()
    )
    with pytest.raises(PySparkException, match=r"option\(s\) operation given to writeStream differ from cluster_by_key's"):
        query.awaitTermination()
    assert not table_exists(warehouse, "db.bad")
