"""Tests for the deletion-vector-v1 blob codec against Iceberg/CRoaring/RoaringFormatSpec vectors."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from pyroaring import BitMap, BitMap64

from lakesink_datasource.iceberg.deletion_vector import (
    DV_MAGIC,
    MAX_KEY,
    MAX_POSITION,
    InvalidDeletionVector,
    decode_dv,
    encode_dv,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors"
C = 65536
B = 2**32


def _vector(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


def _frame(bitmap_bytes: bytes, magic: bytes = DV_MAGIC) -> bytes:
    """Frame arbitrary bitmap bytes as a DV blob, independently of encode_dv."""
    body = magic + bitmap_bytes
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def _bitmap(*parts: int | range) -> BitMap64:
    # Positions are added one at a time, so any run containers in the output come from encode_dv.
    bitmap = BitMap64()
    for part in parts:
        for pos in part if isinstance(part, range) else (part,):
            bitmap.add(pos)
    return bitmap


# Positions as listed in tests/vectors README (iceberg-deletes table), not taken from the files.
GOLDEN_DVS: dict[str, tuple[BitMap64, int]] = {
    "empty-position-index.bin": (_bitmap(), 0),
    "small-alternating-values-position-index.bin": (_bitmap(1, 3, 5, 7, 9), 5),
    "small-and-large-values-position-index.bin": (_bitmap(100, 101, 2147483747, 2147483748), 4),
    "all-container-types-position-index.bin": (
        _bitmap(
            5, 7, range(C + 1, C + 1000), range(2 * C + 1, 3 * C - 1),
            B + 10, B + 20, range(B + C + 10, B + C + 500), range(B + 2 * C + 1, B + 3 * C - 1),
        ),
        132561,
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_DVS))
def test_encoder_rebuilds_iceberg_golden_blob(name: str) -> None:
    positions, cardinality = GOLDEN_DVS[name]
    assert len(positions) == cardinality
    assert encode_dv(positions) == _vector(f"iceberg-deletes/{name}")


@pytest.mark.parametrize("name", sorted(GOLDEN_DVS))
def test_decode_iceberg_golden_blob(name: str) -> None:
    positions, cardinality = GOLDEN_DVS[name]
    decoded = decode_dv(_vector(f"iceberg-deletes/{name}"), expected_cardinality=cardinality)
    assert decoded == positions
    assert len(decoded) == cardinality


def test_empty_golden_blob_is_documented_hex() -> None:
    assert encode_dv(BitMap64()).hex() == "0000000c" "d1d33964" "0000000000000000" "bf18480c"


def test_all_container_types_blob_uses_run_containers() -> None:
    # 82 bytes of bitmap only if runs are used; one-by-one adds would give ~19 KiB of bitsets.
    blob = encode_dv(GOLDEN_DVS["all-container-types-position-index.bin"][0])
    assert len(blob) == 94
    assert struct.unpack(">I", blob[:4])[0] == 4 + 82


def test_encode_does_not_mutate_caller_bitmap() -> None:
    positions = _bitmap(range(5000))
    before = positions.get_statistics()
    assert before["n_bitset_containers"] == 1
    encode_dv(positions)
    assert positions.get_statistics() == before


def test_encode_layout() -> None:
    blob = encode_dv(_bitmap(1, B + 1))
    (length,) = struct.unpack(">I", blob[:4])
    assert len(blob) == length + 8
    assert blob[4:8] == DV_MAGIC
    assert struct.unpack(">I", blob[-4:])[0] == zlib.crc32(blob[4:-4])
    assert BitMap64.deserialize(blob[8:-4]) == _bitmap(1, B + 1)


# --- bare portable Roaring64 vectors: our decoder must read what other writers produce ---


def _spread() -> BitMap64:
    return BitMap64((h << 32) + low for h in range(10) for low in range(10))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("croaring/64mapempty.bin", BitMap64()),
        ("croaring/64map32bitvals.bin", BitMap64(range(10))),
        ("croaring/64mapspreadvals.bin", _spread()),
    ],
)
def test_decode_croaring_vectors(name: str, expected: BitMap64) -> None:
    decoded = decode_dv(_frame(_vector(name)), expected_cardinality=len(expected))
    assert decoded == expected


def test_spread_vector_spot_checks() -> None:
    decoded = decode_dv(_frame(_vector("croaring/64mapspreadvals.bin")))
    assert len(decoded) == 100
    assert {pos >> 32 for pos in decoded} == set(range(10))
    assert (9 << 32) + 9 in decoded
    assert (9 << 32) + 10 not in decoded
    assert 10 not in decoded


def test_portable_bitmap64_spec_vector() -> None:
    blob = _frame(_vector("roaringformatspec/portable_bitmap64.bin"))
    decoded = decode_dv(blob, expected_cardinality=188424)
    for key in (0, 1):
        base = key << 32
        for member in (0, 0x9000, 0xA000, 0x10000, 0x20000, 0x20005, 0x80000, 0x8FFFE):
            assert base + member in decoded
        for absent in (0x9001, 0x9FFF, 0x10001, 0x20001, 0x80001, 0x90000):
            assert base + absent not in decoded
    assert decoded.max() < 2 << 32


def test_bitmap64_spec_vector() -> None:
    decoded = decode_dv(_frame(_vector("roaringformatspec/bitmap64.bin")), expected_cardinality=1032769)
    assert 0 in decoded and 65534 in decoded
    assert 1 not in decoded and 65536 not in decoded
    assert B in decoded and B + 999_999 in decoded and B + 1_000_000 not in decoded
    assert decoded.max() == 2**48  # key 65536: well inside Java's key limit of 2^31-2


def test_decode_accepts_java_dense_layout() -> None:
    # Java writes an (empty) bitmap for every key up to the max; pyroaring writes only non-empty keys.
    empty32 = BitMap().serialize()
    assert empty32 == bytes.fromhex("3a30000000000000")
    dense = struct.pack("<Q", 3)
    dense += struct.pack("<I", 0) + empty32
    dense += struct.pack("<I", 1) + empty32
    dense += struct.pack("<I", 2) + BitMap([7, 9]).serialize()
    assert decode_dv(_frame(dense), expected_cardinality=2) == BitMap64([(2 << 32) + 7, (2 << 32) + 9])


def test_decode_rejects_keys_above_java_limit() -> None:
    # CRoaring's 64maphighvals has keys >= 2^31, which pyroaring reads but Iceberg Java rejects.
    high = _vector("croaring/64maphighvals.bin")
    assert len(BitMap64.deserialize(high)) == 121
    with pytest.raises(InvalidDeletionVector, match="out of range"):
        decode_dv(_frame(high))


def test_decode_key_limit_boundary() -> None:
    at_limit = BitMap64([(MAX_KEY << 32) + 0xFFFF_FFFF])
    assert decode_dv(_frame(at_limit.serialize())) == at_limit
    with pytest.raises(InvalidDeletionVector, match=str((MAX_KEY + 1) << 32)):
        decode_dv(_frame(BitMap64([(MAX_KEY + 1) << 32]).serialize()))


@pytest.mark.parametrize(
    "name",
    ["64mapemptyinput.bin", "64mapinvalidsize.bin", "64mapkeytoosmall.bin", "64mapsizetoosmall.bin"],
)
def test_decode_rejects_invalid_croaring_inputs(name: str) -> None:
    with pytest.raises(InvalidDeletionVector):
        decode_dv(_frame(_vector(f"croaring/{name}")))


# --- malformed blobs ---

SAMPLE = "iceberg-deletes/small-alternating-values-position-index.bin"


def _flip(data: bytes, index: int) -> bytes:
    mutable = bytearray(data)
    mutable[index] ^= 0x01
    return bytes(mutable)


@pytest.mark.parametrize("index", [-4, -1])
def test_rejects_flipped_crc_byte(index: int) -> None:
    with pytest.raises(InvalidDeletionVector, match="CRC mismatch"):
        decode_dv(_flip(_vector(SAMPLE), index))


def test_rejects_flipped_bitmap_byte() -> None:
    with pytest.raises(InvalidDeletionVector, match="CRC mismatch"):
        decode_dv(_flip(_vector(SAMPLE), 30))


def test_rejects_bad_magic() -> None:
    # Recompute the CRC so only the magic is wrong.
    blob = _frame(BitMap64([1]).serialize(), magic=b"\xd1\xd3\x39\x65")
    with pytest.raises(InvalidDeletionVector, match="bad magic"):
        decode_dv(blob)


@pytest.mark.parametrize("keep", [0, 3, 11, 19, 49])
def test_rejects_truncated_blob(keep: int) -> None:
    with pytest.raises(InvalidDeletionVector, match=r"truncated|length prefix"):
        decode_dv(_vector(SAMPLE)[:keep])


@pytest.mark.parametrize("delta", [-1, 1, 1000])
def test_rejects_length_prefix_disagreement(delta: int) -> None:
    blob = _vector(SAMPLE)
    (length,) = struct.unpack(">I", blob[:4])
    with pytest.raises(InvalidDeletionVector, match="length prefix"):
        decode_dv(struct.pack(">I", length + delta) + blob[4:])


def test_rejects_trailing_bytes_after_crc() -> None:
    with pytest.raises(InvalidDeletionVector, match="length prefix"):
        decode_dv(_vector(SAMPLE) + b"\x00")


def test_rejects_cardinality_mismatch() -> None:
    with pytest.raises(InvalidDeletionVector, match="cardinality 5 does not match expected 6"):
        decode_dv(_vector(SAMPLE), expected_cardinality=6)


def test_rejects_corrupt_bitmap_with_valid_crc() -> None:
    with pytest.raises(InvalidDeletionVector, match="invalid portable Roaring64"):
        decode_dv(_frame(b"\x05" + bytes(7)))


def test_invalid_deletion_vector_is_value_error() -> None:
    assert issubclass(InvalidDeletionVector, ValueError)


# --- position validation on encode ---


def test_max_position_matches_java() -> None:
    assert MAX_POSITION == 0x7FFF_FFFE_8000_0000
    assert MAX_KEY == 2**31 - 2


def test_encode_accepts_max_position() -> None:
    positions = BitMap64([0, MAX_POSITION])
    assert decode_dv(encode_dv(positions), expected_cardinality=2) == positions


@pytest.mark.parametrize("bad", [MAX_POSITION + 1, 2**63, 2**64 - 1])
def test_encode_rejects_out_of_range_position(bad: int) -> None:
    with pytest.raises(ValueError, match=f"position {bad} is out of range"):
        encode_dv(BitMap64([1, 2, bad]))


def test_encode_names_smallest_bad_position() -> None:
    with pytest.raises(ValueError, match=f"position {MAX_POSITION + 5} "):
        encode_dv(BitMap64([7, MAX_POSITION + 5, 2**64 - 1]))


# --- property test ---

positions_strategy = st.lists(
    st.one_of(
        st.integers(0, 2**17),
        st.integers(B - 70_000, B + 70_000),  # straddles the 32-bit key boundary
        st.integers(0, 5 * B),
        st.integers(0, MAX_POSITION),
    ),
    max_size=300,
)
ranges_strategy = st.lists(st.tuples(st.integers(0, 3 * B), st.integers(1, 20_000)), max_size=3)


@settings(max_examples=examples(200), deadline=None)
@given(points=positions_strategy, ranges=ranges_strategy)
def test_roundtrip_property(points: list[int], ranges: list[tuple[int, int]]) -> None:
    positions = BitMap64(points)
    for start, size in ranges:
        positions.add_range(start, start + size)
    snapshot = positions.serialize()
    blob = encode_dv(positions)
    decoded = decode_dv(blob, expected_cardinality=len(positions))
    assert decoded == positions
    assert positions.serialize() == snapshot
    assert struct.unpack(">I", blob[:4])[0] == len(blob) - 8
