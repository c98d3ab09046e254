"""Driver commit: apply every task result of one write (or micro-batch) as ONE snapshot.

Runs in Spark's driver-side commit process, which shares nothing with the tasks except
the commit messages. Exactly-once rests on three rules:
1. the table is re-read before every attempt and a batch whose (query id, epoch) is
   already in the main branch's history is skipped, so a replay is never applied twice;
2. the catalog commit is a compare-and-swap on the main branch's snapshot id, so a
   concurrent writer can never be overwritten: on a lost race the snapshot is rebuilt
   on top of the new state and retried;
3. abort only deletes files of a write that provably did not land, and the commit only the
   files of attempts the catalog refused: after any other error, whatever its type, the
   table is read to see whether an attempt landed (the one commit loop,
   catalog/commit_loop.py, as every commit of lakesink).

`commit_write` reads as Iceberg Java's `SnapshotProducer.commit`: the replay check, the row
delta built, the summary, the commit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import pyspark
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import TableUpdate
from pyroaring import BitMap64

from lakesink_datasource.arrays import unique_sorted
from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.catalog.commit_loop import CommitLoop
from lakesink_datasource.catalog.errors import CatalogError, CatalogUnavailable
from lakesink_datasource.catalog.table_transaction import TableTransaction
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.commit import cleanup
from lakesink_datasource.commit.data_files import data_file
from lakesink_datasource.commit.deletion_vectors import PendingDeletes
from lakesink_datasource.commit.history_truncate import end_versions_at
from lakesink_datasource.commit.key_conflicts import KeyRules
from lakesink_datasource.commit.lost_answer import can_still_land
from lakesink_datasource.commit.overwrite import OverwriteScope
from lakesink_datasource.commit.schema_update import schema_updates
from lakesink_datasource.commit.snapshot_producer import RowDelta, SnapshotProducer
from lakesink_datasource.commit.spec_update import default_spec_updates
from lakesink_datasource.commit.swap import PreparedCommit, swap_in
from lakesink_datasource.commit.validation import ConflictError, ConflictKind
from lakesink_datasource.debezium.failovers import BINLOGS_PROPERTY, encode_binlogs, merged, read_binlogs
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.faults import fault_point
from lakesink_datasource.iceberg import summary_keys as keys
from lakesink_datasource.iceberg.expiry import snapshots_to_expire
from lakesink_datasource.iceberg.gc import GC_OFF_NOTE
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.partition_key import decode_partition
from lakesink_datasource.iceberg.properties import TOMBSTONE_MAX_SEQUENCE, TRUNCATED_BEFORE, TableSettings
from lakesink_datasource.iceberg.retry import Exhausted, Failure, RetryClock, RetryPolicy, Spent
from lakesink_datasource.messages import TaskResult, TaskStats
from lakesink_datasource.options import WriteOptions
from lakesink_datasource.table import idempotency, new_checkpoint
from lakesink_datasource.table.plan import WritePlan, retry_clock
from lakesink_datasource.table.tombstone_table import unstored_tombstone_snapshots
from lakesink_datasource.version import __version__

log = logging.getLogger("lakesink")

class CommitError(LakesinkError, RuntimeError):
    """A batch's commit was refused; `conflict` names the rule when a concurrent change of the
    table refused it (None: the batch itself cannot commit)."""

    def __init__(self, message: str, conflict: ConflictKind | None = None) -> None:
        super().__init__(message)
        self.conflict = conflict

    def __reduce__(self) -> tuple[type[CommitError], tuple[str, ConflictKind | None]]:
        return (type(self), (str(self), self.conflict))


@dataclass
class CommitOutcome:
    snapshot_id: int | None
    skipped_reason: str | None
    attempts: int
    stats: TaskStats
    table: Table | None = None  # the table as this commit left it (what follows reuses it)
    data_files: int = 0  # added by the snapshot
    deletion_vectors: int = 0  # written by the snapshot (merged with the file's earlier DV)
    rows_hidden: int = 0  # existing rows the snapshot hides (replaced or deleted keys)
    seconds: float = 0.0  # the driver's commit, from the catalog load to cleaning up after it
    expired_snapshots: int = 0
    files_removed: int = 0  # unreferenced by the commit (expired snapshots, old metadata) and deleted
    replaced: str | None = None  # an overwrite: what it replaced, in words
    index_starts: str | None = None  # hosts whose key index started over for this batch, and why
    keys_redecided: int = 0  # keys shared with concurrent commits, decided at commit
    note: str | None = None  # what maintenance did not do, said once (gc.enabled=false)


def _sum_stats(results: list[TaskResult]) -> TaskStats:
    fields = TaskStats.__struct_fields__
    return TaskStats(**{f: sum(getattr(r.stats, f) for r in results) for f in fields})


def _extra_summary(
    write_id: str, query_id: str | None, batch_id: int | None, stats: TaskStats, options: WriteOptions
) -> dict[str, str]:
    extra = {
        **options.snapshot_properties,  # the user's first: lakesink's own keys are never overridden
        keys.ENGINE_NAME: "spark",
        keys.ENGINE_VERSION: pyspark.__version__,
        keys.LAKESINK_VERSION: __version__,
        keys.WRITE_ID: write_id,
        keys.ROWS_IN: str(stats.rows_in),
        keys.ROWS_WRITTEN: str(stats.rows_written),
        keys.ROWS_DELETED: str(stats.rows_deleted),
        # Task seconds summed over the batch's tasks, per phase: where the time goes.
        keys.PARTITION_SECONDS: f"{stats.partition_seconds:.3f}",
        keys.INDEX_SECONDS: f"{stats.index_seconds:.3f}",
        keys.INDEX_SYNC_SECONDS: f"{stats.index_sync_seconds:.3f}",
        keys.WRITE_SECONDS: f"{stats.write_seconds:.3f}",
    }
    if query_id is not None and batch_id is not None:
        extra[keys.QUERY_ID] = query_id
        extra[keys.EPOCH_ID] = str(batch_id)
    if options.txn_app_id is not None:
        extra[keys.TXN_APP_ID] = options.txn_app_id
        extra[keys.TXN_VERSION] = str(options.txn_version)
    return extra


def _merge_position_deletes(results: list[TaskResult], metadata: TableMetadata) -> dict[str, PendingDeletes]:
    """One bitmap per data file: tasks of one batch may hide rows of the same file."""
    merged: dict[str, PendingDeletes] = {}
    for r in results:
        for m in r.position_deletes:
            positions = BitMap64.deserialize(m.positions)
            pending = merged.get(m.data_file)
            if pending is None:
                spec = metadata.specs()[m.spec_id]
                merged[m.data_file] = PendingDeletes(m.spec_id, decode_partition(spec, metadata.schema(), m.partition), positions)
            else:
                pending.positions |= positions
    return merged


def _end_at_truncate(table: Table, plan: WritePlan, results: list[TaskResult], added: list[DataFile], hidden: dict[str, PendingDeletes]) -> None:
    """A history table's versions that held at the batch's truncate end there
    (commit/history_truncate.py): their rows hidden, their ended copies added."""
    truncated = _truncated_at(plan, results)
    if truncated is None or plan.keyed is None or plan.keyed.history is None or not plan.keyed.table_sequence_columns:
        return
    every = sorted({truncated, *plan.truncates, *(p for r in results for p in r.truncates)})
    ended = end_versions_at(table.io, table.metadata, plan, added, hidden, every)
    added += ended.files
    for path, pending in ended.hidden.items():
        if path in hidden:
            hidden[path].positions |= pending.positions
        else:
            hidden[path] = pending


def _refuse_keys_on_several_hosts(results: list[TaskResult]) -> None:
    """Each host resolves keys against its own index: a key changed on two hosts in one
    batch would be applied twice (two live rows). Refuse the batch instead."""
    by_host: dict[str, list[np.ndarray]] = {}
    for r in results:
        if r.key_hashes:
            by_host.setdefault(r.host, []).append(np.frombuffer(r.key_hashes, dtype="<u8"))
    if len(by_host) < 2:
        return
    seen: np.ndarray | None = None
    for _host, parts in sorted(by_host.items()):
        keys = unique_sorted(np.concatenate(parts))
        if seen is not None:
            shared = np.intersect1d(seen, keys, assume_unique=True)
            if len(shared):
                raise CommitError(
                    f"{len(shared)} key(s) of this batch reached more than one host ({', '.join(sorted(by_host))}); "
                    "keyed writes on several hosts need input clustered by key: df.repartition(n, *primary_key)"
                )
            seen = unique_sorted(np.concatenate([seen, keys]))
        else:
            seen = keys


def _touched_keys(results: list[TaskResult]) -> np.ndarray:
    parts = [np.frombuffer(r.key_hashes, dtype="<u8") for r in results if r.key_hashes]
    return unique_sorted(np.concatenate(parts)) if parts else np.empty(0, dtype=np.uint64)


def _key_rules(plan: WritePlan, results: list[TaskResult]) -> KeyRules | None:
    """How the commit decides keys it shares with concurrent commits (commit/key_conflicts.py)."""
    keyed = plan.keyed
    if keyed is None:
        return None
    return KeyRules(
        operation=plan.options.operation,
        key_columns=keyed.table_key_columns,
        sequence=keyed.table_sequence_columns,
        sequenced=bool(keyed.sequence_sources),
        history=keyed.history is not None,
        tombstones=tuple(sorted(r.tombstones for r in results if r.tombstones)),
        deleted_keys=tuple(sorted(r.deleted_keys for r in results if r.deleted_keys)),
    )


def _refuse_keys_across_a_rebuilt_index(results: list[TaskResult]) -> None:
    """A task that found its host's index damaged rebuilt it from the table, dropping what
    other tasks of this batch on that host had recorded in it: had they changed a key this
    task also changed, both would have written a row for it. Refuse the batch then."""
    for healed in (r for r in results if r.index_healed and r.key_hashes):
        mine = np.frombuffer(healed.key_hashes, dtype="<u8")
        for other in results:
            if other is healed or other.host != healed.host or not other.key_hashes:
                continue
            if len(np.intersect1d(mine, np.frombuffer(other.key_hashes, dtype="<u8"), assume_unique=True)):
                raise CommitError(
                    f"the key index on host {healed.host} was damaged and rebuilt during this batch while other tasks "
                    "changed the same keys; the batch is refused (restart the query: the replay resolves the keys again)"
                )


def _truncated_at(plan: WritePlan, results: list[TaskResult]) -> bytes | None:
    """The newest truncate the batch's tasks met (cdc_format=debezium): in their results, or in
    the plan (a truncate a task met before another task of the batch created the table)."""
    met = [r.truncated_at for r in results if r.truncated_at is not None]
    return max([*met, *([plan.truncated_at] if plan.truncated_at is not None else [])], default=None)


def _pending_properties(
    plan: WritePlan, base: TableMetadata, query_id: str | None, batch_id: int | None, tombstone_max: bytes | None = None,
    note: str | None = None, truncated: bytes | None = None, binlogs: tuple[str, ...] = (),
) -> dict[str, str]:
    """Table properties this commit sets: the write's `property.<key>` options that differ from
    the table's, the query's last committed epoch (replay detection that survives expiry),
    and the highest sequence a delete of the table ever carried (a key index rebuilt without
    the stored tombstones must assume one up to it, see index/reindex.py)."""
    wanted = dict(plan.options.table_properties)
    if truncated is not None:
        recorded = base.properties.get(TRUNCATED_BEFORE)
        if recorded is None or bytes.fromhex(recorded) < truncated:
            wanted[TRUNCATED_BEFORE] = truncated.hex()
    if binlogs:
        # What the tasks' partitions showed, over what the table held when this attempt began.
        wanted[BINLOGS_PROPERTY] = encode_binlogs(merged([read_binlogs(base.properties.get(BINLOGS_PROPERTY)), *map(read_binlogs, binlogs)]))
    if note is not None:
        wanted[keys.MAINTENANCE_NOTE] = note
    if tombstone_max is not None:
        recorded = base.properties.get(TOMBSTONE_MAX_SEQUENCE)
        if recorded is None or bytes.fromhex(recorded) < tombstone_max:
            wanted[TOMBSTONE_MAX_SEQUENCE] = tombstone_max.hex()
    if query_id is not None and batch_id is not None:
        wanted[idempotency.last_epoch_property(query_id)] = str(batch_id)
        if plan.options.query_name is not None:
            # Which query writes under this name: a later checkpoint's is told apart by it.
            wanted[new_checkpoint.stream_property(plan.options.query_name)] = query_id
    if plan.options.txn_app_id is not None:
        wanted[idempotency.last_txn_property(plan.options.txn_app_id)] = str(plan.options.txn_version)
    return {k: v for k, v in wanted.items() if base.properties.get(k) != v}


def overwrite_mode(plan: WritePlan, results: list[TaskResult], batch_id: int | None) -> str:
    """`static` or `dynamic`: the write's `overwrite_mode` option, else (for batch writes, as
    Spark's file sources do) the session's spark.sql.sources.partitionOverwriteMode that
    the tasks saw, else static. (A write always has a task: Spark gives an empty DataFrame
    one empty partition.)"""
    if plan.options.overwrite_mode is not None:
        return plan.options.overwrite_mode
    session = {r.session_overwrite_mode for r in results if r.session_overwrite_mode}
    if batch_id is None and session == {"dynamic"}:
        return "dynamic"
    return "static"


def _overwrite_scope(plan: WritePlan, results: list[TaskResult], batch_id: int | None) -> OverwriteScope | None:
    truncated = _truncated_at(plan, results)
    # A history table keeps its past: its versions end at the truncate (_end_at_truncate).
    if truncated is not None and plan.keyed is not None and plan.keyed.table_sequence_columns and plan.keyed.history is None:
        return OverwriteScope("before", sequence=plan.keyed.table_sequence_columns, position=truncated)
    if not plan.overwrite:
        return None
    if plan.options.replace_where is not None:
        return OverwriteScope("filter", plan.options.replace_where)
    return OverwriteScope("partitions" if overwrite_mode(plan, results, batch_id) == "dynamic" else "table")


@dataclass(frozen=True)
class _WrittenSchema:
    """The staged schema the batch's files were written with, and the one it evolved from."""

    schema: Schema
    evolved_from: int


