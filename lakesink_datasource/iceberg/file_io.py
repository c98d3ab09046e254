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

On an object store every file operation also rides out an outage (iceberg/outage.py says
which errors are one, iceberg/retry.py how long they are waited for: on the clock of the
operation the call belongs to, else of its own with the table's properties): a read that
fails for a transient reason reopens the object where it stopped and goes on; a write goes
to a spooled buffer (memory, then a local temporary file) and is uploaded when the file is
closed, the upload repeated until it lands or the outage budget is spent (an object is put
whole, so a repeated upload is the same object). Local files are left as they are.

Selected through pyiceberg's own `py-io-impl` property (`catalog.loader` sets it when the
write names no FileIO of its own), so catalogs, tables and tasks all load this class.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from pyarrow.fs import FileSystem, S3FileSystem
from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from lakesink_datasource.iceberg.retry import RetryPolicy, active, store_unavailable

T = TypeVar("T")

_SPOOL_IN_MEMORY = 16 * 1024 * 1024  # bytes a written file keeps in memory before spilling to disk

IMPL = f"{__name__}.LakesinkFileIO"
FILE_IO_IMPL = "py-io-impl"


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def _retried(io: LakesinkFileIO, call: Callable[[], T], what: str) -> T:
    """`call()` through an outage of the store, on the retry clock of the operation (else on
    one of its own, with the budgets of the FileIO's table)."""
    clock = active() or io.retry_policy.start(what)
    return clock.run(call, doing=what, exhausted=store_unavailable)


class LakesinkFileIO(PyArrowFileIO):
    @functools.cached_property
    def retry_policy(self) -> RetryPolicy:
        """The budgets of a call made outside any operation: the table's properties, which
        a table's FileIO holds (pyiceberg loads it with them)."""
        return RetryPolicy.from_properties(self.properties)

    def new_input(self, location: str) -> InputFile:  # type: ignore[override]  # a wrapper of PyArrowFile on stores
        inner = super().new_input(location)
        return inner if _is_local(location) else _RetryingFile(inner, self)

    def new_output(self, location: str) -> OutputFile:  # type: ignore[override]
        inner = super().new_output(location)
        return inner if _is_local(location) else _RetryingFile(inner, self)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location if isinstance(location, str) else location.location
        if _is_local(path):
            super().delete(path)
        else:
            _retried(self, lambda: PyArrowFileIO.delete(self, path), f"deleting {path}")

    def _initialize_s3_fs(self, netloc: str | None) -> FileSystem:
        fs = super()._initialize_s3_fs(netloc)
        if self.properties.get("s3.retry-strategy-impl"):
            return fs  # a custom retry strategy does not survive the rebuild below
        rebuild: Any
        rebuild, (options,) = fs.__reduce__()
        return rebuild({**options, "allow_delayed_open": True}) if isinstance(fs, S3FileSystem) else fs


class _RetryingFile(InputFile, OutputFile):
    """An object on a store: every call retried through an outage."""

    def __init__(self, inner: PyArrowFile, io: LakesinkFileIO) -> None:
        InputFile.__init__(self, inner.location)
        self._inner = inner
        self._io = io

    def __len__(self) -> int:
        return _retried(self._io, lambda: len(self._inner), f"reading the size of {self.location}")

    def exists(self) -> bool:
        return _retried(self._io, self._inner.exists, f"looking for {self.location}")

    def open(self, seekable: bool = True) -> InputStream:
        return _RetryingInput(self._inner, seekable, self._io)

    def create(self, overwrite: bool = False) -> OutputStream:
        return _SpooledUpload(self._inner, overwrite, self._io)

    def to_input_file(self) -> InputFile:
        return self


class _RetryingInput:
    """A read stream that reopens the object at its position when a read fails transiently."""

    def __init__(self, inner: PyArrowFile, seekable: bool, io: LakesinkFileIO) -> None:
        self._inner, self._seekable, self._io = inner, seekable, io
        self._position = 0
        self._stream: Any = _retried(io, lambda: inner.open(seekable=seekable), f"opening {inner.location}")
        self.closed = False

    def _again(self, call: Any, what: str) -> Any:
        def attempt() -> Any:
            if self._stream is None:
                # The last attempt's stream failed and is not trusted again: reopen the object
                # where that attempt was (a reopen that fails is retried like the read).
                self._stream = self._inner.open(seekable=self._seekable)
                if self._position:
                    self._stream.seek(self._position)
            try:
                return call()
            except Exception:
                stream, self._stream = self._stream, None
                try:
                    stream.close()
                except Exception:  # noqa: BLE001 (it failed already)
                    pass
                raise

        return _retried(self._io, attempt, f"{what} {self._inner.location}")

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._again(lambda: self._stream.read(size) if size is not None and size >= 0 else self._stream.read(), "reading")
        self._position += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._position = int(self._again(lambda: self._stream.seek(offset, whence), "seeking in"))
        return self._position

    def tell(self) -> int:
        return self._position

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._stream is not None:
                self._stream.close()

    def __enter__(self) -> _RetryingInput:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class _SpooledUpload:
    """A write stream whose bytes are uploaded as one object when it is closed, the upload
    retried through an outage (the bytes stay in the spool until it lands)."""

    def __init__(self, inner: PyArrowFile, overwrite: bool, io: LakesinkFileIO) -> None:
        self._inner, self._overwrite, self._io = inner, overwrite, io
        self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 (closed in close())
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._spool.write(data)

    def tell(self) -> int:
        return self._spool.tell()

    def flush(self) -> None:
        pass  # the object is put whole at close

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def _upload(self, overwrite: bool) -> None:
        self._spool.seek(0)
        with self._inner.create(overwrite=overwrite) as out:
            shutil.copyfileobj(self._spool, out, 8 * 1024 * 1024)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            first = [True]

            def upload() -> None:
                # A retried upload may meet the object an earlier attempt did put after all.
                overwrite = self._overwrite or not first[0]
                first[0] = False
                self._upload(overwrite)

            _retried(self._io, upload, f"writing {self._inner.location}")
        finally:
            self._spool.close()

    def __enter__(self) -> _SpooledUpload:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None:
            # The writer failed: put nothing (a partial object would be worse than none).
            self.closed = True
            self._spool.close()
            return
        self.close()
