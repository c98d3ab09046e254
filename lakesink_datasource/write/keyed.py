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

import gc
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
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.properties import TRUNCATED_BEFORE
from lakesink_datasource.iceberg.retry import active
from lakesink_datasource.index.file_refs import FileRef, decode_ref, encode_ref
from lakesink_datasource.index.for_write import TaskIndex, index_location, open_for_task
from lakesink_datasource.index.key_columns import TOMBSTONE, KeyColumns, sequence_names
from lakesink_datasource.index.key_encoding import NullKeyError, encode_keys, key_hashes
from lakesink_datasource.index.key_shards import (
    NO_SHARD,
    SHARD_COLUMN,
    KeyShard,
    decode_shard,
    key_fingerprint,
    misclustered_message,
)
from lakesink_datasource.index.location_codec import Found, pack_locations, pack_positions
from lakesink_datasource.index.reindex import TombstonesUnreadable
from lakesink_datasource.io.partitioning import PartitionSplitter
from lakesink_datasource.io.rolling_writer import PartitionedParquetWriter
from lakesink_datasource.messages import PositionDeletesMessage
from lakesink_datasource.schema.arrow_align import BatchAligner
from lakesink_datasource.table.plan import WritePlan, retry_clock, write_spec
from lakesink_datasource.table.tombstone_table import companion_identifier, read_stored
from lakesink_datasource.write.changes import Changes, KeyedInputError, op_kinds, resolve_changes
from lakesink_datasource.write.current_rows import RowGroups, read_rows_at
from lakesink_datasource.write.history import Decision, Runs, Versions, decide, scan_versions, take_rows, with_bounds


def tombstone_reader(plan: WritePlan) -> Callable[[], pa.Table | None]:
    """Reads the companion table's tombstones, for an index that must be rebuilt."""

    def stored() -> pa.Table | None:
        what = f"reading the stored tombstones of {plan.identifier}"
        # The task's clock (a catalog that is away, or locked, is waited for within its
        # budgets as every other catalog call is), else one of the table's own.
        clock = active() or retry_clock(plan, what)
        catalog = loader.describe(plan.catalog)
        try:
            return catalog_call(
                clock, lambda: read_stored(catalog_call(clock, lambda: loader.load(plan.catalog), what="opening the catalog",
                                                        catalog=catalog), plan.identifier),
                what=what, catalog=catalog,
            )
        except Exception as exc:  # a damaged companion, or a catalog out of an executor's reach
            # The rebuild then knows only the tombstone files the retained snapshots name:
            # it refuses the changes that deletes it cannot see could have overruled.
            raise TombstonesUnreadable(f"{companion_identifier(plan.identifier)}: {type(exc).__name__}: {exc}") from exc

    return stored


def open_task_index(
    plan: WritePlan, metadata: TableMetadata, io: FileIO, *, partition_id: int, attempt: int, route: KeyShard | None = None,
    query_id: str | None = None,
) -> TaskIndex:
    """The host's key index at the table's current snapshot, for this task attempt: of the
    whole key space, or of the one key shard `route` (rows routed by `cluster_by_key`); a
    streaming query's own (`query_id`, see `index_location`)."""
    assert plan.keyed is not None
    return open_for_task(
        index_location(plan.options.index_dir, metadata, route, writer=query_id), io, metadata,
        KeyColumns(
            plan.keyed.table_key_columns, plan.keyed.table_sequence_columns, route,
            current=plan.keyed.history.end if plan.keyed.history is not None else None,
        ),
        write_id=plan.write_id, partition_id=partition_id, attempt=attempt, stored=tombstone_reader(plan),
    )


