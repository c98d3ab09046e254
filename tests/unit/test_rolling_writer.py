"""PartitionedParquetWriter (rolling, buffering, memory bound) and the data-file metrics."""

from __future__ import annotations

import datetime as dt
import gc
import math
import os
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes, to_bytes
from pyiceberg.io.pyarrow import PyArrowFileIO, schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros

from lakesink_datasource.iceberg.partition_key import PartitionKey
from lakesink_datasource.io.metrics import count_nans, data_file_message
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.messages import DataFileMessage

KiB = 1024
MiB = 1024 * KiB

# --------------------------------------------------------------------------- helpers

SIMPLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "p", IntegerType()),
    NestedField(3, "v", DoubleType()),
    NestedField(4, "s", StringType()),
)
SIMPLE_ARROW = schema_to_pyarrow(SIMPLE)


def _path_for(root: Path) -> Callable[[PartitionKey, int], str]:
    def path_for(key: PartitionKey, n: int) -> str:
        part = "-".join("null" if v is None else v.hex() for v in key) or "unpartitioned"
        return str(root / "data" / part / f"{n:05d}.parquet")

    return path_for


def _writer(root: Path, schema: Schema = SIMPLE, **kwargs: Any) -> PartitionedParquetWriter:
    return PartitionedParquetWriter(
        io=PyArrowFileIO(),
        iceberg_schema=schema,
        arrow_schema=schema_to_pyarrow(schema),
        spec_id=kwargs.pop("spec_id", 0),
        table_properties=kwargs.pop("table_properties", {}),
        path_for=_path_for(root),
        **kwargs,
    )


def _simple_batch(rng: np.random.Generator, start: int, rows: int, partitions: int = 1) -> pa.Table:
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "p": rng.integers(0, partitions, rows).astype(np.int32),
            "v": rng.normal(size=rows),
            # random hex: barely compressible, so file sizes are predictable-ish
            "s": pa.array([c.hex() for c in _chunks(rng.bytes(8 * rows), 8)]),
        },
        schema=SIMPLE_ARROW,
    )


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _file_index(msg: DataFileMessage) -> int:
    return int(Path(msg.path).stem)


def _check_file_matches_message(msg: DataFileMessage) -> pq.FileMetaData:
    meta = pq.read_metadata(msg.path)
    assert msg.record_count == meta.num_rows
    assert msg.file_size_in_bytes == os.path.getsize(msg.path)
    return meta


# --------------------------------------------------------------------------- rolling


def test_files_roll_close_to_target_with_few_row_groups(tmp_path: Path) -> None:
    target = 256 * KiB
    writer = _writer(tmp_path, target_file_size=target)
    rng = np.random.default_rng(1)
    batches = [_simple_batch(rng, b * 1000, 1000) for b in range(200)]
    for batch in batches:
        writer.write((), batch)
    messages = writer.close()

    total = sum(m.file_size_in_bytes for m in messages)
    assert total > 3 * MiB  # ~5 MB of Parquet, so this really exercises rolling
    assert len(messages) >= 10
    messages.sort(key=_file_index)
    for msg in messages[:-1]:
        assert 0.7 * target <= msg.file_size_in_bytes <= 2 * target, msg.file_size_in_bytes
    assert messages[-1].file_size_in_bytes <= 2 * target

    row_groups = [_check_file_matches_message(m).num_row_groups for m in messages]
    assert max(row_groups) <= 3
    assert sum(row_groups) < 200 / 4  # never one per incoming batch

    # One partition, so rows come back in input order across the files.
    back = pa.concat_tables([pq.read_table(m.path) for m in messages])
    assert back.column("id").to_pylist() == list(range(200_000))
    assert back.equals(pa.concat_tables(batches).cast(back.schema))

    stats = writer.stats
    assert stats.rows_written == 200_000
    assert stats.files_written == len(messages)
    assert stats.bytes_written == total


