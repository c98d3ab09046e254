"""Table metadata cached once per Python process, keyed by metadata file location.

Spark creates a fresh (unpickled) writer for every task, but reuses the Python worker
processes across tasks and micro-batches. A metadata file never changes once written,
so its location is a perfect cache key: a worker that already parsed this version does
not read it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.io import FileIO, load_file_io
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata

_MAX_ENTRIES = 16
_metadata: OrderedDict[str, TableMetadata] = OrderedDict()
_io: dict[tuple[tuple[str, str], ...], FileIO] = {}
_lock = threading.Lock()
loads = 0  # how many metadata files this process parsed (observability and tests)


def file_io(properties: dict[str, str], location: str) -> FileIO:
    key = (*tuple(sorted(properties.items())), ("__scheme", location.split(":", 1)[0]))
    with _lock:
        io = _io.get(key)
        if io is None:
            io = _io[key] = load_file_io(properties=properties, location=location)
        return io


def load(location: str, properties: dict[str, str]) -> TableMetadata:
    global loads
    with _lock:
        cached = _metadata.get(location)
        if cached is not None:
            _metadata.move_to_end(location)
            return cached
    metadata = FromInputFile.table_metadata(file_io(properties, location).new_input(location))
    with _lock:
        loads += 1
        _metadata[location] = metadata
        while len(_metadata) > _MAX_ENTRIES:
            _metadata.popitem(last=False)
    return metadata
