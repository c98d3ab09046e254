"""Keyed writes on the executor: upsert, cdc and dedupe through the host's key index.

Per chunk of input (`write.task` regroups Spark's Arrow batches into chunks of CHUNK_ROWS
rows): resolve one change per key (`changes.py`), then, holding the host lock, look the
keys up in the LMDB index, decide each change against what the index says, hand
the surviving rows to the rolling writer (which names each row's final file and position)
and record the new locations under this task's undo token. Replaced and deleted rows
become positions in `hidden`, per data file; the commit turns them into deletion vectors.

Decision per key (the model: live rows are a map key -> latest row):
- older sequence than the indexed one: ignored (a late change never overwrites newer data);
- dedupe: inserted only when no live row has the key (a task's first row for a key);
- write (upsert, cdc c/r/u): the live row, if any, is hidden; the row is written;
- delete (cdc): the live row, if any, is hidden; with a sequence column a tombstone keeps
  the delete's sequence so an older late change cannot resurrect the key.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable

import lmdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyroaring import BitMap64

from lakesink_datasource.catalog import loader
from lakesink_datasource.index.file_refs import FileRef, decode_ref, encode_ref
from lakesink_datasource.index.host_lock import host_lock
from lakesink_datasource.index.key_encoding import key_hashes
from lakesink_datasource.index.key_index import (
    KeyIndex,
    Location,
    damage,
    open_index,
    pack_location,
    pack_locations,
    remove_environment,
    reopen_empty,
)
from lakesink_datasource.index.sync import (
    SEQUENCE,
    TOMBSTONE,
    KeyColumns,
    default_index_dir,
    index_owner,
    sync,
    token_for,
)
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.messages import PositionDeletesMessage
from lakesink_datasource.schema.arrow_align import BatchAligner
from lakesink_datasource.table.plan import WritePlan, write_spec
from lakesink_datasource.table.tombstone_table import read_stored
from lakesink_datasource.write.changes import resolve_changes

log = logging.getLogger("lakesink")


def index_location(plan: WritePlan, metadata: TableMetadata) -> str:
    return os.path.join(plan.options.index_dir or default_index_dir(), str(metadata.table_uuid))


class KeyedWriter:
    def __init__(
        self,
        plan: WritePlan,
        metadata: TableMetadata,
        io: FileIO,
        writer: PartitionedParquetWriter,
        splitter: PartitionSplitter,
        aligner: BatchAligner,
        *,
        partition_id: int,
        attempt: int,
    ):
        assert plan.keyed is not None
        self._plan = plan
        self._keyed = plan.keyed
        self._writer = writer
        self._splitter = splitter
        self._aligner = aligner
        self._spec_id = write_spec(plan, metadata).spec_id
        path = index_location(plan, metadata)
        self.host = index_owner(path)
        if damage(path) == "not a directory":
            remove_environment(path)
        os.makedirs(path, exist_ok=True)
        self._lock_path = os.path.join(path, "writers.lock")
        self._token = token_for(plan.write_id, self.host, partition_id, attempt)
        columns = KeyColumns(self._keyed.table_key_columns, self._keyed.table_sequence_column)

        def stored() -> pa.Table | None:
            try:
                return read_stored(loader.load(plan.catalog), plan.identifier)
            except Exception:  # the catalog may be out of an executor's reach
                # Fall back to the tombstone files the retained snapshots name, and say so:
                # deletes whose snapshots expired are then not known to this rebuild.
                log.warning("lakesink: cannot read %s from this host; rebuilding the key index without it",
                            f"{plan.identifier}__lakesink_tombstones", exc_info=True)
                return None

        started = time.perf_counter()
        self.healed = False  # the index was damaged and rebuilt from the table by this task
        with host_lock(self._lock_path):
            try:
                self._index: KeyIndex = open_index(path)
                sync(
                    self._index, io, metadata, columns, write_id=plan.write_id, host=self.host, partition_id=partition_id,
                    attempt=attempt, stored=stored,
                )
            except lmdb.Error as exc:
                # The index is a cache: a damaged one is dropped and rebuilt from the table.
                log.warning("lakesink: key index %s is damaged (%s); rebuilding it from the table", path, exc)
                self.healed = True
                self._index = reopen_empty(path)
                sync(
                    self._index, io, metadata, columns, write_id=plan.write_id, host=self.host, partition_id=partition_id,
                    attempt=attempt, stored=stored,
                )
        self.index_seconds = time.perf_counter() - started
        self._ordinals: dict[str, int] = {}  # encoded FileRef -> ordinal (this task's new files)
        self._hidden: dict[int, list[np.ndarray]] = defaultdict(list)  # ordinal -> positions
        self._hashes: list[np.ndarray] = []
        self._tombstones: list[pa.Table] = []
        self.rows_deleted = 0
        self.rows_ignored = 0

    def _resolution_table(self, batch: pa.RecordBatch, aligned: pa.Table) -> pa.Table:
        """Key and sequence columns in the *table's* types (the index must encode a key the
        same way whether it comes from a batch or from a data file), plus the op column."""
        keyed = self._keyed
        columns = {name: aligned.column(name) for name in keyed.table_key_columns}
        # The op and sequence columns keep the user's names: errors name them.
        if keyed.sequence_source is not None:
            columns[keyed.sequence_source] = (
                aligned.column(keyed.table_sequence_column) if keyed.table_sequence_column else batch.column(keyed.sequence_source)
            )
        if keyed.op_source is not None:
            columns[keyed.op_source] = batch.column(keyed.op_source)
        return pa.table(columns)

    def write(self, batch: pa.RecordBatch) -> None:
        """Apply one chunk: one lock round and one index transaction for all of its keys."""
        if batch.num_rows == 0:
            return
        keyed = self._keyed
        aligned = self._aligner.align(batch)
        resolution = self._resolution_table(batch, aligned)
        changes = resolve_changes(
            resolution, keyed.table_key_columns,
            op_column=keyed.op_source, delete_ops=self._plan.options.delete_ops, sequence_column=keyed.sequence_source,
            keep="first" if self._plan.options.operation == "dedupe" else "last",
        )
        if not changes.keys:
            return
        self._hashes.append(key_hashes(changes.keys))
        rows = aligned.take(pa.array(changes.rows))
        started = time.perf_counter()

        def decide(existing: list[Location | None], ordinal_of: Callable[[str], int]) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
            write_mask, puts, deletes, tombstones = self._decide(changes.keys, changes.is_delete, changes.sequences, existing)
            if tombstones:
                picked = resolution.take(pa.array(changes.rows[tombstones]))
                names = list(keyed.table_key_columns)
                self._tombstones.append(picked.select([*names, keyed.sequence_source]).rename_columns([*names, SEQUENCE]))
            if write_mask.any():
                chosen = np.flatnonzero(write_mask)
                sequences = [changes.sequences[i] for i in chosen] if changes.sequences else None
                puts += self._place(rows.take(pa.array(chosen)), [changes.keys[i] for i in chosen], sequences, ordinal_of)
            return puts, deletes

        with host_lock(self._lock_path):
            self._index.transact(self._token, changes.keys, decide)
        self.index_seconds += time.perf_counter() - started
        self._writer.flush_pending()  # Parquet encoding outside the lock

    def _decide(
        self, keys: list[bytes], is_delete: np.ndarray, sequences: list[bytes] | None, existing: list[Location | None]
    ) -> tuple[np.ndarray, list[tuple[bytes, bytes]], list[bytes], list[int]]:
        dedupe = self._plan.options.operation == "dedupe"
        write_mask = np.zeros(len(keys), dtype=bool)
        puts: list[tuple[bytes, bytes]] = []
        deletes: list[bytes] = []
        tombstones: list[int] = []  # winners whose delete must be remembered with its sequence
        hide_ordinals: list[int] = []
        hide_positions: list[int] = []
        for i, (key, loc) in enumerate(zip(keys, existing)):
            seq = sequences[i] if sequences is not None else None
            if loc is not None and seq is not None and loc.sequence is not None and loc.sequence > seq:
                self.rows_ignored += 1  # a late, older change
                continue
            live = loc if loc is not None and loc.file_ordinal != TOMBSTONE else None
            if dedupe:
                if live is not None:
                    self.rows_ignored += 1
                else:
                    write_mask[i] = True
                continue
            if live is not None:
                hide_ordinals.append(live.file_ordinal)
                hide_positions.append(live.position)
            if is_delete[i]:
                self.rows_deleted += int(live is not None)
                if seq is not None:
                    puts.append((key, pack_location(Location(TOMBSTONE, 0, seq))))
                    tombstones.append(i)
                elif live is not None:
                    deletes.append(key)
            else:
                write_mask[i] = True
        if hide_ordinals:
            ordinals, positions = np.asarray(hide_ordinals, dtype=np.int64), np.asarray(hide_positions, dtype=np.int64)
            for ordinal in np.unique(ordinals):
                self._hidden[int(ordinal)].append(positions[ordinals == ordinal])
        return write_mask, puts, deletes, tombstones

    def _place(
        self, rows: pa.Table, keys: list[bytes], sequences: list[bytes] | None, ordinal_of: Callable[[str], int]
    ) -> list[tuple[bytes, bytes]]:
        """Write rows and return the index entries (packed) pointing at their files and positions."""
        puts: list[tuple[bytes, bytes]] = []
        for partition, indices in self._splitter.split_rows(rows):
            part_rows = rows.take(pa.array(indices)) if len(indices) != rows.num_rows else rows
            for placement in self._writer.write(partition, part_rows, flush=False):
                ordinal = self._ordinal(FileRef(placement.path, self._spec_id, partition), ordinal_of)
                placed = indices[placement.offset : placement.offset + placement.rows].tolist()
                packed = pack_locations(
                    ordinal, placement.position, placement.rows, [sequences[r] for r in placed] if sequences else None
                )
                puts.extend(zip([keys[r] for r in placed], packed))
        return puts

    def _ordinal(self, ref: FileRef, ordinal_of: Callable[[str], int]) -> int:
        encoded = encode_ref(ref)
        ordinal = self._ordinals.get(encoded)
        if ordinal is None:
            ordinal = self._ordinals[encoded] = ordinal_of(encoded)
        return ordinal

    def rollback(self) -> None:
        """Undo this attempt's index changes at once when it fails, so the batch's other
        tasks stop seeing rows that will never commit."""
        with host_lock(self._lock_path):
            self._index.rollback_tokens([self._token])

    def position_deletes(self) -> list[PositionDeletesMessage]:
        out = []
        for ordinal, chunks in self._hidden.items():
            ref = decode_ref(self._index.file_path(ordinal))
            bitmap = BitMap64(np.concatenate(chunks).astype(np.uint64))
            out.append(PositionDeletesMessage(ref.path, ref.spec_id, ref.partition, bitmap.serialize()))
        return out

    def write_tombstones(self, io: FileIO, location: str) -> str | None:
        """Persist this task's deletes with their sequence (key columns + sequence), so an
        index rebuilt from the table still refuses older late changes of deleted keys."""
        if not self._tombstones:
            return None
        table = pa.concat_tables(self._tombstones)
        with io.new_output(location).create(overwrite=True) as out:
            pq.write_table(table, out, compression="zstd")
        return location

    def key_hashes(self) -> bytes:
        if not self._hashes:
            return b""
        return np.unique(np.concatenate(self._hashes)).astype("<u8").tobytes()
