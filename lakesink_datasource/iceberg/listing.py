"""Listing files under a location through a table's own FileIO.

pyiceberg's FileIO reads, writes and deletes but does not list; lakesink lists (orphan
removal, a table location's existing metadata) with the file system the FileIO itself
would use, so the catalog's and table's properties apply (S3 endpoint, credentials,
region, path-style access, vended credentials) instead of a default client that would
go to AWS.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyiceberg.io import FileIO


@dataclass(frozen=True)
class ListedFile:
    path: str  # as the FileIO names it: a plain path for local files, else scheme://bucket/key
    size: int
    mtime_ms: int


def list_files(io: FileIO, location: str) -> Iterator[ListedFile]:
    """Every file under `location` (recursively; nothing when it does not exist)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    if isinstance(io, PyArrowFileIO):
        yield from _pyarrow_listing(io, location)
        return
    from pyiceberg.io.fsspec import FsspecFileIO

    if isinstance(io, FsspecFileIO):
        yield from _fsspec_listing(io, location)
        return
    raise TypeError(f"cannot list {location} with {type(io).__name__}: lakesink lists with pyiceberg's PyArrowFileIO or FsspecFileIO")


def _pyarrow_listing(io: FileIO, location: str) -> Iterator[ListedFile]:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    assert isinstance(io, PyArrowFileIO)
    scheme, netloc, path = PyArrowFileIO.parse_location(location, io.properties)
    fs = io.fs_by_scheme(scheme, netloc)
    root = path.rstrip("/")
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        mtime = int(info.mtime.timestamp() * 1000) if info.mtime is not None else 0
        yield ListedFile(_full_path(scheme, netloc, info.path), info.size or 0, mtime)


def _full_path(scheme: str, netloc: str, path: str) -> str:
    if scheme == "file":
        return path
    if scheme in ("hdfs", "viewfs"):
        return f"{scheme}://{netloc}{path}"
    return f"{scheme}://{path}"  # object stores: the path starts with the bucket


def _fsspec_listing(io: FileIO, location: str) -> Iterator[ListedFile]:
    from pyiceberg.io.fsspec import FsspecFileIO

    assert isinstance(io, FsspecFileIO)
    parsed = urlparse(location)
    scheme = parsed.scheme or "file"
    fs = io.get_fs(scheme)
    root = location if scheme != "file" else parsed.path or location
    if not fs.exists(root):
        return
    for path, info in fs.find(root, detail=True).items():
        if info.get("type", "file") != "file":
            continue
        modified = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
        mtime = int(modified.timestamp() * 1000) if hasattr(modified, "timestamp") else int(float(modified or 0) * 1000)
        full = path if scheme == "file" or "://" in path else f"{scheme}://{path}"
        yield ListedFile(os.path.normpath(full) if scheme == "file" else full, int(info.get("size") or 0), mtime)
