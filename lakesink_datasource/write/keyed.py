"""Keyed writes on the executor: upsert, cdc and dedupe through the host's key index.

Per chunk of input (`write.task` regroups Spark's Arrow batches into chunks of CHUNK_ROWS
rows): resolve one change per key (`changes.py`), then, shard by shard of the key index,
each under that shard's host lock, look the keys up, decide each change against what the
index says, hand the surviving rows to the rolling writer (which names each row's final
file and position) and record the new locations under this task's undo token. Replaced and deleted rows
become positions in `hidden`, per data file; the commit turns them into deletion vectors.

Decision per key (the model: live rows are a map key -> latest row):
- older sequence than the indexed one: ignored (a late change never overwrites newer data);
- dedupe: inserted only when no live row has the key (a task's first row for a key);
- write (upsert, cdc c/r/u): the live row, if any, is hidden; the row is written;
- delete (cdc): the live row, if any, is hidden; with a sequence column a tombstone keeps
  the delete's sequence so an older late change cannot resurrect the key.
"""

from __future__ import annotations

import operator
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyroaring import BitMap64

from lakesink_datasource.arrays import take_items, unique_sorted
from lakesink_datasource.catalog import loader
from lakesink_datasource.iceberg.properties import TRUNCATED_BEFORE
from lakesink_datasource.index.file_refs import FileRef, decode_ref, encode_ref
from lakesink_datasource.index.for_write import TaskIndex, index_location, open_for_task
from lakesink_datasource.index.key_columns import TOMBSTONE, KeyColumns, sequence_names
from lakesink_datasource.index.key_encoding import key_hashes
from lakesink_datasource.index.key_route import NO_ROUTE, ROUTE_COLUMN, KeyRoute, decode_route, key_fingerprint, misrouted_message
from lakesink_datasource.index.location_codec import Found, pack_locations, pack_positions
from lakesink_datasource.index.reindex import TombstonesUnreadable
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.messages import PositionDeletesMessage
from lakesink_datasource.schema.arrow_align import BatchAligner
from lakesink_datasource.table.plan import WritePlan, write_spec
from lakesink_datasource.table.tombstone_table import companion_identifier, read_stored
from lakesink_datasource.write.changes import Changes, KeyedInputError, resolve_changes


def tombstone_reader(plan: WritePlan) -> Callable[[], pa.Table | None]:
    """Reads the companion table's tombstones, for an index that must be rebuilt."""

    def stored() -> pa.Table | None:
        try:
            return read_stored(loader.load(plan.catalog), plan.identifier)
        except Exception as exc:  # a damaged companion, or a catalog out of an executor's reach
            # The rebuild then knows only the tombstone files the retained snapshots name:
            # it refuses the changes that deletes it cannot see could have overruled.
            raise TombstonesUnreadable(f"{companion_identifier(plan.identifier)}: {type(exc).__name__}: {exc}") from exc

    return stored


def open_task_index(
    plan: WritePlan, metadata: TableMetadata, io: FileIO, *, partition_id: int, attempt: int, route: KeyRoute | None = None,
    query_id: str | None = None,
) -> TaskIndex:
    """The host's key index at the table's current snapshot, for this task attempt: of the
    whole key space, or of the one key shard `route` (rows routed by `cluster_by_key`); a
    streaming query's own (`query_id`, see `index_location`)."""
    assert plan.keyed is not None
    return open_for_task(
        index_location(plan.options.index_dir, metadata, route, writer=query_id), io, metadata,
        KeyColumns(plan.keyed.table_key_columns, plan.keyed.table_sequence_columns, route),
        write_id=plan.write_id, partition_id=partition_id, attempt=attempt, stored=tombstone_reader(plan),
    )