def _written_schema(results: list[TaskResult]) -> _WrittenSchema | None:
    staged = {(r.write_schema_json, r.evolved_from_schema_id) for r in results if r.write_schema_json is not None}
    if len(staged) > 1:
        raise CommitError("the tasks of this batch wrote with different evolved schemas; the batch is refused (restart it)")
    if not staged:
        return None
    ((schema_json, evolved_from),) = staged
    assert schema_json is not None and evolved_from is not None
    return _WrittenSchema(Schema.model_validate_json(schema_json), evolved_from)


def _written_spec(results: list[TaskResult]) -> int | None:
    """The evolved partition spec the batch's files were written with (None: not evolved)."""
    specs = {r.write_spec_id for r in results if r.write_spec_id is not None}
    if len(specs) > 1:
        raise CommitError("the tasks of this batch wrote with different partition specs; the batch is refused (restart it)")
    return next(iter(specs), None)


def _attempt(
    producer: SnapshotProducer, plan: WritePlan, table: Table, attempt: int, extra: dict[str, str],
    query_id: str | None, batch_id: int | None, written: _WrittenSchema | None = None, spec_id: int | None = None,
    tombstone_max: bytes | None = None, binlogs: tuple[str, ...] = (),
) -> PreparedCommit:
    base = table.metadata
    expired: list[int] = []
    # Expiry follows main: a commit to another branch leaves it to main's next commit.
    if plan.options.maintenance != "off" and plan.options.branch is None:
        settings = TableSettings.for_write(base.properties, plan.options.table_properties, base.location)
        now_ms = int(time.time() * 1000)
        expired = snapshots_to_expire(base, now_ms, settings.max_snapshot_age_ms, settings.min_snapshots_to_keep, adds_head=True)
        # A snapshot naming tombstones the companion table does not hold yet is their only
        # copy: it stays until they are stored.
        kept = unstored_tombstone_snapshots(table, plan.identifier, expired)
        expired = [s for s in expired if s not in kept]
    schema: Schema | None = None
    layout_changes: list[TableUpdate] = []
    if written is not None:
        schema, layout_changes = schema_updates(base, written.schema, written.evolved_from)
    if spec_id is not None:
        layout_changes += default_spec_updates(base, spec_id)
    snapshot = producer.produce(base, attempt, extra, schema=schema)
    note = extra.get(keys.MAINTENANCE_NOTE)
    truncated = bytes.fromhex(extra[keys.TRUNCATED]) if keys.TRUNCATED in extra else None
    return PreparedCommit(
        base, snapshot, _pending_properties(plan, base, query_id, batch_id, tombstone_max, note, truncated, binlogs), expired,
        plan.options.branch,
        layout_changes,
    )