def test_row_groups_are_flushed_at_row_group_bytes(tmp_path: Path) -> None:
    writer = _writer(tmp_path, row_group_bytes=1 * MiB)
    rng = np.random.default_rng(2)
    arrow_bytes = 0
    for b in range(200):
        batch = _simple_batch(rng, b * 1000, 1000)
        arrow_bytes += batch.nbytes
        writer.write((), batch)
    [msg] = writer.close()
    meta = _check_file_matches_message(msg)
    # Each row group holds >= 1 MiB of Arrow data (the last one may be smaller).
    assert meta.num_row_groups <= math.ceil(arrow_bytes / MiB)
    assert meta.num_row_groups >= 2
    assert all(meta.row_group(i).num_rows > 10_000 for i in range(meta.num_row_groups - 1))
    assert len(msg.split_offsets) == meta.num_row_groups
    assert msg.split_offsets == sorted(msg.split_offsets)


def test_oversized_single_table_is_split_into_bounded_row_groups(tmp_path: Path) -> None:
    writer = _writer(tmp_path, row_group_bytes=256 * KiB)
    big = _simple_batch(np.random.default_rng(3), 0, 50_000)
    writer.write((), big)
    [msg] = writer.close()
    meta = pq.read_metadata(msg.path)
    per_group = big.nbytes / meta.num_row_groups
    assert 256 * KiB <= per_group < 2 * 256 * KiB


def _write_many_partitions(tmp_path: Path, **kwargs: Any) -> tuple[PartitionedParquetWriter, list[pa.Table], int, int]:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "p"), spec_id=7)
    splitter = PartitionSplitter(spec, SIMPLE)
    writer = _writer(tmp_path, spec_id=7, **kwargs)
    rng = np.random.default_rng(4)
    batches, largest, max_open = [], 0, 0
    for b in range(60):
        batch = _simple_batch(rng, b * 3000, 3000, partitions=300)
        batches.append(batch)
        largest = max(largest, batch.nbytes)
        for key, part in splitter.split(batch):
            writer.write(key, part)
            max_open = max(max_open, writer.open_files)
    return writer, batches, largest, max_open


@pytest.mark.slow
@pytest.mark.parametrize("max_open_files", [None, 40])
def test_buffer_limit_bounds_memory_across_300_partitions(tmp_path: Path, max_open_files: int | None) -> None:
    limit = 1 * MiB
    writer, batches, largest, max_open = _write_many_partitions(
        tmp_path, buffer_limit_bytes=limit, max_open_files=max_open_files
    )
    assert writer.peak_buffered_bytes <= limit + largest
    assert writer.buffered_bytes <= limit
    if max_open_files is not None:
        assert max_open <= max_open_files
    messages = writer.close()

    # Every row exactly once, each file holding a single partition that matches its message.
    expected = Counter(row for batch in batches for row in zip(*batch.to_pydict().values()))
    got: Counter[tuple[Any, ...]] = Counter()
    for msg in messages:
        _check_file_matches_message(msg)
        table = pq.read_table(msg.path)
        assert msg.spec_id == 7
        [p] = set(table.column("p").to_pylist())
        assert msg.partition == (to_bytes(IntegerType(), p),)
        assert from_bytes(IntegerType(), msg.partition[0]) == p  # type: ignore[arg-type]
        got.update(zip(*table.to_pydict().values()))
    assert got == expected
    assert len({m.partition for m in messages}) == 300
    if max_open_files is None:
        assert len(messages) == 300  # nothing forces an early close


