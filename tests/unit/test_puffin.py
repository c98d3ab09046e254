"""Tests for the Puffin writer/reader against Iceberg-Java-written files and pyiceberg's reader."""

from __future__ import annotations

import struct
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from pyroaring import BitMap64

from lakesink_datasource.iceberg.deletion_vector import MAX_POSITION, InvalidDeletionVector, encode_dv
from lakesink_datasource.iceberg.puffin import (
    DEFAULT_CREATED_BY,
    BlobMetadata,
    DVBlobRef,
    FileMetadata,
    InvalidPuffinFile,
    PuffinWriter,
    read_blob,
    read_deletion_vectors,
    read_footer,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors"
GO_FIXTURES_CREATED_BY = "iceberg-go DV cross-client fixtures (apache/iceberg)"
B = 2**32


def _vector(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


def _payload(data: bytes) -> bytes:
    """Footer JSON sliced by hand, independently of read_footer."""
    (size,) = struct.unpack("<i", data[-12:-8])
    return data[-12 - size : -12]


def _assemble(blobs: bytes, payload: bytes, flags: bytes = bytes(4), size: int | None = None) -> bytes:
    size = len(payload) if size is None else size
    return b"PFA1" + blobs + b"PFA1" + payload + struct.pack("<i", size) + flags + b"PFA1"


# --- Iceberg Java written DV files (via iceberg-go fixtures) ---

SINGLE_PATH = "s3://warehouse/db/table/data/00000-0-abc.parquet"
MULTI_EXPECTED = {
    "s3://warehouse/db/table/data/file-001.parquet": BitMap64([0, 100, 200]),
    "s3://warehouse/db/table/data/file-002.parquet": BitMap64([50, 150]),
}


@pytest.mark.parametrize("name", ["single-blob-dv.puffin", "multi-blob-dv.puffin"])
def test_java_dv_files_decode_consistently_with_footer(name: str) -> None:
    data = _vector(f"iceberg-go-java-puffin/{name}")
    footer = read_footer(data)
    decoded = read_deletion_vectors(data)
    assert set(decoded) == {blob.properties["referenced-data-file"] for blob in footer.blobs}
    for blob in footer.blobs:
        assert blob.type == "deletion-vector-v1"
        assert blob.fields == [2147483645]
        assert (blob.snapshot_id, blob.sequence_number) == (-1, -1)
        assert blob.compression_codec is None
        bitmap = decoded[blob.properties["referenced-data-file"]]
        assert len(bitmap) == int(blob.properties["cardinality"])
        # Java's reader path: only offset/length from the manifest, no footer.
        assert read_blob(data, blob.offset, blob.length, len(bitmap)) == bitmap
    assert footer.properties == {"created-by": GO_FIXTURES_CREATED_BY}


def test_java_single_blob_contents() -> None:
    data = _vector("iceberg-go-java-puffin/single-blob-dv.puffin")
    assert read_deletion_vectors(data) == {SINGLE_PATH: BitMap64([1, 3, 5, 7, 9])}
    (blob,) = read_footer(data).blobs
    assert (blob.offset, blob.length) == (4, 50)


def test_java_multi_blob_contents() -> None:
    data = _vector("iceberg-go-java-puffin/multi-blob-dv.puffin")
    assert read_deletion_vectors(data) == MULTI_EXPECTED
    assert [(b.offset, b.length) for b in read_footer(data).blobs] == [(4, 46), (50, 44)]


@pytest.mark.parametrize(
    ("name", "dvs"),
    [
        ("single-blob-dv.puffin", {SINGLE_PATH: BitMap64([1, 3, 5, 7, 9])}),
        ("multi-blob-dv.puffin", MULTI_EXPECTED),
    ],
)
def test_writer_reproduces_java_files_byte_for_byte(name: str, dvs: dict[str, BitMap64]) -> None:
    writer = PuffinWriter()
    for path, positions in dvs.items():
        writer.add_deletion_vector(path, positions)
    assert writer.finish(created_by=GO_FIXTURES_CREATED_BY) == _vector(f"iceberg-go-java-puffin/{name}")


# --- apache/iceberg Puffin spec files (not DVs) ---


def test_empty_puffin_footer() -> None:
    data = _vector("iceberg-puffin/empty-puffin-uncompressed.bin")
    assert read_footer(data) == FileMetadata(blobs=[])
    assert len(data) - _footer_start(data) == 28
    assert read_deletion_vectors(data) == {}
    # An empty writer with no created-by gives Java's exact bytes.
    assert PuffinWriter().finish(created_by="") == data


def test_sample_metric_data_uncompressed_footer() -> None:
    data = _vector("iceberg-puffin/sample-metric-data-uncompressed.bin")
    footer = read_footer(data)
    assert footer.properties == {"created-by": "Test 1234"}
    first, second = footer.blobs
    assert first == BlobMetadata(
        type="some-blob", fields=[1], snapshot_id=2, sequence_number=1, offset=4, length=9
    )
    assert second == BlobMetadata(
        type="some-other-blob", fields=[2], snapshot_id=2, sequence_number=1, offset=13, length=83
    )
    assert data[first.offset : first.offset + first.length] == b"abcdefghi"
    assert read_deletion_vectors(data) == {}  # no DV blobs to decode
    # Our encoder writes Java's footer JSON byte for byte (compact, same key order, no codec key).
    assert msgspec.json.encode(footer) == _payload(data)


def test_sample_metric_data_zstd_footer() -> None:
    data = _vector("iceberg-puffin/sample-metric-data-compressed-zstd.bin")
    footer = read_footer(data)
    # 314 is the whole footer: magic + 298-byte payload + size + flags + magic.
    assert len(data) - _footer_start(data) == 314
    assert len(_payload(data)) == 298
    assert [b.compression_codec for b in footer.blobs] == ["zstd", "zstd"]
    assert [(b.offset, b.length) for b in footer.blobs] == [(4, 22), (26, 77)]
    assert msgspec.json.encode(footer) == _payload(data)


# --- our writer ---

SEVERAL = {
    "s3://bucket/t/data/a.parquet": BitMap64([0, 1, 2, 1000]),
    "s3://bucket/t/data/b.parquet": BitMap64(range(10, 70_000)),
    "s3://bucket/t/data/ünïcode file.parquet": BitMap64([5, B + 5, 3 * B + 17]),
    "s3://bucket/t/data/d.parquet": BitMap64(),
}


def _write_several() -> tuple[bytes, list[DVBlobRef]]:
    writer = PuffinWriter()
    refs = [writer.add_deletion_vector(path, positions) for path, positions in SEVERAL.items()]
    return writer.finish(created_by="lakesink test"), refs


def test_writer_roundtrip_several_dvs() -> None:
    data, refs = _write_several()
    assert read_deletion_vectors(data) == SEVERAL
    assert data[:4] == b"PFA1"
    offset = 4
    for ref, (path, positions) in zip(refs, SEVERAL.items()):
        assert ref == DVBlobRef(path, offset, len(encode_dv(positions)), len(positions))
        assert data[ref.offset : ref.offset + ref.length] == encode_dv(positions)
        assert read_blob(data, ref.offset, ref.length, ref.cardinality) == positions
        offset += ref.length
    assert data[offset : offset + 4] == b"PFA1"  # footer follows the last blob directly
    assert data[-8:-4] == bytes(4)


def test_writer_footer_json_matches_java_shape() -> None:
    data, refs = _write_several()
    blob_json = [
        '{"type":"deletion-vector-v1","fields":[2147483645],"snapshot-id":-1,"sequence-number":-1,'
        f'"offset":{ref.offset},"length":{ref.length},'
        f'"properties":{{"referenced-data-file":"{ref.referenced_data_file}",'
        f'"cardinality":"{ref.cardinality}"}}}}'
        for ref in refs
    ]
    expected = '{"blobs":[' + ",".join(blob_json) + '],"properties":{"created-by":"lakesink test"}}'
    assert _payload(data) == expected.encode("utf-8")
    assert b"compression-codec" not in data


def test_writer_default_created_by() -> None:
    data = PuffinWriter().finish()
    assert DEFAULT_CREATED_BY.startswith("lakesink ")
    assert read_footer(data).properties == {"created-by": DEFAULT_CREATED_BY}


def test_writer_output_readable_by_pyiceberg() -> None:
    from pyiceberg.table.deletion_vector import deletion_vectors_from_puffin_file
    from pyiceberg.table.puffin import PuffinFile

    # pyiceberg 0.12 cannot turn an empty DV into a vector (pa.chunked_array of nothing, no type).
    non_empty = {path: positions for path, positions in SEVERAL.items() if positions}
    writer = PuffinWriter()
    for path, positions in non_empty.items():
        writer.add_deletion_vector(path, positions)
    data = writer.finish()
    puffin = PuffinFile(data)
    assert [b.offset for b in puffin.footer.blobs] == [b.offset for b in read_footer(data).blobs]
    decoded = {
        dv.referenced_data_file: BitMap64(dv.to_vector().to_pylist())
        for dv in deletion_vectors_from_puffin_file(puffin)
    }
    assert decoded == non_empty


def test_writer_rejects_duplicate_data_file() -> None:
    writer = PuffinWriter()
    writer.add_deletion_vector("f.parquet", BitMap64([1]))
    with pytest.raises(ValueError, match="duplicate"):
        writer.add_deletion_vector("f.parquet", BitMap64([2]))


def test_writer_finish_is_final_and_stable() -> None:
    writer = PuffinWriter()
    writer.add_deletion_vector("f.parquet", BitMap64([1]))
    first = writer.finish(created_by="x")
    assert writer.finish(created_by="x") is first
    with pytest.raises(RuntimeError):
        writer.add_deletion_vector("g.parquet", BitMap64([1]))


def test_writer_rejects_out_of_range_position() -> None:
    with pytest.raises(ValueError, match=str(MAX_POSITION + 1)):
        PuffinWriter().add_deletion_vector("f.parquet", BitMap64([MAX_POSITION + 1]))


# --- malformed files ---

GOOD = "iceberg-go-java-puffin/multi-blob-dv.puffin"


def _replace(data: bytes, at: int, new: bytes) -> bytes:
    at = at % len(data)
    return data[:at] + new + data[at + len(new) :]


def _footer_start(data: bytes) -> int:
    return len(data) - 12 - len(_payload(data)) - 4


@pytest.mark.parametrize(
    ("where", "message"),
    [(0, "bad leading"), (-4, "bad trailing")],
)
def test_rejects_bad_outer_magic(where: int, message: str) -> None:
    data = _replace(_vector(GOOD), where, b"PFA2")
    with pytest.raises(InvalidPuffinFile, match=message):
        read_footer(data)


def test_rejects_bad_footer_magic() -> None:
    data = _vector(GOOD)
    bad = _replace(data, _footer_start(data), b"XFA1")
    with pytest.raises(InvalidPuffinFile, match="bad footer"):
        read_footer(bad)


@pytest.mark.parametrize("keep", [0, 4, 19, 100, -1])
def test_rejects_truncated_file(keep: int) -> None:
    data = _vector(GOOD)
    with pytest.raises(InvalidPuffinFile):
        read_footer(data[:keep])


def test_rejects_file_missing_its_start() -> None:
    # Footer intact but the leading magic and first blob are gone.
    data = _vector(GOOD)
    with pytest.raises(InvalidPuffinFile):
        read_deletion_vectors(data[4:])


def test_rejects_compressed_footer_flag() -> None:
    data = _replace(_vector(GOOD), -8, b"\x01")
    with pytest.raises(InvalidPuffinFile, match="compressed"):
        read_footer(data)


@pytest.mark.parametrize("flags", [b"\x02\x00\x00\x00", b"\x00\x00\x00\x80"])
def test_rejects_unknown_flags(flags: bytes) -> None:
    data = _replace(_vector(GOOD), -8, flags)
    with pytest.raises(InvalidPuffinFile, match="unknown flags"):
        read_footer(data)


@pytest.mark.parametrize("size", [10_000, 2**31 - 1, -1, -(2**31)])
def test_rejects_footer_size_outside_file(size: int) -> None:
    data = _replace(_vector(GOOD), -12, struct.pack("<i", size))
    with pytest.raises(InvalidPuffinFile, match="outside"):
        read_footer(data)


def test_rejects_footer_size_off_by_one() -> None:
    data = _vector(GOOD)
    (size,) = struct.unpack("<i", data[-12:-8])
    with pytest.raises(InvalidPuffinFile, match="bad footer"):
        read_footer(_replace(data, -12, struct.pack("<i", size + 1)))


@pytest.mark.parametrize(
    "payload",
    [b"{not json", b"[]", b'{"blobs":[{"type":"x"}]}', b'{"blobs":[{"type":"x","fields":["a"],'
     b'"snapshot-id":1,"sequence-number":1,"offset":4,"length":0}]}'],
)
def test_rejects_invalid_footer_json(payload: bytes) -> None:
    with pytest.raises(InvalidPuffinFile, match="not valid FileMetadata"):
        read_footer(_assemble(b"", payload))


def test_rejects_blob_outside_blob_area() -> None:
    payload = (
        b'{"blobs":[{"type":"x","fields":[],"snapshot-id":1,"sequence-number":1,"offset":4,"length":5}]}'
    )
    with pytest.raises(InvalidPuffinFile, match="outside the blob area"):
        read_footer(_assemble(b"abcd", payload))  # blob overlaps the footer magic


def _dv_file(properties: str, blob: bytes, codec: str = "") -> bytes:
    payload = (
        '{"blobs":[{"type":"deletion-vector-v1","fields":[2147483645],"snapshot-id":-1,'
        f'"sequence-number":-1,"offset":4,"length":{len(blob)}{codec},"properties":{properties}}}]}}'
    )
    return _assemble(blob, payload.encode())


def test_rejects_dv_cardinality_property_mismatch() -> None:
    data = _dv_file('{"referenced-data-file":"f","cardinality":"3"}', encode_dv(BitMap64([1, 2])))
    with pytest.raises(InvalidDeletionVector, match=r"'f'.*cardinality 2 does not match expected 3"):
        read_deletion_vectors(data)


@pytest.mark.parametrize(
    "properties",
    [
        '{"cardinality":"2"}',
        '{"referenced-data-file":"f"}',
        '{"referenced-data-file":"f","cardinality":"two"}',
        '{"referenced-data-file":"f","cardinality":"-2"}',
    ],
)
def test_rejects_dv_with_bad_properties(properties: str) -> None:
    with pytest.raises(InvalidPuffinFile):
        read_deletion_vectors(_dv_file(properties, encode_dv(BitMap64([1, 2]))))


def test_rejects_compressed_dv_blob() -> None:
    data = _dv_file(
        '{"referenced-data-file":"f","cardinality":"2"}',
        encode_dv(BitMap64([1, 2])),
        ',"compression-codec":"zstd"',
    )
    with pytest.raises(InvalidPuffinFile, match="compressed"):
        read_deletion_vectors(data)


def test_rejects_corrupt_dv_blob_in_file() -> None:
    data, refs = _write_several()
    corrupt = _replace(data, refs[1].offset + 10, b"\xff")
    with pytest.raises(InvalidDeletionVector, match=r"b\.parquet.*CRC mismatch"):
        read_deletion_vectors(corrupt)


def test_read_blob_rejects_range_outside_file() -> None:
    data = _vector("iceberg-go-java-puffin/single-blob-dv.puffin")
    with pytest.raises(InvalidPuffinFile, match="outside"):
        read_blob(data, len(data) - 10, 50, None)
    with pytest.raises(InvalidDeletionVector, match="length prefix"):
        read_blob(data, 4, 49, 5)  # manifest size disagreeing with the blob's own prefix


# --- property test ---

path_strategy = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)
positions_strategy = st.lists(
    st.one_of(st.integers(0, 2**16), st.integers(B - 50, B + 50), st.integers(0, MAX_POSITION)), max_size=100
).map(BitMap64)


@settings(max_examples=examples(100), deadline=None)
@given(dvs=st.dictionaries(path_strategy, positions_strategy, max_size=6))
def test_puffin_roundtrip_property(dvs: dict[str, BitMap64]) -> None:
    writer = PuffinWriter()
    refs = [writer.add_deletion_vector(path, positions) for path, positions in dvs.items()]
    data = writer.finish()
    assert read_deletion_vectors(data) == dvs
    footer = read_footer(data)
    assert [(b.offset, b.length) for b in footer.blobs] == [(r.offset, r.length) for r in refs]
    for ref in refs:
        assert read_blob(data, ref.offset, ref.length, ref.cardinality) == dvs[ref.referenced_data_file]