def _after_commit(table: Table, before: Table, attempt: PreparedCommit, gc_enabled: bool) -> int:
    """Delete what the commit made unreferenced; returns how many files went. On a table
    with gc.enabled=false the expired snapshots' files stay (another table may share them);
    the metadata files it dropped from its log are its own and go."""
    deleted = cleanup.delete_files(table.io, cleanup.dropped_metadata_files(before.metadata, before.metadata_location, table.metadata))
    if attempt.expired and gc_enabled:
        deleted += len(cleanup.expire(table.io, attempt.base, attempt.expired, attempt.snapshot))
    return deleted


def _load(catalog: Catalog, plan: WritePlan, clock: RetryClock) -> Table:
    return catalog_call(
        clock, lambda: sql_commit.load_table(catalog, plan.identifier), what=f"loading table {plan.identifier}",
        catalog=loader.describe(plan.catalog),
    )


def _write_settings(plan: WritePlan, metadata: TableMetadata | None = None) -> TableSettings:
    """The table's settings as this write sees them: its own `property.<key>` options over
    the table's properties (they land with its commit, and govern that commit too)."""
    if metadata is None:
        return TableSettings.for_write({}, plan.options.table_properties, "")
    return TableSettings.for_write(metadata.properties, plan.options.table_properties, metadata.location)


