"""Executor -> driver messages: what a task hands the driver's commit, encoded with msgspec.

Spark pickles whatever `write()` returns and ships it to a *different* Python process on
the driver, so everything the commit needs travels here. The payload is msgpack bytes
(compact, schema-checked on decode) wrapped in a tiny WriterCommitMessage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from pyspark.sql.datasource import WriterCommitMessage

# A partition value travels in Iceberg's single-value binary serialization (the same
# bytes as manifest bounds; None for null), so every partition type round-trips
# exactly; the commit decodes it with the spec's partition type.
PartitionValue = bytes | None


class DataFileMessage(msgspec.Struct, array_like=True, frozen=True):
    """A Parquet data file a task wrote, with the metrics engines prune with."""

    path: str
    spec_id: int
    partition: tuple[PartitionValue, ...]
    record_count: int
    file_size_in_bytes: int
    column_sizes: dict[int, int]
    value_counts: dict[int, int]
    null_value_counts: dict[int, int]
    nan_value_counts: dict[int, int]
    lower_bounds: dict[int, bytes]
    upper_bounds: dict[int, bytes]
    split_offsets: list[int]
    sort_order_id: int = 0  # the table sort order the file's rows are sorted by (0: none)


class PositionDeletesMessage(msgspec.Struct, array_like=True, frozen=True):
    """Row positions a task hides in one data file (keyed writes): a portable Roaring64
    bitmap. The commit merges these across tasks and with the file's live DV, then writes
    the deletion vectors, so that a data file never ends up with two DVs."""

    data_file: str
    spec_id: int
    partition: tuple[PartitionValue, ...]
    positions: bytes  # pyroaring BitMap64.serialize()


class TaskStats(msgspec.Struct, array_like=True, frozen=True):
    """Per-task figures, summed by the commit into one log line per batch."""

    rows_in: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    bytes_written: int = 0
    partition_seconds: float = 0.0
    index_seconds: float = 0.0
    write_seconds: float = 0.0
    index_sync_seconds: float = 0.0  # of index_seconds: bringing the host's index to the planned snapshot
    task_seconds: float = 0.0  # the task's wall time, from its start to its commit message
    input_wait_seconds: float = 0.0  # of task_seconds: waiting for Spark to hand over the next rows


class ReadFile(msgspec.Struct, array_like=True, frozen=True):
    """A data file a compaction read, with the DV (Puffin path and offset; a v2 position-delete
    file: offset None) it had then, None for none: it may be replaced only while it has that."""

    path: str
    deletion_vector: tuple[str, int | None] | None


class CompactionMessage(msgspec.Struct, array_like=True, frozen=True):
    """A compaction group a write task rewrote beside its rows (compaction/carried.py)."""

    group: int
    rewritten: list[ReadFile]  # replaced by `files`
    dropped: list[ReadFile]  # every row deleted: removed, nothing written for them
    files: list[DataFileMessage]
    bytes_read: int
    seconds: float


class TaskResult(msgspec.Struct, frozen=True):
    """Everything one task attempt contributes to a batch."""

    write_id: str  # the plan's id: the commit process has its own plan, tasks carry theirs
    query_id: str | None
    batch_id: int | None
    partition_id: int
    attempt: int
    planned_metadata_location: str | None
    planned_snapshot_id: int | None
    skipped: bool = False  # the batch was already committed: the task wrote nothing
    data_files: list[DataFileMessage] = []
    position_deletes: list[PositionDeletesMessage] = []
    stats: TaskStats = TaskStats()
    host: str = ""
    # Keyed writes: sorted unique 64-bit hashes of the keys the task touched, so the commit
    # can refuse a batch whose key reached two hosts (their indexes cannot agree).
    key_hashes: bytes = b""
    tombstones: str | None = None  # Parquet file of deleted keys with their sequence
    deleted_keys: str | None = None  # Parquet file of the keys deleted without a sequence
    index_sync: str = ""  # what the task's sync did to the host's key index ("current", "rebuilt (reason)", ...)
    tombstone_max_sequence: bytes | None = None  # the highest sequence among them (order-preserving encoding)
    index_healed: bool = False  # the host's index was damaged and rebuilt by this task
    # merge_schema: the staged schema the task's files were written with (JSON) and the schema
    # it evolved from. The commit may run on a plan made by another planning call (streaming:
    # Spark plans the commit's writer separately), so the files' schema travels with them.
    write_schema_json: str | None = None
    evolved_from_schema_id: int | None = None
    # evolve_partition: the staged partition spec the files were written with (None: the
    # table's default spec when the batch was planned); the commit makes it the default.
    write_spec_id: int | None = None
    # Spark's session setting spark.sql.sources.partitionOverwriteMode as the task saw it
    # (Spark hands a session's explicitly set SQL settings to tasks, not to the planner).
    session_overwrite_mode: str | None = None
    # When the driver planned the write this task ran for (epoch seconds) and how long that
    # planning took: the commit runs on a plan of its own, so a batch's start travels here.
    planned_at: float = 0.0
    plan_seconds: float = 0.0
    # The compaction group this task rewrote after its rows (maintenance=auto), if any.
    compaction: CompactionMessage | None = None
    # The newest truncate of the table among this task's events (its position, encoded as
    # sequences are): the commit hides every row ordered before it.
    truncated_at: bytes | None = None
    truncates: tuple[bytes, ...] = ()  # every truncate's position among its events, in order
    binlogs: str | None = None  # MySQL/MariaDB: what its partitions showed of the binlogs (debezium/failovers.py)

    def written_files(self) -> list[str]:
        """The files this attempt wrote for the batch's commit to reference: data files and the
        files of deleted keys. A write that does not land leaves them unreferenced."""
        return [*(m.path for m in self.data_files), *(path for path in (self.tombstones, self.deleted_keys) if path)]

    def compacted_files(self) -> list[str]:
        """The output of the compaction this attempt carried (it may land without the batch)."""
        return [m.path for m in self.compaction.files] if self.compaction is not None else []


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TaskResult)


@dataclass
class LakeSinkCommitMessage(WriterCommitMessage):
    payload: bytes
    # A stream's first task carries the batch's plan (pickled WritePlan) to the commit, which
    # Spark runs in a process of its own: one plan a micro-batch (datasource.py).
    plan: bytes = b""

    @classmethod
    def of(cls, result: TaskResult) -> LakeSinkCommitMessage:
        return cls(_encoder.encode(result))

    def result(self) -> TaskResult:
        return _decoder.decode(self.payload)


def carried_plan(messages: list[WriterCommitMessage | None]) -> bytes | None:
    """The batch's plan a task's message carries (pickled), if one does."""
    return next((m.plan for m in messages if isinstance(m, LakeSinkCommitMessage) and m.plan), None)


@dataclass
class RoutedCommitMessage(WriterCommitMessage):
    """A clustered stream's sink task (`cluster_by_key`): the results of the keyed writes its
    stateful operator ran, one per key shard the Spark partition held."""

    payloads: list[bytes]


@dataclass
class RoutedTablesMessage(WriterCommitMessage):
    """A task of a write routed to many tables (`table_column`, `cdc_format`): per table it
    wrote, that table's identifier, the plan the task made for it (pickled) and its task
    result; with cdc_format, the records it skipped by kind, the tables kept as change logs and
    the truncates of tables that did not exist when it looked (their newest position)."""

    tables: list[tuple[str, bytes, bytes]]
    skipped: dict[str, int] = field(default_factory=dict)
    change_logs: list[str] = field(default_factory=list)
    truncates: dict[str, bytes] = field(default_factory=dict)
    sources: dict[str, list[str | None]] = field(default_factory=dict)  # cdc_format: table -> its source table


def decode_messages(messages: list[WriterCommitMessage | None]) -> list[TaskResult]:
    """Decode the messages Spark hands to commit/abort (failed tasks arrive as None)."""
    results = []
    for m in messages:
        if isinstance(m, LakeSinkCommitMessage):
            results.append(m.result())
        elif isinstance(m, RoutedCommitMessage):
            results += [_decoder.decode(p) for p in m.payloads]
    return results
