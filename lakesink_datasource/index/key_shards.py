"""Key shards: the key space split so that each host holds and updates only its part.

`cluster_by_key` gives every row a shard value, computed by Spark from the key columns (no
row crosses into Python for it): the key's shard, `pmod(xxhash64(keys), shards)`, packed
with the shard count and a fingerprint of the key columns' names. Rows are then grouped by
that value, so each Spark partition holds one shard; behind a stateful operator Spark runs
a partition's task where it ran before, so a shard stays on its executor from batch to
batch. The keyed task reads the value, opens its host's index of that one shard, and the
index keeps only that shard's keys: whatever it reads back from data files (another
host's rows, a compaction, a rebuild) is filtered by the same hash (`spark_hash.py`).

A write routed to many tables (`table_column`) shards each table's keys by their text
instead (`by_text`): the tables' key columns and types are only known once their rows are
read, so Spark hashes each key field as a string (`pmod(xxhash64(k1, k2, ...), shards)` over
the fields' texts, ordered by lower-cased name), and every key a task writes is checked
against that shard in the table's types (`keeps`), so a key whose text its table would spell
otherwise is refused rather than indexed in a shard its rows never reach.

The packed value (a positive bigint): bits 0-15 the shard, 16-31 the shard count, 32-47 the
key names' fingerprint (0 for a text shard), 48-61 a salt, 62 set for a text shard. Spark's `HashPartitioning` sends a row to partition
`pmod(murmur3(value), partitions)`; the salt is chosen per shard so that shard `r` lands on
partition `r mod partitions`: every partition gets one shard (with as many shards as
partitions), none gets two.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakesink_datasource.index.spark_hash import murmur3_long, xxhash64

__all__ = [
    "MAX_SHARDS",
    "NO_SHARD",
    "SHARD_BY_TEXT",
    "SHARD_COLUMN",
    "SHARD_KEY_COLUMNS",
    "SHARD_NAME_PREFIXES",
    "KeyShard",
    "file_shard",
    "key_fingerprint",
    "key_texts",
    "misclustered_message",
    "shard_of_key_texts",
    "shard_of_keys",
    "shard_values",
    "text_misclustered",
]

SHARD_COLUMN = "__lakesink_key_shard"
SHARD_KEY_COLUMNS = "lakesink_key_columns"  # the shard column's metadata: the key columns it hashed
NO_SHARD = -1  # the shard of a row routed to many tables whose table has no key to shard by
SHARD_BY_TEXT = "lakesink_route_by_text"  # ... or that it hashed each table's key texts (many tables)
MAX_SHARDS = 1 << 15
_SALTS = 1 << 14
_TEXT_BIT = 1 << 62
# How KeyShard.name() begins: a typed shard, a text shard (index directories and
# published copies' folders are told from a whole index's by these).
SHARD_NAME_PREFIXES = ("key-shard-", "key-text-shard-")


@dataclass(frozen=True)
class KeyShard:
    """Shard `shard` of `shards`: the part of the key space an index holds."""

    shard: int
    shards: int
    by_text: bool = False  # keys hashed as their fields' texts (a write routed to many tables)

    def __post_init__(self) -> None:
        if not 0 < self.shards <= MAX_SHARDS or not 0 <= self.shard < self.shards:
            raise ValueError(f"key shard {self.shard} of {self.shards} is out of range")

    def name(self) -> str:
        """How a host's index directory and the published copies name this shard."""
        return f"{SHARD_NAME_PREFIXES[self.by_text]}{self.shard:05d}-of-{self.shards:05d}"

    def file_tag(self) -> str:
        """What a data file holding only this shard's keys carries in its name: a routed
        task's files, and lakesink's compactions of such files, which merge one shard's files
        only. Another shard's index skips them without reading them."""
        return f"{'kt' if self.by_text else 'ks'}{self.shard:05d}of{self.shards:05d}"

    def skips(self, path: str) -> bool:
        """Whether a data file named `path` holds no key of this shard (its tag names another)."""
        tagged = file_shard(path)
        return (
            tagged is not None and tagged.by_text == self.by_text and tagged.shards == self.shards and tagged.shard != self.shard
        )

    def key_order(self, names: Sequence[str]) -> list[str]:
        """The key columns in the order the route hashes them: a text route's by lower-cased
        name (the route cannot know a table's key order), a typed route's as the key has them."""
        return sorted(names, key=str.lower) if self.by_text else list(names)

    def keeps(self, key_columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
        """Which rows of these key columns (in the table's types, in `key_order`) belong to
        this shard."""
        if self.by_text:
            return shard_of_key_texts(key_columns, self.shards) == self.shard
        return shard_of_keys(key_columns, self.shards) == self.shard


_FILE_TAG = re.compile(r"-k([st])(\d{5})of(\d{5})-\d{5}\.parquet$")


def file_shard(path: str) -> KeyShard | None:
    """The key shard whose keys alone a data file holds, from its name (None: untagged)."""
    found = _FILE_TAG.search(path)
    if found is None or not 0 <= int(found[2]) < int(found[3]) <= MAX_SHARDS:
        return None
    return KeyShard(int(found[2]), int(found[3]), by_text=found[1] == "t")


def shard_of_keys(key_columns: Sequence[pa.Array | pa.ChunkedArray], shards: int) -> np.ndarray:
    """Each row's key shard, as Spark computes it: `pmod(xxhash64(k1, k2, ...), shards)`."""
    return np.mod(xxhash64(key_columns), shards)


def key_texts(key_columns: Sequence[pa.Array | pa.ChunkedArray]) -> list[pa.Array]:
    """Each key column as the strings a text route hashes: Arrow's text of the value, which
    is Spark's JSON text of it for integers, strings, booleans and dates (other types may be
    spelled otherwise: their rows are then refused, never misplaced)."""
    return [pc.cast(c, pa.string()) for c in key_columns]


def shard_of_key_texts(key_columns: Sequence[pa.Array | pa.ChunkedArray], shards: int) -> np.ndarray:
    """Each row's text-route shard: `pmod(xxhash64(text(k1), text(k2), ...), shards)`."""
    return np.mod(xxhash64(key_texts(key_columns)), shards)


def text_misclustered(routes: pa.Array | pa.ChunkedArray, key_columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """Which rows' packed text routes name another shard than their keys' texts hash to (a
    row without a route, NO_SHARD, counts as misrouted)."""
    values = np.asarray(routes.to_numpy(zero_copy_only=False), dtype=np.int64)
    routed = values >= 0
    shards = np.where(routed, (values >> 16) & 0xFFFF, 1)
    hashed = np.mod(xxhash64(key_texts(key_columns)), shards)
    return ~routed | (hashed != (values & 0xFFFF))


def misclustered_message(table: str, count: int, example: dict[str, object], types: str) -> str:
    """Why rows of `table` routed by their key's text are refused (the clustered task's check
    and the keyed writer's say the same)."""
    return (
        f"table {table}: cluster_by_key routed {count} row(s) by a key text that differs from the table's own text of "
        f"the key (first: {example}; key {types}). A write routed to many tables hashes each key field's JSON text: "
        "give keys of integer, string, boolean or date types, spelled as plain JSON values, or write this table "
        "without cluster_by_key. Nothing was written"
    )


def key_fingerprint(names: Sequence[str]) -> int:
    """16 bits naming the key columns (case-insensitively): a task refuses rows routed by
    other columns than its write's primary key."""
    return zlib.crc32(",".join(n.lower() for n in names).encode()) & 0xFFFF


def shard_values(shards: int, partitions: int, names: Sequence[str] | None) -> list[int]:
    """The packed route value of every shard, salted so that Spark's hash partitioning into
    `partitions` puts shard r on partition `r mod partitions`. `names` None: a text route."""
    if not 0 < shards <= MAX_SHARDS:
        raise ValueError(f"shards must be between 1 and {MAX_SHARDS}")
    base = (_TEXT_BIT if names is None else key_fingerprint(names) << 32) | (shards << 16)
    salts = np.arange(_SALTS, dtype=np.int64) << 48
    values = []
    for shard in range(shards):
        candidates = salts | base | shard
        placed = np.mod(murmur3_long(candidates).astype(np.int64), partitions)
        hits = np.flatnonzero(placed == shard % partitions)
        # Past 16K partitions a shard may find no salt: it then shares a partition, which
        # costs balance, not correctness (the task splits its rows by shard).
        values.append(int(candidates[hits[0]] if len(hits) else candidates[0]))
    return values


def decode_shard(value: int) -> tuple[KeyShard, int]:
    """(the shard, the key names' fingerprint) of a packed route value."""
    return KeyShard(value & 0xFFFF, (value >> 16) & 0xFFFF, by_text=bool(value & _TEXT_BIT)), (value >> 32) & 0xFFFF