def _oldest_planned(results: list[TaskResult], metadata: TableMetadata, default: int | None) -> int | None:
    """The snapshot the batch's tasks planned against; the oldest, when they planned apart
    (a clustered stream's tasks plan for themselves): what any of them could have missed is
    after it, so the commit validates everything committed since."""
    planned = list(dict.fromkeys(r.planned_snapshot_id for r in results))
    if not planned:
        return default
    if len(planned) == 1 or None in planned:
        return None if None in planned else planned[0]
    sequence = {s.snapshot_id: s.sequence_number or 0 for s in metadata.snapshots}
    return min(planned, key=lambda s: sequence.get(s, -1) if s is not None else -1)


def _replayed(
    plan: WritePlan, metadata: TableMetadata, results: list[TaskResult], query_id: str | None, batch_id: int | None,
    stats: TaskStats,
) -> CommitOutcome | None:
    """The outcome of a batch the table already holds (its epoch, its transaction version),
    None for one to commit; refuses a batch that cannot be committed as the table is."""
    if idempotency.is_epoch_committed(metadata, query_id, batch_id):
        log.info("lakesink: batch %s of query %s is already in the table; skipped", batch_id, query_id)
        return CommitOutcome(None, "already committed", 0, stats)
    txn = plan.options.txn_app_id, plan.options.txn_version
    if idempotency.is_txn_committed(metadata, *txn):
        return CommitOutcome(None, f"txn_version {txn[1]} of txn_app_id {txn[0]!r} is already in the table", 0, stats)
    previous = None if plan.overwrite else new_checkpoint.new_checkpoint_of(metadata, plan.options.query_name, query_id)
    if previous is not None and query_id is not None and plan.options.new_checkpoint != "append":
        # Planning decides a new checkpoint where it can read the checkpoint's query id;
        # this catches the ones it could not (and, with replace, did not empty the table for).
        raise new_checkpoint.refusal(plan.options, query_id, previous, unreadable=plan.options.new_checkpoint == "replace")
    if any(r.skipped for r in results):
        raise CommitError(
            f"tasks of batch {batch_id} saw it committed in metadata {results[0].planned_metadata_location}, "
            "but the table's current history does not contain it (was the table rolled back?)"
        )
    return None


