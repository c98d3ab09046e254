"""Where a table's data and delete files go: `data/<partition>/<file>`, or, with
`write.object-storage.enabled=true`, under hashed directories that spread an object store's
requests over many prefixes.

The hashed layout is Iceberg's object-store location provider's (Java's, which pyiceberg
follows): the murmur3 (32-bit, UTF-8) hash of the file name (of `<partition path>/<file>`
when `write.object-storage.partitioned-paths` is on, the default) keeps its low 20 bits as a
binary string, split into three directories of four digits and one of the last eight:
`data/0101/0110/1010/10101010/<partition>/<file>`; with partitioned paths off the partition
is left out and the hash prefixes the name: `data/0101/0110/1010/10101010-<file>`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mmh3

_HASH_BITS = 20
_DIR_LENGTH = 4
_DIR_DEPTH = 3


def entropy_dirs(name: str) -> str:
    """The hashed directories of `name` in Iceberg's object-store layout."""
    bits = format(mmh3.hash(name) & ((1 << _HASH_BITS) - 1), f"0{_HASH_BITS}b")
    cut = _DIR_DEPTH * _DIR_LENGTH
    dirs = [bits[i : i + _DIR_LENGTH] for i in range(0, cut, _DIR_LENGTH)]
    return "/".join([*dirs, bits[cut:]])


@dataclass(frozen=True)
class DataLocations:
    """How file names under the table's data path become locations."""

    data_path: str
    object_storage: bool = False
    partitioned_paths: bool = True

    def of(self, folder: str, name: str) -> str:
        """The location of data (or delete) file `name` of partition path `folder` ('' for
        an unpartitioned file)."""
        if not self.object_storage:
            return f"{self.data_path}/{folder}/{name}" if folder else f"{self.data_path}/{name}"
        if self.partitioned_paths and folder:
            return f"{self.data_path}/{entropy_dirs(f'{folder}/{name}')}/{folder}/{name}"
        if self.partitioned_paths:
            return f"{self.data_path}/{entropy_dirs(name)}/{name}"
        return f"{self.data_path}/{entropy_dirs(name)}-{name}"
