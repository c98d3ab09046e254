"""The FileIO lakesink hands pyiceberg: its PyArrowFileIO, with fewer S3 requests per file.

pyarrow's S3 output stream starts a multipart upload when it opens (CreateMultipartUpload,
UploadPart, CompleteMultipartUpload: three requests for a file of a few KB). With
`allow_delayed_open` it waits for the bytes and writes a file smaller than one part in a
single PutObject. Every file of a streaming batch is that small but its data files (the
manifest, the manifest list, the Puffin file of deletion vectors, the tombstones): measured
with SeaweedFS's request counters, an append batch went from 19.5-23 requests to 10-13, an
upsert from 39.5-52 to 21-22 (benchmarks/OBJECT-STORE.md). Errors the store gives then come
when a file is written, not opened, which every writer of lakesink waits for anyway.

Reads stay two requests a file (the object's size, then its bytes): opening manifests and
metadata files as plain streams was tried and still cost two (pyarrow asks for the size
either way).

Selected through pyiceberg's own `py-io-impl` property (`catalog.loader` sets it when the
write names no FileIO of its own), so catalogs, tables and tasks all load this class.
"""

from __future__ import annotations

from typing import Any

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io.pyarrow import PyArrowFileIO

IMPL = f"{__name__}.LakesinkFileIO"
FILE_IO_IMPL = "py-io-impl"


class LakesinkFileIO(PyArrowFileIO):
    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        fs = super()._initialize_s3_fs(netloc)
        if self.properties.get("s3.retry-strategy-impl"):
            return fs  # a custom retry strategy does not survive the rebuild below
        rebuild: Any
        rebuild, (options,) = fs.__reduce__()
        return rebuild({**options, "allow_delayed_open": True}) if isinstance(fs, S3FileSystem) else fs