def _summary(
    plan: WritePlan, results: list[TaskResult], metadata: TableMetadata, settings: TableSettings, write_id: str,
    query_id: str | None, batch_id: int | None, stats: TaskStats,
) -> dict[str, str]:
    """The snapshot summary's lakesink keys: who wrote the batch, how, and what a reader or
    another host's index needs to follow it."""
    extra = _extra_summary(write_id, query_id, batch_id, stats, plan.options)
    extra[keys.TASKS] = str(len({r.partition_id for r in results}))
    hosts = sorted({r.host for r in results if r.host})
    if hosts:
        extra[keys.HOSTS] = ",".join(hosts)
    tombstones = sorted(r.tombstones for r in results if r.tombstones)
    if tombstones:
        extra[keys.TOMBSTONES] = ",".join(tombstones)
    deleted_keys = sorted(r.deleted_keys for r in results if r.deleted_keys)
    if deleted_keys:
        extra[keys.DELETED_KEYS] = ",".join(deleted_keys)
    truncated = _truncated_at(plan, results)
    if truncated is not None:
        extra[keys.TRUNCATED] = truncated.hex()
    if plan.keyed is not None:
        # Every key the batch deleted is in the files above, and these task attempts made it:
        # what another host's index needs to follow the batch without a rebuild.
        extra[keys.DELETES_REPORTED] = "true"
        extra[keys.TASK_ATTEMPTS] = ",".join(sorted(keys.task_attempt(r.partition_id, r.attempt) for r in results))
        starts = sorted({f"{r.host}: {r.index_sync}" for r in results if r.index_sync.startswith(("rebuilt", "fetched"))})
        if starts:
            extra[keys.INDEX_STARTS] = "; ".join(starts)
    note = _maintenance_note(plan, metadata, settings)
    if note is not None:
        extra[keys.MAINTENANCE_NOTE] = note
    return extra