def chunk_route(batch: pa.RecordBatch, key_columns: tuple[str, ...], held: KeyRoute | None) -> KeyRoute:
    """The one key shard a routed chunk's rows belong to; refused when the rows span several
    (fewer Spark partitions than key shards) or were routed by other columns than the key."""
    values = pc.unique(batch.column(ROUTE_COLUMN)).to_pylist()
    if NO_ROUTE in values:  # only a text route has rows without a key (cluster_by_key's coalesce)
        raise KeyedInputError(
            f"rows routed by cluster_by_key to many tables carry no key (table key columns {', '.join(key_columns)}): "
            "give every row its key in option 'key_column', or the table's key in 'primary_key' "
            "(or 'tables.<namespace>.<table>.primary_key'). Nothing was written"
        )
    routes = sorted({decode_route(v)[0] for v in values if v is not None}, key=lambda r: r.shard)
    if held is not None and held not in routes:
        routes.insert(0, held)
    if len(routes) != 1 or None in values:
        shards = ", ".join(str(r.shard) for r in routes)
        count = routes[0].shards if routes else "?"
        raise KeyedInputError(
            f"this task got rows of key shards {shards} of {count}: a task must hold one key shard. The query has fewer "
            "shuffle partitions than cluster_by_key's shards (a restarted query keeps the spark.sql.shuffle.partitions of "
            "its checkpoint): call cluster_by_key with shards=<that number of partitions>. Nothing was written"
        )
    fingerprints = {decode_route(v)[1] for v in values if v is not None}
    if not routes[0].by_text and fingerprints != {key_fingerprint(key_columns)}:
        raise KeyedInputError(
            f"the rows were routed by cluster_by_key on other columns than the write's primary key "
            f"({', '.join(key_columns)}): give cluster_by_key exactly the primary key columns. Nothing was written"
        )
    return routes[0]