def chunk_route(batch: pa.RecordBatch, key_columns: tuple[str, ...], held: KeyShard | None) -> KeyShard:
    """The one key shard a routed chunk's rows belong to; refused when the rows span several
    (fewer Spark partitions than key shards) or were routed by other columns than the key."""
    values = pc.unique(batch.column(SHARD_COLUMN)).to_pylist()
    if NO_SHARD in values:  # only a text route has rows without a key (cluster_by_key's coalesce)
        raise KeyedInputError(
            f"rows routed by cluster_by_key to many tables carry no key (table key columns {', '.join(key_columns)}): "
            "give every row its key in option 'key_column', or the table's key in 'primary_key' "
            "(or 'tables.<namespace>.<table>.primary_key'). Nothing was written"
        )
    routes = sorted({decode_shard(v)[0] for v in values if v is not None}, key=lambda r: r.shard)
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
    fingerprints = {decode_shard(v)[1] for v in values if v is not None}
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
        route: KeyShard | None = None,
        io: FileIO | None = None,
    ):
        """`io`: the table's FileIO (a history table reads its versions' rows)."""
        assert plan.keyed is not None
        self._metadata = metadata
        self._io = io
        self._committed: set[str] | None = None  # the planned snapshot's data files (history tables)
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
        # one are ignored, whenever they arrive (a lagging Kafka partition's, a replay's). A
        # history table's task applies its own batch's truncate as deletes of its keys
        # (debezium/decode.py), so that the changes before it still become versions.
        truncates = [bytes.fromhex(metadata.properties[TRUNCATED_BEFORE])] if TRUNCATED_BEFORE in metadata.properties else []
        if plan.truncated_at is not None and (plan.keyed is None or plan.keyed.history is None):
            truncates.append(plan.truncated_at)
        self._truncated_before = max(truncates, default=None)
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
        if self._keyed.history is not None:
            self._write_history(batch)
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

    # -- history tables (write/history.py) ------------------------------------------------

    def _write_history(self, batch: pa.RecordBatch) -> None:
        """A history table's chunk (the task's whole input: a key's versions must not be in
        files the task is still writing): each key's changes applied to its versions."""
        keyed, history = self._keyed, self._keyed.history
        assert history is not None
        aligned = self._aligner.align(batch)
        resolution = self._resolution_table(batch, aligned)
        if self._route is not None:
            self._check_text_route(self._route, resolution)
        n = aligned.num_rows
        names = list(keyed.table_key_columns)
        try:
            keys = encode_keys([aligned.column(c) for c in names], names=names)
        except NullKeyError as exc:
            raise KeyedInputError(f"primary key column '{exc.column_name}' has {exc.null_count} null value(s)") from None
        sequences: list[bytes] | None = None
        if keyed.sequence_sources:
            try:
                sequences = encode_keys([resolution.column(c) for c in keyed.sequence_sources], names=list(keyed.sequence_sources))
            except NullKeyError as exc:
                raise KeyedInputError(f"sequence column '{exc.column_name}' has {exc.null_count} null value(s)") from None
        deleting = op_kinds(resolution.column(keyed.op_source), keyed.op_source, self._plan.options.delete_ops) if keyed.op_source else np.zeros(n, dtype=bool)
        bounds = self._history_bounds(aligned, resolution, n)
        keep = None
        if self._truncated_before is not None and sequences is not None:
            floor = self._truncated_before
            keep = np.fromiter((s >= floor for s in sequences), dtype=bool, count=n)
        runs = Runs(keys, sequences, deleting, keep)
        if not runs.keys:
            return
        self._hashes.append(key_hashes(runs.keys))
        started = time.perf_counter()
        # Row groups read for one shard are kept for the next ones: the shards' keys share files.
        groups = RowGroups()

        def decide(which: np.ndarray, found: Found, ordinal_of: Callable[[str], int]) -> tuple[np.ndarray, list[bytes | None]]:
            return self._decide_history(aligned, resolution, bounds, runs, which, found, ordinal_of, groups)

        # Deciding makes objects per key and keeps them until written: the collector's full
        # passes over a chunk's keys would cost more than the deciding (nothing is cyclic).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._index.transact(self._token, runs.keys, decide)
        finally:
            if collecting:
                gc.enable()
        self.lookup_seconds += time.perf_counter() - started
        self._writer.flush_pending()

    def _history_bounds(self, aligned: pa.Table, resolution: pa.Table, n: int) -> pa.Array:
        """Where each change's version starts: its sequence (in the table's bound type), or the
        batch's time."""
        history = self._keyed.history
        assert history is not None
        kind = aligned.schema.field(history.start).type
        if not self._keyed.sequence_sources:
            return pa.array([int((history.at or time.time()) * 1_000_000)] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")).cast(kind)
        bounds = self._sequence_bounds(aligned, resolution, kind)
        assert bounds is not None
        return bounds

    def _sequence_bounds(self, rows: pa.Table, resolution: pa.Table | None, kind: pa.DataType) -> pa.Array | None:
        """Rows' sequences as bounds of type `kind`: the sequence column, or a struct of the
        sequence columns (a table made with several); None when the rows do not hold them."""
        keyed = self._keyed
        names = keyed.table_sequence_columns or (keyed.sequence_sources if resolution is not None else ())
        source = rows if keyed.table_sequence_columns else resolution
        if not names or source is None:
            return None
        columns = [source.column(c) for c in names]
        arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
        if pa.types.is_struct(kind) and len(arrays) > 1:
            return pa.StructArray.from_arrays(
                [a.cast(kind.field(i).type) if a.type != kind.field(i).type else a for i, a in enumerate(arrays)], fields=list(kind)
            )
        # One column (a table made before bounds took every sequence column keeps its first).
        return arrays[0].cast(kind) if arrays[0].type != kind else arrays[0]

    def _decide_history(
        self, aligned: pa.Table, resolution: pa.Table, bounds: pa.Array, runs: Runs, which: np.ndarray, found: Found,
        ordinal_of: Callable[[str], int], groups: RowGroups,
    ) -> tuple[np.ndarray, list[bytes | None]]:
        """One shard's keys (write/history.py): their versions as they stand, read from the
        table, and what their changes make of them."""
        history = self._keyed.history
        assert history is not None
        schema = aligned.schema
        keys = [runs.keys[i] for i in which.tolist()]
        live = found.present & (found.ordinal != TOMBSTONE)
        last = [found.sequence[i] if found.sequence is not None and found.present[i] else None for i in range(len(keys))]
        # The existing versions: each key's current one, and every one of keys a late change reaches.
        places: list[tuple[int, int]] = []  # (ordinal, position) per existing row
        owners: list[int] = []  # the key (index into `keys`) per existing row
        for i in np.flatnonzero(live).tolist():
            places.append((int(found.ordinal[i]), int(found.position[i])))
            owners.append(i)
        late = np.zeros(len(keys), dtype=bool)
        for i in np.flatnonzero(np.asarray([x is not None for x in last], dtype=bool)).tolist():
            first = runs.rows[runs.first[which[i]]]
            seq = runs.sequence(int(first))  # a key's changes are in sequence order: its first is its oldest
            late[i] = seq is not None and seq < last[i]
        if late.any():
            at = {keys[i]: i for i in np.flatnonzero(late).tolist()}
            seen = set(places)
            for data_file, positions, file_keys in self._scan_versions(set(at)):
                ordinal = ordinal_of(data_file)
                for position, key in zip(positions.tolist(), file_keys):
                    if (ordinal, position) not in seen:
                        seen.add((ordinal, position))
                        places.append((ordinal, position))
                        owners.append(at[key])
        self._refuse_in_flight(places)
        existing = self._read_rows(places, schema, groups)
        latest = self._sequence_bounds(existing, None, bounds.type) if existing.num_rows else None
        versions = Versions(
            aligned, existing, bounds, history.start, history.end, history.tracked, history.data, history.partial, latest,
            bool(self._keyed.sequence_sources),
        )
        stale = self._ended_by_truncate(existing, len(np.flatnonzero(live)), history.start)
        if len(stale):
            live = live.copy()
            live[[owners[j] for j in stale.tolist()]] = False
        existing_of: dict[int, list[int]] = {}
        gone = set(stale.tolist())
        for row, owner in enumerate(owners):
            if row not in gone:
                existing_of.setdefault(owner, []).append(row)
        decision = decide(versions, runs, which, last, live, existing_of, late)
        self._hide_existing(decision.hidden.tolist(), places)
        written, values = self._write_versions(aligned, existing, versions, decision, ordinal_of)
        changed: list[int] = written.tolist()
        for i, row, final in decision.tombstones:
            changed.append(i)
            if final is not None:
                values += pack_positions(TOMBSTONE, np.zeros(1, dtype=np.uint64), [final])
                names = list(self._keyed.table_key_columns)
                picked = resolution.take(pa.array([row]))
                self._tombstones.append(
                    picked.select([*names, *self._keyed.sequence_sources]).rename_columns([*names, *sequence_names(len(self._keyed.sequence_sources))])
                )
                self.tombstone_max = max(final, self.tombstone_max) if self.tombstone_max is not None else final
            else:
                values.append(None)
                self._deleted.append(resolution.take(pa.array([row])).select(list(self._keyed.table_key_columns)))
            self.rows_deleted += 1
        return np.asarray(changed, dtype=np.int64), values

    def _ended_by_truncate(self, existing: pa.Table, current: int, start: str) -> np.ndarray:
        """Of the first `current` existing rows (the versions the index holds as current), those
        a source table's truncate ended at commit (commit/history_truncate.py): started before
        it, their open rows hidden there, the index still pointing at them."""
        if self._truncated_before is None or not current:
            return np.zeros(0, dtype=np.int64)
        starts = encode_keys([existing.column(start).slice(0, current)])
        return np.asarray([j for j, s in enumerate(starts) if s < self._truncated_before], dtype=np.int64)

    def _scan_versions(self, late: set[bytes]) -> list[tuple[str, np.ndarray, list[bytes]]]:
        """Every version of the keys a late change reaches, from the planned snapshot's files:
        (the file's index name, positions, keys)."""
        from lakesink_datasource.index.reindex import file_ref

        metadata, io = self._metadata, self._io
        assert io is not None
        snapshot = metadata.current_snapshot()
        refs = {e.data_file.file_path: file_ref(metadata, e.data_file) for e in live_data_files(io, snapshot)}
        return [(refs[path], positions, keys) for path, positions, keys in scan_versions(io, metadata, self._keyed.table_key_columns, late)]

    def _refuse_in_flight(self, places: list[tuple[int, int]]) -> None:
        """A key's current version written by another task of this batch is in a file still
        being written: its versions cannot be decided here (a key's changes must stay in one
        task, as a Kafka partition keeps them)."""
        if not places:
            return
        if self._committed is None:
            self._committed = {e.data_file.file_path for e in live_data_files(self._io, self._metadata.current_snapshot())}  # type: ignore[arg-type]
        for ordinal in {o for o, _ in places}:
            path = decode_ref(self._index.file_path(ordinal)).path
            if path not in self._committed:
                raise KeyedInputError(
                    f"a key of history table {self._plan.identifier} was changed by two tasks of this batch (its current "
                    f"version is in {path}, which another task is writing): a key's changes must reach one task, as Debezium's "
                    "Kafka partitioning by key keeps them (repartition the input by the key, or use cluster_by_key). Nothing "
                    "was written"
                )

    def _read_rows(self, places: list[tuple[int, int]], schema: pa.Schema, groups: RowGroups | None = None) -> pa.Table:
        """The rows at (ordinal, position) places, in that order, as the table's columns."""
        if not places:
            return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)
        by_file: dict[int, list[int]] = {}
        for j, (ordinal, _) in enumerate(places):
            by_file.setdefault(ordinal, []).append(j)
        parts, order = [], []
        for ordinal, which in by_file.items():
            path = decode_ref(self._index.file_path(ordinal)).path
            assert self._io is not None
            parts.append(read_rows_at(self._io, path, np.array([places[j][1] for j in which], dtype=np.int64), schema, groups))
            order += which
        rows = pa.concat_tables(parts)
        back = np.empty(len(order), dtype=np.int64)
        back[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
        return rows.take(pa.array(back))

    def _hide_existing(self, hidden: list[int], places: list[tuple[int, int]]) -> None:
        if hidden:
            chosen = [places[j] for j in hidden]
            self._hide(np.array([o for o, _ in chosen], dtype=np.int64), np.array([p for _, p in chosen], dtype=np.int64))

    def _write_versions(
        self, aligned: pa.Table, existing: pa.Table, versions: Versions, decision: Decision, ordinal_of: Callable[[str], int],
    ) -> tuple[np.ndarray, list[bytes | None]]:
        """Write the versions that changed; the keys of the current ones and their index entries
        (each keeps its key's last sequence)."""
        history = self._keyed.history
        assert history is not None
        none = np.zeros(0, dtype=np.int64)
        if not len(decision.values):
            return none, []
        rows = take_rows(aligned, existing, decision.values.tolist())
        rows = with_bounds(rows, history.start, history.end, versions.bounds.take(pa.array(decision.starts)), versions.bounds.take(pa.array(decision.ends)))
        ended = np.flatnonzero(~decision.current)
        if len(ended):
            self._place(rows.take(pa.array(ended)), np.zeros(len(ended), dtype=np.int64), None, ordinal_of)
        chosen = np.flatnonzero(decision.current)
        if not len(chosen):
            return none, []
        key_of = decision.owner[chosen]
        sequences = take_items(decision.last, key_of) if self._keyed.sequence_sources else None
        placed, packed = self._place(rows.take(pa.array(chosen)), np.arange(len(chosen), dtype=np.int64), sequences, ordinal_of)  # type: ignore[arg-type]
        return key_of[placed], packed

    def _check_text_route(self, route: KeyShard, resolution: pa.Table) -> None:
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
        raise KeyedInputError(misclustered_message(self._plan.options.table, int((~keep).sum()), example, types))

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