def commit_write(
    plan: WritePlan, results: list[TaskResult], batch_id: int | None, transaction: TableTransaction | None = None,
    clock: RetryClock | None = None,
) -> CommitOutcome:
    """The batch's snapshot; with `transaction`, its swap goes with the other tables' of a
    routed write (catalog/table_transaction.py). `clock`: the batch's commit operation's
    (iceberg/retry.py; this commit counts its own races and locks in it)."""
    started = time.perf_counter()
    query_id = next((r.query_id for r in results if r.query_id is not None), None)
    write_ids = {r.write_id for r in results} or {plan.write_id}
    stats = _sum_stats(results)
    clock = clock.scoped(f"committing to {plan.identifier}") if clock is not None else retry_clock(plan, f"committing to {plan.identifier}")
    catalog_name = loader.describe(plan.catalog)
    catalog = catalog_call(clock, lambda: loader.load(plan.catalog), what="opening the catalog", catalog=catalog_name)
    table = _load(catalog, plan, clock)
    metadata = table.metadata
    settings = _write_settings(plan, metadata)
    clock.adopt(RetryPolicy.of(settings))  # the table's own budgets from here on

    # The replay check: a batch already in the table is never applied twice.
    replayed = _replayed(plan, metadata, results, query_id, batch_id, stats)
    if replayed is not None:
        return replayed
    txn = plan.options.txn_app_id, plan.options.txn_version

    # Build: the batch's row delta.
    planned_snapshot_id = _oldest_planned(results, metadata, plan.planned_snapshot_id)
    _refuse_keys_on_several_hosts(results)
    _refuse_keys_across_a_rebuilt_index(results)
    added = [data_file(m, metadata) for r in results for m in r.data_files]
    hidden = _merge_position_deletes(results, metadata)
    _end_at_truncate(table, plan, results, added, hidden)
    delta = RowDelta(
        added_data_files=added,
        position_deletes=hidden,
        overwrite=_overwrite_scope(plan, results, batch_id),
        planned_snapshot_id=planned_snapshot_id,
        # Sequenced deletes of absent keys change no file, but their tombstones must be
        # recorded (and the index tokens committed) or a later, older change would apply.
        record_only=any(r.tombstones for r in results),
        touched_keys=_touched_keys(results) if plan.keyed is not None else None,
        key_columns=plan.keyed.table_key_columns if plan.keyed is not None else (),
        key_rules=_key_rules(plan, results),
    )
    if delta.is_empty:
        return CommitOutcome(None, "nothing to commit", 0, stats)

    producer = SnapshotProducer(table.io, metadata, delta, branch=plan.options.branch, settings=settings)
    written_schema = _written_schema(results)
    written_spec = _written_spec(results)
    tombstone_max = max((r.tombstone_max_sequence for r in results if r.tombstone_max_sequence is not None), default=None)
    # The summary, then the commit.
    extra = _summary(plan, results, metadata, settings, min(write_ids), query_id, batch_id, stats)
    made: dict[int, tuple[PreparedCommit, Table]] = {}  # each attempt built, and the table it was built on
    lost: set[int] = set()  # attempts whose answer was lost: they may have landed
    doing = f"committing to {plan.identifier} ({catalog_name})"

    def forget() -> None:
        # Nothing of this commit landed as far as a table state read after it says: its
        # files go, except those of attempts whose answer was lost (they may still land,
        # or have landed and been expired since, their manifests carried by later commits).
        producer.cleanup(committed_attempt=None, keep=lost)

    def build(table: Table) -> _Attempt:
        number = len(made)
        fault_point("before_commit", batch_id, table=plan.identifier)
        extra[keys.COMMIT_PREPARE_SECONDS] = f"{time.perf_counter() - started:.3f}"
        try:
            prepared = _attempt(
                producer, plan, table, number, extra, query_id, batch_id, written_schema, written_spec, tombstone_max,
                tuple(r.binlogs for r in results if r.binlogs),
            )
        except ConflictError as exc:
            forget()
            raise CommitError(str(exc), exc.kind) from exc
        if producer.last.redecision is not None and producer.last.redecision.keys:
            fault_point("keys_redecided", batch_id)  # tests: a crash between the decision and the swap
        made[number] = (prepared, table)
        return _Attempt(number, prepared)

    def send(table: Table, attempt: _Attempt) -> _Landed | CommitOutcome:
        return _Landed(attempt.number, swap_in(table, attempt.prepared, transaction))

    def landed(table: Table) -> _Landed | CommitOutcome | None:
        number = _landed_attempt(producer, table.metadata)
        if number is None:
            return None
        # An attempt whose answer was lost did land: it is this batch's commit.
        log.warning("lakesink: commit attempt %d of %s landed although its answer was lost; its files are kept", number + 1, plan.identifier)
        return _Landed(number, table)

    def decide(table: Table) -> CommitOutcome | None:
        metadata = table.metadata
        if idempotency.is_epoch_committed(metadata, query_id, batch_id) or idempotency.is_txn_committed(metadata, *txn) or any(
            idempotency.is_write_committed(metadata, w, planned_snapshot_id, plan.options.branch) for w in write_ids
        ):
            forget()
            return CommitOutcome(None, "committed concurrently", len(made), stats)
        return None

    def not_landed(table: Table) -> None:
        # Attempts that can never land now (their branch moved on) may lose their files.
        lost.difference_update([n for n in lost if not can_still_land(table.metadata, made[n][0])])

    loop: CommitLoop[_Attempt, _Landed | CommitOutcome] = CommitLoop(
        clock, doing, catalog, plan.identifier, build, send, landed, decide=decide,
        unknown=lambda attempt: lost.add(attempt.number), not_landed=not_landed, gave_up=forget,
        exhausted=_commit_spent(plan, catalog_name),
    )
    outcome = loop.run(table)
    if isinstance(outcome, CommitOutcome):
        return outcome
    prepared, before = made[outcome.attempt]
    return _committed(plan, producer, prepared, outcome.committed, before, outcome.attempt, batch_id, stats, delta, started, len(made))