class KeyedWriter:
    def __init__(
        self,
        plan: WritePlan,
        metadata: TableMetadata,
        task_index: TaskIndex,
        writer: PartitionedParquetWriter,
        splitter: PartitionSplitter,
        aligner: BatchAligner,
        route: KeyRoute | None = None,
    ):
        assert plan.keyed is not None
        self._route = route if route is not None and route.by_text else None  # whose keys are checked row by row
        self._plan = plan
        self._keyed = plan.keyed
        self._writer = writer
        self._splitter = splitter
        self._aligner = aligner
        self._spec_id = write_spec(plan, metadata).spec_id
        self._index = task_index.index
        self._token = task_index.token
        self.host = task_index.host
        state = self._index.get_state()
        self._floor = state.tombstone_floor if state is not None else None
        # A source table's truncate (cdc_format=debezium): changes ordered before the newest
        # one are ignored, whenever they arrive (a lagging Kafka partition's, a replay's).
        truncates = [bytes.fromhex(metadata.properties[TRUNCATED_BEFORE])] if TRUNCATED_BEFORE in metadata.properties else []
        self._truncated_before = max([*truncates, *([plan.truncated_at] if plan.truncated_at is not None else [])], default=None)
        self.tombstone_max: bytes | None = None  # the highest sequence this task's deletes carry (encoded)
        self._ordinals: dict[str, int] = {}  # encoded FileRef -> ordinal (this task's new files)
        self._hidden: dict[int, list[np.ndarray]] = defaultdict(list)  # ordinal -> positions
        self._hashes: list[np.ndarray] = []
        self._tombstones: list[pa.Table] = []
        self._deleted: list[pa.Table] = []  # keys deleted without a sequence (reported to other hosts)
        self.rows_deleted = 0
        self.rows_ignored = 0
        self.lookup_seconds = 0.0  # resolving keys in the index, within write()

    def _resolution_table(self, batch: pa.RecordBatch, aligned: pa.Table) -> pa.Table:
        """Key and sequence columns in the *table's* types (the index must encode a key the
        same way whether it comes from a batch or from a data file), plus the op column."""
        keyed = self._keyed
        columns = {name: aligned.column(name) for name in keyed.table_key_columns}
        # The op and sequence columns keep the user's names: errors name them.
        stored = dict(zip(keyed.sequence_sources, keyed.table_sequence_columns))
        for source in keyed.sequence_sources:
            columns[source] = aligned.column(stored[source]) if source in stored else batch.column(source)
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
        if self._route is not None:
            self._check_text_route(self._route, resolution)
        changes = resolve_changes(
            resolution, keyed.table_key_columns,
            op_column=keyed.op_source, delete_ops=self._plan.options.delete_ops, sequence_columns=keyed.sequence_sources,
            keep="first" if self._plan.options.operation == "dedupe" else "last",
        )
        if not changes.keys:
            return
        self._hashes.append(key_hashes(changes.keys))
        # A sorted table's rows are placed before the index is asked (see _place_ahead).
        ahead = self._place_ahead(aligned, changes) if self._writer.sorts_on_arrival else None
        started = time.perf_counter()

        def decide(which: np.ndarray, found: Found, ordinal_of: Callable[[str], int]) -> tuple[np.ndarray, list[bytes | None]]:
            # One shard's keys: `which` indexes `changes`; the result indexes `which`.
            part = changes.take(which)
            write_mask, tombstones, deletes = self._decide(part, found)
            changed: list[np.ndarray] = [deletes]
            values: list[bytes | None] = [None] * len(deletes)
            if len(deletes):
                picked = resolution.take(pa.array(part.rows[deletes]))
                self._deleted.append(picked.select(list(keyed.table_key_columns)))
            if len(tombstones):
                assert part.sequences is not None  # tombstones only exist with a sequence column
                picked = resolution.take(pa.array(part.rows[tombstones]))
                names = list(keyed.table_key_columns)
                self._tombstones.append(
                    picked.select([*names, *keyed.sequence_sources]).rename_columns([*names, *sequence_names(len(keyed.sequence_sources))])
                )
                changed.append(tombstones)
                sequences = take_items(part.sequences, tombstones)
                values += pack_positions(TOMBSTONE, np.zeros(len(tombstones), dtype=np.uint64), sequences)
                self.tombstone_max = max([*sequences, *([self.tombstone_max] if self.tombstone_max is not None else [])])
            chosen = np.flatnonzero(write_mask)
            if ahead is not None:
                placed, packed = ahead.locate(which, write_mask, part.sequences, ordinal_of, self._ordinal, self._hide)
                changed.append(placed)
                values += packed
            elif len(chosen):
                placed, packed = self._place(aligned.take(pa.array(part.rows[chosen])), chosen, part.sequences, ordinal_of)
                changed.append(placed)
                values += packed
            return np.concatenate(changed), values

        self._index.transact(self._token, changes.keys, decide)
        self.lookup_seconds += time.perf_counter() - started
        self._writer.flush_pending()  # Parquet encoding outside the lock

    def _check_text_route(self, route: KeyRoute, resolution: pa.Table) -> None:
        """Refuse rows whose key, in the table's types, belongs to another shard than the one
        Spark routed them to by its text: the shard's index would never see that key again
        (a later change of it, spelled as the table spells it, goes elsewhere)."""
        names = route.key_order(self._keyed.table_key_columns)
        keep = route.keeps([resolution.column(n) for n in names])
        if keep.all():
            return
        row = int(np.flatnonzero(~keep)[0])
        example = {n: resolution.column(n)[row].as_py() for n in names}
        types = ", ".join(f"{n} {resolution.schema.field(n).type}" for n in names)
        raise KeyedInputError(misrouted_message(self._plan.options.table, int((~keep).sum()), example, types))

    def _decide(self, changes: Changes, found: Found) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decide every change against the index at once: returns the write mask, the
        changes whose delete leaves a tombstone and the changes whose key leaves the index
        (both as indices), and records the live rows to hide."""
        n = len(changes.keys)
        none = np.zeros(0, dtype=np.int64)
        older = np.zeros(n, dtype=bool)  # a late change, older than what the index holds
        if changes.sequences is not None and found.sequence is not None:
            # Object arrays compare the encoded bytes element by element in C.
            indexed = np.array(found.sequence, dtype=object)
            has = np.fromiter(map(operator.is_not, found.sequence, repeat(None)), dtype=bool, count=n)
            older = has & (np.where(has, indexed, b"") > np.array(changes.sequences, dtype=object)).astype(bool)
        if self._truncated_before is not None and changes.sequences is not None:
            older |= np.array(changes.sequences, dtype=object) < self._truncated_before
        if self._floor is not None and changes.sequences is not None:
            self._refuse_undecidable(changes, found)
        live = found.present & (found.ordinal != TOMBSTONE) & ~older
        self.rows_ignored += int(older.sum())
        if self._plan.options.operation == "dedupe":
            # Only a key no live row has is inserted.
            self.rows_ignored += int(live.sum())
            return ~older & ~live, none, none
        self._hide(found.ordinal[live], found.position[live])
        deleting = changes.is_delete & ~older
        self.rows_deleted += int((deleting & live).sum())
        if changes.sequences is not None:
            # The delete's sequence stays in the index so an older late change cannot
            # bring the key back.
            return ~older & ~changes.is_delete, np.flatnonzero(deleting), none
        # Every delete is reported, of a live key or not: a key another writer adds meanwhile
        # is then decided at commit as this batch's delete (commit/key_conflicts.py).
        return ~older & ~changes.is_delete, none, np.flatnonzero(deleting)

    def _refuse_undecidable(self, changes: Changes, found: Found) -> None:
        """With the stored tombstones unreadable, a change to a key the index does not hold,
        at or below the highest delete's sequence, may be older than a delete the index
        cannot see: applying it could bring a deleted key back."""
        assert changes.sequences is not None and self._floor is not None
        floor = self._floor
        undecidable = [s for s, here in zip(changes.sequences, found.present.tolist()) if not here and s <= floor]
        if undecidable:
            raise KeyedInputError(
                f"{len(undecidable)} change(s) of this batch are for keys the key index does not hold, with a sequence at or "
                f"below the highest sequence a delete of {self._plan.identifier} ever had; the index was rebuilt without its "
                f"stored tombstones ({companion_identifier(self._plan.identifier)} cannot be read), so whether a later delete "
                "of those keys is hidden there is unknown, and lakesink does not risk bringing deleted keys back. Repair the "
                f"tombstone table: python -m lakesink_datasource.maintain repair-tombstones {self._plan.identifier} ... "
                "(nothing of this batch was committed)"
            )

    def _hide(self, ordinals: np.ndarray, positions: np.ndarray) -> None:
        if not len(ordinals):
            return
        order = np.argsort(ordinals, kind="stable")
        ordinals, positions = ordinals[order], positions[order]
        unique, starts = np.unique(ordinals, return_index=True)
        for ordinal, chunk in zip(unique.tolist(), np.split(positions, starts[1:])):
            self._hidden[ordinal].append(chunk)

    def _place(
        self, rows: pa.Table, changes: np.ndarray, sequences: list[bytes] | None, ordinal_of: Callable[[str], int]
    ) -> tuple[np.ndarray, list[bytes | None]]:
        """Write rows (those of `changes`) and return which changes they are and the index
        entries (packed) pointing at their files and positions."""
        placed: list[np.ndarray] = []
        packed: list[bytes | None] = []
        for partition, indices in self._splitter.split_rows(rows):
            part_rows = rows.take(pa.array(indices)) if len(indices) != rows.num_rows else rows
            for placement in self._writer.write(partition, part_rows, flush=False):
                ordinal = self._ordinal(FileRef(placement.path, self._spec_id, partition), ordinal_of)
                which = changes[indices[placement.offset : placement.offset + placement.rows]]
                placed.append(which)
                packed += pack_locations(ordinal, placement.position, placement.rows, take_items(sequences, which) if sequences else None)
        return (np.concatenate(placed) if placed else np.zeros(0, dtype=np.int64)), packed

    def _place_ahead(self, aligned: pa.Table, changes: Changes) -> _PlacedAhead:
        """Hand every row the chunk may write to the writer at once, each partition's rows as
        one sorted run, before the index decides which of them are written.

        Sorting needs a partition's rows together, while the index decides them shard by
        shard: placed per shard, each shard's rows would be a run of their own (eight files
        per partition and chunk). A row the index then turns down (a late change, a key
        dedupe already has) is in the file anyway and hidden there by the batch's deletion
        vector, as a row replaced within the batch is; the next compaction drops it."""
        candidates = np.flatnonzero(~changes.is_delete)
        ahead = _PlacedAhead(len(changes.keys))
        if not len(candidates):
            return ahead
        rows = aligned.take(pa.array(changes.rows[candidates]))
        for partition, indices in self._splitter.split_rows(rows):
            part_rows = rows.take(pa.array(indices)) if len(indices) != rows.num_rows else rows
            order, placements = self._writer.write_sorted(partition, part_rows, flush=False)
            in_run = np.asarray(indices, dtype=np.int64)[order]
            for placement in placements:
                which = candidates[in_run[placement.offset : placement.offset + placement.rows]]
                ahead.put(which, FileRef(placement.path, self._spec_id, partition), placement.position)
        return ahead

    def _ordinal(self, ref: FileRef, ordinal_of: Callable[[str], int]) -> int:
        encoded = encode_ref(ref)
        ordinal = self._ordinals.get(encoded)
        if ordinal is None:
            ordinal = self._ordinals[encoded] = ordinal_of(encoded)
        return ordinal

    def rollback(self) -> None:
        """Undo this attempt's index changes at once when it fails, so the batch's other
        tasks stop seeing rows that will never commit."""
        with self._index.all_locked():
            self._index.rollback_tokens([self._token])

    def position_deletes(self) -> list[PositionDeletesMessage]:
        out = []
        for ordinal, chunks in self._hidden.items():
            ref = decode_ref(self._index.file_path(ordinal))
            bitmap = BitMap64(np.concatenate(chunks).astype(np.uint64))
            out.append(PositionDeletesMessage(ref.path, ref.spec_id, ref.partition, bitmap.serialize()))
        return out

    def write_deleted_keys(self, io: FileIO, location: str) -> str | None:
        """Persist the keys this task deleted without a sequence, so other hosts' indexes
        follow the batch (sequenced deletes are in the tombstone file)."""
        if not self._deleted:
            return None
        with io.new_output(location).create(overwrite=True) as out:
            pq.write_table(pa.concat_tables(self._deleted), out, compression="zstd")
        return location

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
        return unique_sorted(np.concatenate(self._hashes)).astype("<u8").tobytes()


class _PlacedAhead:
    """Where each change of a chunk was placed before the index decided it (sorted tables):
    a file (by its place in `refs`) and a position, -1 for a change not placed (a delete)."""

    def __init__(self, changes: int) -> None:
        self.refs: list[FileRef] = []
        self.file = np.full(changes, -1, dtype=np.int64)
        self.position = np.zeros(changes, dtype=np.int64)

    def put(self, which: np.ndarray, ref: FileRef, first_position: int) -> None:
        if not self.refs or self.refs[-1] != ref:
            self.refs.append(ref)
        self.file[which] = len(self.refs) - 1
        self.position[which] = np.arange(first_position, first_position + len(which), dtype=np.int64)

    def locate(
        self,
        which: np.ndarray,
        written: np.ndarray,
        sequences: list[bytes] | None,
        ordinal_of: Callable[[str], int],
        ordinal: Callable[[FileRef, Callable[[str], int]], int],
        hide: Callable[[np.ndarray, np.ndarray], None],
    ) -> tuple[np.ndarray, list[bytes | None]]:
        """One shard's changes (`which` indexes the chunk's): the index entries of those the
        index let through (`written`, indexing `which`) and which they are; the rest of the
        placed rows are hidden."""
        files = self.file[which]
        positions = self.position[which]
        turned_down = np.flatnonzero((files >= 0) & ~written)
        for f in np.unique(files[turned_down]).tolist():
            at = turned_down[files[turned_down] == f]
            hide(np.full(len(at), ordinal(self.refs[f], ordinal_of), dtype=np.int64), positions[at])
        placed: list[np.ndarray] = []
        packed: list[bytes | None] = []
        kept = np.flatnonzero(written)
        if (files[kept] < 0).any():
            raise RuntimeError("a change the index let through was not placed ahead")  # a bug: its row would be lost
        for f in np.unique(files[kept]).tolist():
            at = kept[files[kept] == f]
            placed.append(at)
            packed += pack_positions(
                ordinal(self.refs[f], ordinal_of), positions[at].astype(np.uint64), take_items(sequences, at) if sequences else None
            )
        return (np.concatenate(placed) if placed else np.zeros(0, dtype=np.int64)), packed