def test_buffered_slices_do_not_pin_their_parent_batch(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    big = _simple_batch(np.random.default_rng(5), 0, 200_000)
    gc.collect()
    before = pa.total_allocated_bytes()
    writer.write((), big.slice(10, 5))
    del big
    gc.collect()
    # The 5 buffered rows were copied; the ~7 MB batch they came from is freed.
    assert pa.total_allocated_bytes() < before - 4 * MiB
    [msg] = writer.close()
    assert pq.read_table(msg.path).column("id").to_pylist() == list(range(10, 15))


def test_files_carry_iceberg_field_ids(tmp_path: Path) -> None:
    writer = _writer(tmp_path, schema=METRICS_SCHEMA)
    writer.write((), _metrics_table(0))
    [msg] = writer.close()
    schema = pq.read_schema(msg.path)
    ids = {f.name: int(f.metadata[b"PARQUET:field_id"]) for f in schema}
    assert ids == {f.name: f.field_id for f in METRICS_SCHEMA.fields}
    st_field = schema.field("st")
    assert [int(st_field.type.field(i).metadata[b"PARQUET:field_id"]) for i in range(2)] == [13, 14]


def test_abort_deletes_every_file_even_after_an_error(tmp_path: Path) -> None:
    calls = {"n": 0}
    good = _path_for(tmp_path)

    def flaky_path_for(key: PartitionKey, n: int) -> str:
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError("storage went away")
        return good(key, n)

    writer = PartitionedParquetWriter(
        io=PyArrowFileIO(),
        iceberg_schema=SIMPLE,
        arrow_schema=SIMPLE_ARROW,
        spec_id=0,
        table_properties={},
        path_for=flaky_path_for,
        target_file_size=64 * KiB,
        row_group_bytes=64 * KiB,
    )
    rng = np.random.default_rng(6)
    with pytest.raises(OSError, match="storage went away"):
        for b in range(100):
            writer.write((), _simple_batch(rng, b * 1000, 1000))
    deleted = writer.abort()
    assert len(deleted) == 3
    assert not any(os.path.exists(p) for p in deleted)
    assert writer.abort() == deleted  # idempotent
    with pytest.raises(RuntimeError):
        writer.write((), _simple_batch(rng, 0, 10))


def test_abort_with_open_files_and_buffers(tmp_path: Path) -> None:
    writer = _writer(tmp_path, row_group_bytes=32 * KiB)
    rng = np.random.default_rng(7)
    for b in range(5):
        writer.write((to_bytes(IntegerType(), b % 2),), _simple_batch(rng, b * 2000, 2000))
    assert writer.open_files == 2
    deleted = writer.abort()
    assert len(deleted) == 2 and not any(os.path.exists(p) for p in deleted)


def test_empty_writer_and_empty_tables(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.write((), _simple_batch(np.random.default_rng(8), 0, 0))
    assert writer.close() == []
    assert writer.stats.files_written == 0


# --------------------------------------------------------------------------- metrics

METRICS_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "i", IntegerType()),
    NestedField(3, "f", FloatType()),
    NestedField(4, "d", DoubleType()),
    NestedField(5, "s", StringType()),
    NestedField(6, "day", DateType()),
    NestedField(7, "ts", TimestampType()),
    NestedField(8, "tstz", TimestamptzType()),
    NestedField(9, "dec", DecimalType(10, 2)),
    NestedField(10, "b", BooleanType()),
    NestedField(11, "bin", BinaryType()),
    NestedField(12, "st", StructType(NestedField(13, "x", DoubleType()), NestedField(14, "y", StringType()))),
    NestedField(15, "lst", ListType(16, DoubleType())),
)
NAN = float("nan")
UTC = dt.timezone.utc


def _metrics_rows(start: int) -> list[dict[str, Any]]:
    """Rows with nulls, NaNs, long strings, nested values; different ranges per `start`."""
    rows = []
    for r in range(start, start + 500):
        k = r % 7
        rows.append(
            {
                "id": r,
                "i": None if k == 0 else r * 3 - 700,
                "f": NAN if k == 1 else (None if k == 2 else r / 4.0),
                "d": NAN if k in (1, 3) else -r * 1.5,
                "s": None if k == 4 else f"{'zyxw'[r % 4]}-long-string-value-{r:06d}-" + "é" * (r % 3),
                "day": dt.date(2020, 1, 1) + dt.timedelta(days=r),
                "ts": None if k == 5 else dt.datetime(2021, 6, 1) + dt.timedelta(minutes=r),
                "tstz": dt.datetime(2022, 1, 1, tzinfo=UTC) - dt.timedelta(seconds=r),
                "dec": Decimal(r - 250) / 4,
                "b": (r % 3 == 0) if k != 6 else None,
                "bin": bytes([r % 256]) * (r % 5),
                "st": None if k == 0 else {"x": NAN if k == 2 else float(r), "y": None},
                "lst": [NAN, 1.0] if k == 3 else [],
            }
        )
    return rows


def _metrics_table(start: int) -> pa.Table:
    return pa.Table.from_pylist(_metrics_rows(start), schema=schema_to_pyarrow(METRICS_SCHEMA))