@dataclass(frozen=True)
class _Attempt:
    number: int  # from 0
    prepared: PreparedCommit


@dataclass(frozen=True)
class _Landed:
    attempt: int  # the attempt that landed
    committed: Table  # a table state read after it, which holds it


def _commit_spent(plan: WritePlan, catalog_name: str) -> Exhausted:
    def spent(why: Spent) -> BaseException:
        if why.kind is Failure.RACE:
            return CommitError(
                f"could not commit to {plan.identifier} after {why.failures} attempts: other writers kept committing first "
                f"(raise table property commit.retry.num-retries, now {why.backoff.retries}, to wait longer)"
            )
        # Whether an attempt landed is unknown: its files stay (the abort or the replay of
        # this batch looks at the table and knows).
        return CatalogUnavailable(
            f"could not commit to {plan.identifier}: {catalog_name}: {why.describe()}. Check that the catalog service is "
            "up and reachable (for the embedded SQLite catalog: that no other process holds catalog.db locked). "
            "Restarting the query is safe: a batch that did land is recognised and not written twice",
            why.last, why.failures,
        )

    return spent


def _maintenance_note(plan: WritePlan, metadata: TableMetadata, settings: TableSettings) -> str | None:
    """GC_OFF_NOTE when maintenance runs on a gc.enabled=false table that has not been told
    yet: the table property of the same name records that it was (snapshot summaries
    expire), so the table and the progress line say it once."""
    if plan.options.maintenance == "off" or settings.gc_enabled:
        return None
    return None if metadata.properties.get(keys.MAINTENANCE_NOTE) == GC_OFF_NOTE else GC_OFF_NOTE


def _landed_attempt(producer: SnapshotProducer, metadata: TableMetadata) -> int | None:
    """The attempt of `producer` that the table holds (its answer was lost), or None."""
    snapshot = metadata.snapshot_by_id(producer.snapshot_id)
    return producer.attempt_of(snapshot) if snapshot is not None else None


def _committed(
    plan: WritePlan, producer: SnapshotProducer, attempt: PreparedCommit, committed: Table, table: Table,
    attempt_number: int, batch_id: int | None, stats: TaskStats, delta: RowDelta, started: float,
    attempts_made: int | None = None,
) -> CommitOutcome:
    """What follows a landed commit (`attempt_number`, of `attempts_made` attempts): the other
    attempts' files and what the commit made unreferenced deleted, the outcome logged.
    `committed`: a table state read after the commit, which holds it."""
    producer.cleanup(committed_attempt=attempt_number)
    made = attempt_number + 1 if attempts_made is None else attempts_made
    fault_point("after_commit", batch_id, table=plan.identifier)
    snapshot = attempt.snapshot
    assert snapshot is not None  # a batch commit always adds one
    removed = _after_commit(committed, table, attempt, _write_settings(plan, attempt.base).gc_enabled)
    seconds = time.perf_counter() - started
    dvs = len(producer.last.deletion_vectors)
    event = {
        "event": "commit", "snapshot_id": snapshot.snapshot_id,
        "operation": snapshot.summary.operation.value if snapshot.summary else "?", "batch": batch_id,
        "rows_in": stats.rows_in, "rows_written": stats.rows_written, "rows_deleted": stats.rows_deleted,
        "data_files": len(delta.added_data_files), "dvs": dvs, "bytes": stats.bytes_written, "attempts": made,
        "partition_s": stats.partition_seconds, "index_s": stats.index_seconds, "write_s": stats.write_seconds,
        "commit_s": seconds, "expired_snapshots": len(attempt.expired), "files_removed": removed,
        "keys_redecided": producer.last.redecision.keys if producer.last.redecision is not None else 0,
    }
    # The fields ride along as `lakesink_event` too, for a log handler that wants them whole
    # (the benchmarks' hook writes them as JSON instead of parsing the line).
    log.info(
        "lakesink: committed snapshot %(snapshot_id)d (%(operation)s) batch=%(batch)s rows_in=%(rows_in)d "
        "rows_written=%(rows_written)d rows_deleted=%(rows_deleted)d data_files=%(data_files)d dvs=%(dvs)d "
        "bytes=%(bytes)d attempts=%(attempts)d partition_s=%(partition_s).3f index_s=%(index_s).3f "
        "write_s=%(write_s).3f commit_s=%(commit_s).3f expired_snapshots=%(expired_snapshots)d "
        "files_removed=%(files_removed)d keys_redecided=%(keys_redecided)d",
        event, extra={"lakesink_event": event},
    )
    return CommitOutcome(
        snapshot.snapshot_id, None, made, stats, committed, data_files=len(delta.added_data_files),
        deletion_vectors=dvs, rows_hidden=sum(len(p.positions) for p in delta.position_deletes.values()),
        seconds=seconds, expired_snapshots=len(attempt.expired), files_removed=removed,
        replaced=_describe_replaced(producer, snapshot),
        index_starts=(snapshot.summary.additional_properties.get(keys.INDEX_STARTS) if snapshot.summary else None),
        keys_redecided=producer.last.redecision.keys if producer.last.redecision is not None else 0,
        note=snapshot.summary.additional_properties.get(keys.MAINTENANCE_NOTE) if snapshot.summary else None,
    )


