"""The undo log of one key index environment: what a pending token changed, so that a
write that never reached the table can be taken back.

Records live in the environment's ``undo`` sub-database: ``b"t" + token`` -> token record
(the token's text, its first sequence number and its chunks' numbers), ``b"c" + u64be
seq`` -> packed undo chunk; the next sequence number is a counter in ``meta``.

Every keyed write records, in the same transaction as the change, one undo record per key
it actually changes: ``(key, previous value or absent, new value or absent)``, packed into
chunks numbered by a global sequence. Rolling back replays the chunks of the chosen tokens
newest first, so when one token touched a key twice the older record is replayed last and
the key ends at its value from before the token (the "first previous value wins" rule
falls out of the replay order, without reading old chunks on every write). A record is
only replayed while the key still holds the value that record wrote: if a surviving token
(e.g. a retried task attempt that was committed) overwrote the key afterwards, rolling
back the failed one must not clobber the survivor.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterator, Sequence
from itertools import compress, repeat
from typing import Any, cast

import numpy as np

from lakesink_datasource.index.lmdb_env import Txn, fit_key

__all__ = ["MAX_VALUE_LENGTH", "UndoLog"]

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U64BE = struct.Struct(">Q")
_ABSENT = 0xFFFF  # undo length sentinel: the key had / gets no value
# Value lengths are u16 with one value taken by _ABSENT: a longer value cannot be undone.
MAX_VALUE_LENGTH = _ABSENT - 1

# Records per undo chunk: ~300 KiB for typical keys, a few MiB at worst (511-byte keys),
# so no single LMDB value needs a huge run of contiguous overflow pages.
_UNDO_CHUNK_RECORDS = 8192

_META_NEXT_UNDO_SEQ = b"next_undo_seq"

# key -> {value a rolled-back write left: the value it had replaced}
Superseded = dict[bytes, dict[bytes | None, bytes | None]]


def _value_lengths(values: Sequence[bytes | None]) -> np.ndarray:
    # map/compress keep the per-value work in C: this runs for every changed key.
    present = np.fromiter(map(operator.is_not, values, repeat(None)), dtype=bool, count=len(values))
    lengths = np.full(len(values), _ABSENT, dtype=np.int64)
    kept = cast(Iterator[bytes], compress(values, present))  # the Nones are filtered out
    lengths[present] = np.fromiter(map(len, kept), dtype=np.int64, count=int(present.sum()))
    return lengths


def _pack_undo_chunk(keys: Sequence[bytes], prevs: Sequence[bytes | None], news: Sequence[bytes | None]) -> bytes:
    """Columnar undo chunk: u32 count, three u16 length arrays, then the three byte runs.

    Columnar packing lets numpy and bytes.join do the work instead of one struct call per
    record; 0xFFFF as a length means absent (None).
    """
    key_lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    lengths = np.stack([key_lengths, _value_lengths(prevs), _value_lengths(news)]).astype("<u2")
    return b"".join(
        [
            _U32.pack(len(keys)),
            lengths.tobytes(),
            b"".join(keys),
            b"".join(filter(None, prevs)),  # absent values (and empty ones) add no bytes
            b"".join(filter(None, news)),
        ]
    )


def _unpack_undo_chunk(chunk: bytes) -> list[tuple[bytes, bytes | None, bytes | None]]:
    (count,) = _U32.unpack_from(chunk)
    lengths = np.frombuffer(chunk, dtype="<u2", count=3 * count, offset=_U32.size).astype(np.int64)
    present = lengths != _ABSENT
    sizes = np.where(present, lengths, 0)
    ends = _U32.size + 6 * count + np.cumsum(sizes)
    starts = ends - sizes
    bounds = list(zip(starts.tolist(), ends.tolist(), present.tolist()))
    keys = [chunk[start:end] for start, end, _ in bounds[:count]]  # keys are never absent
    values = [chunk[start:end] if here else None for start, end, here in bounds[count:]]
    return list(zip(keys, values[:count], values[count:]))


def _pack_token_record(token: bytes, first_seq: int, chunk_seqs: Sequence[int]) -> bytes:
    # The token text lives in the value so it survives key hashing of very long tokens.
    return b"".join(
        [_U16.pack(len(token)), token, _U64.pack(first_seq), *(_U64.pack(s) for s in chunk_seqs)]
    )


def _unpack_token_record(raw: bytes) -> tuple[str, int, list[int]]:
    (tlen,) = _U16.unpack_from(raw)
    token = raw[2 : 2 + tlen].decode()
    pos = 2 + tlen
    count = (len(raw) - pos) // _U64.size
    numbers = list(struct.unpack_from(f"<{count}Q", raw, pos))
    return token, numbers[0], numbers[1:]


def _chunk_key(seq: int) -> bytes:
    return b"c" + _U64BE.pack(seq)


class UndoLog:
    """The undo records of one environment. Every operation runs inside the caller's
    transaction, so an undo record commits (or aborts) with the change it records."""

    def __init__(self, keys: Any, undo: Any, meta: Any, max_key: int):
        self._keys, self._undo, self._meta = keys, undo, meta
        self._max_key = max_key

    def _token_key(self, token: bytes) -> bytes:
        return fit_key(b"t" + token, self._max_key)

    def record(self, txn: Txn, token: bytes, keys: list[bytes], prevs: list[bytes | None], news: list[bytes | None]) -> None:
        """Record under `token` that `keys` went from `prevs` to `news`."""
        step = _UNDO_CHUNK_RECORDS
        chunks = [
            _pack_undo_chunk(keys[i : i + step], prevs[i : i + step], news[i : i + step])
            for i in range(0, len(keys), step)
        ]
        raw_seq = txn.get(_META_NEXT_UNDO_SEQ, db=self._meta)
        seq = _U64.unpack(raw_seq)[0] if raw_seq else 0
        # Each write consumes at least one sequence number so tokens order by first write.
        apply_seq = seq
        chunk_seqs = list(range(seq, seq + len(chunks)))
        for chunk_seq, chunk in zip(chunk_seqs, chunks):
            txn.put(_chunk_key(chunk_seq), chunk, db=self._undo)
        txn.put(_META_NEXT_UNDO_SEQ, _U64.pack(seq + max(1, len(chunks))), db=self._meta)

        token_key = self._token_key(token)
        existing = txn.get(token_key, db=self._undo)
        if existing is None:
            record = _pack_token_record(token, apply_seq, chunk_seqs)
        else:
            # Appending keeps the earlier chunks, hence the pre-token values, for rollback.
            record = existing + b"".join(_U64.pack(s) for s in chunk_seqs)
        txn.put(token_key, record, db=self._undo)

    def pending(self, txn: Txn) -> list[str]:
        """Tokens recorded and neither committed nor rolled back, oldest first."""
        cursor = txn.cursor(db=self._undo)
        found = []
        if cursor.set_range(b"t"):
            for key, value in cursor:
                if not key.startswith(b"t"):
                    break
                token, first_seq, _ = _unpack_token_record(value)
                found.append((first_seq, token))
        return [token for _, token in sorted(found)]

    def commit(self, txn: Txn, tokens: list[str]) -> None:
        """Drop the undo of `tokens`: their changes stay."""
        for chunk_seq in self._take_token_chunks(txn, tokens):
            txn.delete(_chunk_key(chunk_seq), db=self._undo)

    def roll_back(self, txn: Txn, tokens: list[str]) -> None:
        """Restore what `tokens` overwrote (newest change first) and drop their undo."""
        superseded: Superseded = {}
        for chunk_seq in sorted(self._take_token_chunks(txn, tokens), reverse=True):
            chunk_key = _chunk_key(chunk_seq)
            chunk = txn.get(chunk_key, db=self._undo)
            if chunk is not None:
                self._replay(txn, _unpack_undo_chunk(chunk), superseded)
                txn.delete(chunk_key, db=self._undo)
        if superseded:
            self._splice(txn, superseded)

    def _splice(self, txn: Txn, superseded: Superseded) -> None:
        """Take rolled-back writes out of the undo chains of surviving tokens.

        When a surviving token overwrote a key after a rolled-back one, its undo record says
        "restore the rolled-back value". That value never existed as far as the table is
        concerned, so the record must restore what the rolled-back write had replaced.
        """
        cursor = txn.cursor(db=self._undo)
        if not cursor.set_range(b"c"):
            return
        rewrites = []
        for chunk_key, chunk in cursor:
            if not chunk_key.startswith(b"c"):
                break
            records = _unpack_undo_chunk(chunk)
            changed = False
            for i, (key, prev, new) in enumerate(records):
                chain = superseded.get(key)
                if chain is None or prev not in chain:
                    continue
                # Follow what each rolled-back write had replaced; values can repeat (a key
                # written back to an earlier value), so stop at the first one seen twice.
                seen: set[bytes | None] = set()
                while prev in chain and prev not in seen:
                    seen.add(prev)
                    prev = chain[prev]
                records[i] = (key, prev, new)
                changed = True
            if changed:
                keys, prevs, news = (list(column) for column in zip(*records))
                rewrites.append((chunk_key, _pack_undo_chunk(keys, prevs, news)))
        for chunk_key, chunk in rewrites:
            txn.put(chunk_key, chunk, db=self._undo)

    def _take_token_chunks(self, txn: Txn, tokens: list[str]) -> list[int]:
        """Delete the token records of `tokens` and return their chunk sequence numbers."""
        seqs: list[int] = []
        for token in tokens:
            token_key = self._token_key(token.encode())
            raw = txn.get(token_key, db=self._undo)
            if raw is None:
                continue  # unknown or already resolved: both operations are idempotent
            seqs.extend(_unpack_token_record(raw)[2])
            txn.delete(token_key, db=self._undo)
        return seqs

    def _replay(self, txn: Txn, records: list[tuple[bytes, bytes | None, bytes | None]], superseded: Superseded) -> None:
        # Records of one chunk have distinct keys (one write), so their order is free.
        get, put, delete, db = txn.get, txn.put, txn.delete, self._keys
        for key, prev, new in records:
            if get(key, None, db) != new:
                # A later write that is not being rolled back owns the key now; remember
                # that `new` stood for `prev`, so that write's undo can skip over it.
                superseded.setdefault(key, {})[new] = prev
                continue
            if prev is None:
                delete(key, db=db)
            else:
                put(key, prev, db=db)