def _internal(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return datetime_to_micros(value)
    if isinstance(value, dt.date):
        return date_to_days(value)
    return value


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def test_metrics_match_the_data(tmp_path: Path) -> None:
    # Three writes with a small row-group threshold: bounds aggregate across row groups.
    writer = _writer(tmp_path, schema=METRICS_SCHEMA, row_group_bytes=16 * KiB)
    rows: list[dict[str, Any]] = []
    for start in (1000, 0, 5000):
        writer.write((), _metrics_table(start))
        rows += _metrics_rows(start)
    [msg] = writer.close()
    meta = _check_file_matches_message(msg)
    assert meta.num_row_groups >= 3
    assert msg.record_count == len(rows) == 1500

    top_level = [f for f in METRICS_SCHEMA.fields if f.name not in ("st", "lst")]
    for field in top_level:
        values = [row[field.name] for row in rows]
        present = [_internal(v) for v in values if v is not None and not _is_nan(v)]
        assert msg.value_counts[field.field_id] == len(rows), field.name
        assert msg.null_value_counts[field.field_id] == values.count(None), field.name
        if isinstance(field.field_type, (FloatType, DoubleType)):
            assert msg.nan_value_counts[field.field_id] == sum(map(_is_nan, values)), field.name
        lower = from_bytes(field.field_type, msg.lower_bounds[field.field_id])  # type: ignore[arg-type]
        upper = from_bytes(field.field_type, msg.upper_bounds[field.field_id])  # type: ignore[arg-type]
        if isinstance(field.field_type, StringType):
            # truncate(16): the lower bound is the min's prefix, the upper bound an
            # incremented prefix that is still >= every value.
            assert lower == min(present)[:16]
            assert len(upper) == 16 and upper > max(present) and upper[:15] == max(present)[:15]
        elif isinstance(field.field_type, FloatType):
            assert (lower, upper) == pytest.approx((min(present), max(present)))
        else:
            assert (lower, upper) == (min(present), max(present)), field.name

    # Nested leaves: counts (including NaN) but no bounds; a null struct makes its leaves null.
    x_values = [None if row["st"] is None else row["st"]["x"] for row in rows]
    assert msg.value_counts[13] == len(rows)
    assert msg.null_value_counts[13] == x_values.count(None)
    assert msg.nan_value_counts[13] == sum(map(_is_nan, x_values))
    assert msg.null_value_counts[14] == len(rows)
    for field_id in (13, 14, 16):
        assert field_id not in msg.lower_bounds and field_id not in msg.upper_bounds
    assert 16 not in msg.nan_value_counts  # list elements are not NaN-counted
    assert set(msg.column_sizes) == {f for f in range(1, 17) if f not in (12, 15)}


def test_long_strings_missing_from_parquet_statistics_drop_bounds(tmp_path: Path) -> None:
    # Arrow omits min/max for a chunk holding a value > 4096 bytes; pyiceberg would then take
    # bounds from the other row groups only, which would not cover the long value.
    writer = _writer(tmp_path, row_group_bytes=1)  # one row group per write
    writer.write((), pa.table({"id": [1], "p": [1], "v": [1.0], "s": ["m" * 5000]}, schema=SIMPLE_ARROW))
    writer.write((), pa.table({"id": [2], "p": [2], "v": [2.0], "s": ["a"]}, schema=SIMPLE_ARROW))
    [msg] = writer.close()
    assert pq.read_metadata(msg.path).num_row_groups == 2
    assert 4 not in msg.lower_bounds and 4 not in msg.upper_bounds
    assert msg.value_counts[4] == 2 and msg.null_value_counts[4] == 0
    assert from_bytes(LongType(), msg.lower_bounds[1]) == 1 and from_bytes(LongType(), msg.upper_bounds[1]) == 2


def test_all_nan_row_group_keeps_float_bounds(tmp_path: Path) -> None:
    writer = _writer(tmp_path, row_group_bytes=1)
    writer.write((), pa.table({"id": [1], "p": [1], "v": [NAN], "s": ["a"]}, schema=SIMPLE_ARROW))
    writer.write((), pa.table({"id": [2], "p": [2], "v": [2.5], "s": ["b"]}, schema=SIMPLE_ARROW))
    [msg] = writer.close()
    assert from_bytes(DoubleType(), msg.lower_bounds[3]) == 2.5
    assert from_bytes(DoubleType(), msg.upper_bounds[3]) == 2.5
    assert msg.nan_value_counts[3] == 1


@pytest.mark.parametrize(
    ("properties", "bounds", "counts"),
    [
        ({"write.metadata.metrics.default": "counts"}, False, True),
        ({"write.metadata.metrics.default": "none"}, False, False),
        ({"write.metadata.metrics.default": "full"}, True, True),
    ],
)
def test_metrics_modes(tmp_path: Path, properties: dict[str, str], bounds: bool, counts: bool) -> None:
    writer = _writer(tmp_path, table_properties=properties)
    long = "q" * 40
    writer.write((), pa.table({"id": [1, 2], "p": [1, None], "v": [NAN, 1.0], "s": [long, "b"]}, schema=SIMPLE_ARROW))
    [msg] = writer.close()
    assert (3 in msg.lower_bounds) is bounds
    assert (3 in msg.nan_value_counts) is counts
    assert (2 in msg.null_value_counts) is counts
    assert set(msg.column_sizes) == {1, 2, 3, 4}
    if bounds:  # "full": strings are not truncated
        assert from_bytes(StringType(), msg.upper_bounds[4]) == long


def test_data_file_message_direct(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    table = pa.table({"id": [3, 1], "p": [7, 7], "v": [NAN, 0.5], "s": ["x", None]}, schema=SIMPLE_ARROW)
    pq.write_table(table, path)
    key = (to_bytes(IntegerType(), 7),)
    msg = data_file_message(
        path=str(path),
        spec_id=4,
        partition_key=key,
        parquet_metadata=pq.read_metadata(path),
        file_size=os.path.getsize(path),
        iceberg_schema=SIMPLE,
        table_properties={},
        nan_counts=count_nans(table, SIMPLE),
    )
    assert msg.partition == key and from_bytes(IntegerType(), msg.partition[0]) == 7  # type: ignore[arg-type]
    assert msg.spec_id == 4 and msg.record_count == 2
    assert msg.nan_value_counts == {3: 1}
    assert msg.null_value_counts[4] == 1
    assert (from_bytes(LongType(), msg.lower_bounds[1]), from_bytes(LongType(), msg.upper_bounds[1])) == (1, 3)


def test_count_nans_nested_and_chunked() -> None:
    table = pa.concat_tables([_metrics_table(0), _metrics_table(10)])
    counts = count_nans(table, METRICS_SCHEMA)
    rows = _metrics_rows(0) + _metrics_rows(10)
    assert counts[3] == sum(_is_nan(r["f"]) for r in rows)
    assert counts[4] == sum(_is_nan(r["d"]) for r in rows)
    assert counts[13] == sum(r["st"] is not None and _is_nan(r["st"]["x"]) for r in rows)
    assert set(counts) == {3, 4, 13}


@pytest.mark.parametrize("max_open_files", [None, 2])
def test_placements_name_the_exact_file_and_row_position_of_every_row(tmp_path: Path, max_open_files: int | None) -> None:
    # Keyed writes record (file, position) for rows still in buffers, so write() must say
    # exactly where each row will land, through rolls, flushes and evictions.
    writer = _writer(tmp_path, target_file_size=48 * KiB, row_group_bytes=16 * KiB, buffer_limit_bytes=40 * KiB, max_open_files=max_open_files)
    rng = np.random.default_rng(11)
    claimed: dict[int, tuple[str, int]] = {}
    for b in range(60):
        batch = _simple_batch(rng, b * 300, 300)
        key = (int(b % 4).to_bytes(4, "little"),)
        for placement in writer.write(key, batch):
            ids = batch["id"].to_pylist()[placement.offset : placement.offset + placement.rows]
            for i, row_id in enumerate(ids):
                claimed[row_id] = (placement.path, placement.position + i)
    messages = writer.close()
    assert len(messages) > 8  # rolling really happened
    actual: dict[int, tuple[str, int]] = {}
    for msg in messages:
        for position, row_id in enumerate(pq.read_table(msg.path, columns=["id"])["id"].to_pylist()):
            actual[row_id] = (msg.path, position)
    assert actual == claimed
