"""Order preservation and injectivity of the primary-key byte encoding."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from lakesink_datasource.index.key_encoding import NullKeyError, encode_keys, key_hashes

# ----------------------------------------------------------------------------- helpers


def float_key(x: float) -> tuple[int, float]:
    """The documented float order: -0.0 == 0.0, every NaN equal and after +inf."""
    return (1, 0.0) if math.isnan(x) else (0, x + 0.0)


def identity(x: Any) -> Any:
    return x


# name -> (arrow type, value strategy, python sort key for one value)
Column = tuple[pa.DataType, st.SearchStrategy, Callable[[Any], Any]]

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=8)
# Few distinct short byte strings, heavy on 0x00/0xFF, to hit prefixes and escapes.
# Mix the special values in so -0.0/0.0 and NaN/-NaN meet in the same example often.
SPECIAL_FLOATS = [0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf")]
binaries = st.binary(max_size=6) | st.lists(st.sampled_from([0, 1, 0xFF]), max_size=5).map(bytes)

COLUMNS: dict[str, Column] = {
    "bool": (pa.bool_(), st.booleans(), identity),
    "int8": (pa.int8(), st.integers(-(2**7), 2**7 - 1), identity),
    "int16": (pa.int16(), st.integers(-(2**15), 2**15 - 1), identity),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1), identity),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1), identity),
    "uint8": (pa.uint8(), st.integers(0, 2**8 - 1), identity),
    "uint32": (pa.uint32(), st.integers(0, 2**32 - 1), identity),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1), identity),
    "float32": (pa.float32(), st.floats(width=32) | st.sampled_from(SPECIAL_FLOATS), float_key),
    "float64": (pa.float64(), st.floats() | st.sampled_from(SPECIAL_FLOATS), float_key),
    "decimal": (
        pa.decimal128(20, 4),
        st.decimals(min_value=Decimal("-1e15"), max_value=Decimal("1e15"), places=4, allow_nan=False),
        identity,
    ),
    "decimal256": (
        pa.decimal256(40, 2),
        st.decimals(min_value=Decimal("-1e37"), max_value=Decimal("1e37"), places=2, allow_nan=False),
        identity,
    ),
    "string": (pa.string(), texts, identity),
    "large_string": (pa.large_string(), texts, identity),
    "binary": (pa.binary(), binaries, identity),
    "large_binary": (pa.large_binary(), binaries, identity),
    "fixed_binary": (pa.binary(3), st.binary(min_size=3, max_size=3), identity),
    "date": (pa.date32(), st.dates(), identity),
    "timestamp": (pa.timestamp("us", tz="UTC"), st.datetimes(timezones=st.just(dt.timezone.utc)), identity),
    "timestamp_ns": (pa.timestamp("ns"), st.integers(-(2**63), 2**63 - 1), identity),
    "time64": (pa.time64("us"), st.times(), identity),
}


def assert_order_preserved(names: list[str], rows: list[tuple]) -> None:
    """Bytewise comparison of encodings must equal the tuple comparison, pair by pair."""
    types = [COLUMNS[n][0] for n in names]
    sort_keys = [COLUMNS[n][2] for n in names]
    columns = [pa.array([row[i] for row in rows], type=t) for i, t in enumerate(types)]
    encoded = encode_keys(columns)
    assert len(encoded) == len(rows)
    natural = [tuple(f(v) for f, v in zip(sort_keys, row)) for row in rows]
    for i in range(len(rows)):
        for j in range(len(rows)):
            expected = (natural[i] > natural[j]) - (natural[i] < natural[j])
            actual = (encoded[i] > encoded[j]) - (encoded[i] < encoded[j])
            # Equal bytes iff equal tuples (injective) and same order otherwise.
            assert actual == expected, (rows[i], rows[j], encoded[i], encoded[j])


def rows_of(names: list[str], max_size: int = 25) -> st.SearchStrategy:
    value_strategies = [COLUMNS[n][1] for n in names]
    # Duplicate some rows so equal tuples are exercised, not just distinct ones.
    return st.lists(st.tuples(*value_strategies), max_size=max_size).flatmap(
        lambda rows: st.permutations(rows + rows[: len(rows) // 3])
    )


# ------------------------------------------------------------------- order preservation

COMBINATIONS = [
    ["int64", "string"],
    ["date", "int32"],
    ["float64"],
    ["decimal"],
    ["binary", "bool"],
    ["timestamp"],
]


@pytest.mark.parametrize("names", COMBINATIONS, ids=["+".join(c) for c in COMBINATIONS])
@settings(max_examples=examples(150), deadline=None)
@given(data=st.data())
def test_order_and_injectivity_for_listed_combinations(names: list[str], data: st.DataObject) -> None:
    assert_order_preserved(names, data.draw(rows_of(names)))


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data())
def test_order_and_injectivity_for_random_column_mixes(data: st.DataObject) -> None:
    names = data.draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=4))
    assert_order_preserved(names, data.draw(rows_of(names)))


def test_string_prefixes_and_embedded_nuls_sort_like_python() -> None:
    # The escape scheme's corner cases: a prefix, a NUL continuation and 0xFF bytes.
    values = [b"", b"\x00", b"\x00\x00", b"\x00\xff", b"\x01", b"a", b"a\x00", b"a\x00b", b"ab", b"\xff", b"\xff\x00"]
    for tail in ([0, 1], [1, 0]):
        rows = [(v, t) for v in values for t in tail]
        columns = [pa.array([r[0] for r in rows], pa.binary()), pa.array([r[1] for r in rows], pa.int8())]
        encoded = encode_keys(columns)
        assert sorted(range(len(rows)), key=lambda i: encoded[i]) == sorted(range(len(rows)), key=lambda i: rows[i])
        assert len(set(encoded)) == len(rows)


def test_float_nan_and_signed_zero_are_canonical() -> None:
    neg_nan = -float("nan")
    encoded = encode_keys([pa.array([0.0, -0.0, float("nan"), neg_nan, float("inf"), -float("inf"), 1.0])])
    zero, neg_zero, nan, nan2, inf, ninf, one = encoded
    assert zero == neg_zero  # -0.0 == 0.0
    assert nan == nan2  # every NaN is one key, whatever its sign or payload
    assert ninf < neg_zero < one < inf < nan  # NaN sorts last
    f32 = encode_keys([pa.array([-0.0, 0.0, float("nan"), neg_nan], pa.float32())])
    assert f32[0] == f32[1] and f32[2] == f32[3]


def test_encoding_is_independent_of_batch_layout() -> None:
    # The index compares keys across batches: slicing, chunking and dictionary encoding
    # must not change the bytes of a value.
    ints = pa.array(range(-5, 15), pa.int64())
    strs = pa.array([f"k{i}\x00" * (i % 3) for i in range(20)])
    whole = encode_keys([ints, strs])
    assert encode_keys([ints.slice(7, 6), strs.slice(7, 6)]) == whole[7:13]
    chunked = [pa.chunked_array([ints.slice(0, 4), ints.slice(4)]), pa.chunked_array([strs.slice(0, 9), strs.slice(9)])]
    assert encode_keys(chunked) == whole
    assert encode_keys([ints, strs.dictionary_encode()]) == whole
    assert encode_keys([ints, strs.cast(pa.large_string())]) == whole
    assert encode_keys([ints, strs.cast(pa.string_view())]) == whole
    assert encode_keys([pa.array([True, False, True]).slice(1)]) == [b"\x00", b"\x01"]


def test_timestamp_encodes_the_stored_integer_regardless_of_zone() -> None:
    raw = pa.array([-1, 0, 1_700_000_000_000_000], pa.int64())
    plain = encode_keys([raw.cast(pa.timestamp("us"))])
    assert encode_keys([raw.cast(pa.timestamp("us", tz="Europe/Paris"))]) == plain
    assert encode_keys([raw]) == plain


def test_empty_batch_gives_no_keys() -> None:
    assert encode_keys([pa.array([], pa.int64()), pa.array([], pa.string())]) == []
    assert encode_keys([pa.chunked_array([], pa.string())]) == []


# ------------------------------------------------------------------------------- errors


def test_null_key_raises_naming_the_column() -> None:
    columns = [pa.array([1, 2, 3]), pa.array(["a", None, None])]
    with pytest.raises(NullKeyError, match=r"'region'.*#1.*2 null") as info:
        encode_keys(columns, names=["id", "region"])
    assert info.value.column_index == 1
    assert info.value.column_name == "region"
    assert info.value.null_count == 2
    assert isinstance(info.value, ValueError)
    with pytest.raises(NullKeyError, match="#0"):
        encode_keys([pa.array([None], pa.int64())])


@pytest.mark.parametrize(
    "array",
    [
        pa.array([[1]], pa.list_(pa.int32())),
        pa.array([(1, 2, 3)], pa.month_day_nano_interval()),
    ],
    ids=["list", "interval"],
)
def test_unsupported_type_raises_type_error_naming_it(array: pa.Array) -> None:
    with pytest.raises(TypeError, match=r"type .*'bad'") as info:
        encode_keys([pa.array([1]), array], names=["id", "bad"])
    assert str(array.type) in str(info.value)


def test_null_type_column_is_rejected_as_null() -> None:
    # A null-typed column can only hold nulls, so the null check names it first.
    with pytest.raises(NullKeyError):
        encode_keys([pa.array([None], pa.null())])


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        encode_keys([])
    with pytest.raises(ValueError, match="rows"):
        encode_keys([pa.array([1, 2]), pa.array([1])])
    with pytest.raises(ValueError, match="names"):
        encode_keys([pa.array([1])], names=["a", "b"])


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=30))
def test_a_key_hashes_the_same_whatever_else_is_in_the_call(keys: list[bytes]) -> None:
    """Tasks hash their chunks, the commit hashes other writers' files: the same key must
    give the same hash whatever the longest key next to it."""
    alone = [int(key_hashes([k])[0]) for k in keys]
    assert key_hashes(keys).tolist() == alone
    assert len(set(alone)) == len(set(keys))  # 64 bits: no collision among a few keys


def test_a_struct_encodes_as_its_fields_one_after_another() -> None:
    """A sequence of several parts (Debezium's source position) may be one struct column:
    it orders as its fields would as columns of their own, and a null part is refused by name."""
    lsn, offset = pa.array([5, 5, 3, 9], pa.int64()), pa.array([2, 1, 7, 0], pa.int64())
    position = pa.StructArray.from_arrays([lsn, offset], names=["lsn", "kafka_offset"])
    assert encode_keys([position]) == encode_keys([lsn, offset])
    encoded = encode_keys([position])
    assert sorted(range(4), key=lambda i: encoded[i]) == [2, 1, 0, 3]
    with pytest.raises(NullKeyError, match=r"'position\.lsn'"):
        encode_keys([pa.StructArray.from_arrays([pa.array([1, None]), pa.array([1, 2])], names=["lsn", "o"])], names=["position"])
    with pytest.raises(TypeError, match=r"list<item: int64> for key column 'position\.a'"):
        encode_keys([pa.array([{"a": [1]}])], names=["position"])
