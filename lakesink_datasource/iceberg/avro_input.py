"""Avro files (manifests, manifest lists) read with their reader built once per schema.

pyiceberg's `AvroFile` turns each file's header schema into an Iceberg schema and resolves a
reader tree against the read schema on every open: about 1.5 ms, where decoding a small
manifest takes less. A commit opens a few manifests and a manifest list of each table it
touches, with the same few schemas every time (measured: 400 opens for 40 table commits,
0.6 s of a routed batch's commit time). Readers hold no state of a file (they read from the
decoder they are given), so one resolved reader serves every file of its schema.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any, Generic, TypeVar

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.file import _SCHEMA_KEY, AvroFile
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import resolve_reader
from pyiceberg.schema import Schema
from pyiceberg.typedef import StructProtocol
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

D = TypeVar("D", bound=StructProtocol)


class SchemaCachedAvroFile(AvroFile[D], Generic[D]):
    """`AvroFile` whose file schema and resolved reader come from a cache keyed by the
    header's schema text and the read schema, types and enums (which callers pass as
    module-level constants)."""

    def __enter__(self) -> SchemaCachedAvroFile[D]:
        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = self._read_header()
        text = self.header.meta.get(_SCHEMA_KEY)
        if text is None:
            raise ValueError(f"no schema in the Avro header of {self.input_file.location}")
        self.schema, self.reader = _resolved(
            text, self.read_schema, tuple(self.read_types.items()), tuple(self.read_enums.items())
        )
        if not self.read_schema:
            self.read_schema = self.schema
        return self


# (schema text, id of the read schema, read types, read enums) -> (the read schema itself,
# the file schema, its reader). Read schemas are pydantic models (unhashable), so they are
# keyed by identity and kept in the value, which also keeps their id from being reused.
_RESOLVED: dict[tuple[object, ...], tuple[Schema | None, Schema, Reader]] = {}
_MAX_RESOLVED = 64
_lock = threading.Lock()


def _resolved(
    text: str,
    read_schema: Schema | None,
    read_types: tuple[tuple[int, Callable[..., StructProtocol]], ...],
    read_enums: tuple[tuple[int, Callable[..., Enum]], ...],
) -> tuple[Schema, Reader]:
    key = (text, id(read_schema), read_types, read_enums)
    found = _RESOLVED.get(key)
    if found is not None and found[0] is read_schema:
        return found[1], found[2]
    file_schema: Any = AvroSchemaConversion().avro_to_iceberg(json.loads(text))
    reader = resolve_reader(file_schema, read_schema or file_schema, dict(read_types), dict(read_enums))
    with _lock:
        if len(_RESOLVED) >= _MAX_RESOLVED:
            _RESOLVED.clear()  # a handful of schemas in practice; never grows without bound
        _RESOLVED[key] = (read_schema, file_schema, reader)
    return file_schema, reader