def _describe_replaced(producer: SnapshotProducer, snapshot: Snapshot) -> str | None:
    """What an overwrite replaced, for the progress line: a static overwrite of a partitioned
    table replaces every partition, which a user expecting Spark's dynamic mode must see."""
    replaced = producer.last.replaced
    if replaced is None:
        return None
    props = snapshot.summary.additional_properties if snapshot.summary else {}
    rows = int(props.get("deleted-records", 0)) + int(props.get("added-position-deletes", 0))
    if replaced.scope.kind == "table":
        return f"replaced the whole table ({rows:,} rows; overwrite_mode=dynamic replaces only the partitions written)"
    if replaced.scope.kind == "partitions":
        return f"replaced {len(replaced.partitions)} partition(s) ({rows:,} rows)"
    if replaced.scope.kind == "before":
        return f"truncated at the source: hid the {rows:,} rows ordered before the truncate"
    return f"replaced the rows matching {replaced.scope.filter_text!r} ({rows:,} rows)"


def abort_write(plan: WritePlan, results: list[TaskResult], batch_id: int | None) -> list[str]:
    """Delete the files a failed write produced, unless that write did land."""
    if not results:
        return []
    query_id = next((r.query_id for r in results if r.query_id is not None), None)
    clock = retry_clock(plan, f"aborting batch {batch_id} of {plan.identifier}")
    files = [path for r in results for path in r.written_files()]
    try:
        with clock.active():
            catalog = catalog_call(clock, lambda: loader.load(plan.catalog), what="opening the catalog", catalog=loader.describe(plan.catalog))
            table = _load(catalog, plan, clock)
    except CatalogError as exc:
        # Whether the write landed cannot be known: its files stay, for orphan removal.
        log.warning(
            "lakesink: abort of batch %s could not check table %s (%s); its %d file(s) are kept until orphan removal "
            "(python -m lakesink_datasource.maintain remove-orphans) finds them unreferenced: %s",
            batch_id, plan.identifier, exc, len(files), ", ".join(files[:10]) + (", ..." if len(files) > 10 else ""),
        )
        return []
    if idempotency.is_epoch_committed(table.metadata, query_id, batch_id) or any(
        idempotency.is_write_committed(table.metadata, r.write_id, r.planned_snapshot_id, plan.options.branch) for r in results
    ):
        log.warning("lakesink: abort of batch %s ignored: it is already committed", batch_id)
        return []
    compacted = [path for r in results for path in r.compacted_files()]
    if compacted:
        # A compaction the tasks carried lands before the batch's snapshot: it may have
        # landed although the batch did not; its files stay if the table has them.
        snapshot = table.metadata.current_snapshot()
        live = {e.data_file.file_path for e in live_data_files(table.io, snapshot)} if snapshot is not None else set()
        files += [path for path in compacted if path not in live]
    deleted = []
    for path in files:
        try:
            table.io.delete(path)
            deleted.append(path)
        except (FileNotFoundError, OSError):
            pass
    return deleted
