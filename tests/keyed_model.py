"""A reference model of keyed writes (upsert / cdc / dedupe) and a Spark-free driver.

The model is the contract the keyed property tests hold lakesink to: the live rows are a
map key -> latest row.

* upsert: insert or replace; cdc: op c/r/u writes the row, d deletes the key (a no-op on
  the live rows when it is absent); dedupe: insert only when the key is absent.
* Inside one task's input several rows of a key collapse first to one winner: the highest
  sequence (ties: the later row), or the last row without a sequence column. The winner is
  then applied like a single change. (lakesink resolves per chunk of CHUNK_ROWS = 100,000
  input rows, `write/task.py`; every task here is far smaller, so a task is one chunk.
  For upsert and cdc this is the same as applying each Arrow batch in turn; dedupe keeps a
  key's first row within a chunk and across chunks, tasks and batches.)
* Arrival order: micro-batches in order, inside a batch the tasks in the order the driver
  runs them (the host lock serialises them), inside a task its Arrow batches in order.
* With a sequence column a change older than what the key last saw (a live row's or a
  delete's sequence) is ignored; equal sequences: the later arrival wins. A delete leaves
  a tombstone holding its sequence, even when the key was absent.

The driver runs plan_write -> write_task (one call per task) -> commit_write exactly like
Spark's driver/executors do, against a fresh warehouse and index directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import msgspec
import pyarrow as pa
from lakesink_testing import duckdb_connection, expected_rows, load, pyiceberg_rows, rows
from pyspark.sql import types as T

from lakesink_datasource.catalog import loader
from lakesink_datasource.check import check_table
from lakesink_datasource.commit.committer import CommitOutcome, commit_write
from lakesink_datasource.index import environment
from lakesink_datasource.maintenance.after_batch import land_compaction
from lakesink_datasource.maintenance.tombstone_storing import store_tombstones_safely
from lakesink_datasource.messages import LakeSinkCommitMessage, TaskResult, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.plan import WritePlan
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.k"
QUERY = "q"
BASE_TS = datetime(2024, 3, 1, tzinfo=timezone.utc)
WRITE_OPS = ("c", "r", "u")


@dataclass(frozen=True)
class Config:
    operation: str  # upsert | cdc | dedupe
    partition_by: str | None = None
    sequence: bool = False
    format_version: int = 3  # 2: position-delete files instead of DVs, no row lineage
    sort_by: str | None = None  # the table's sort order (option sort_by)

    @property
    def columns(self) -> list[str]:
        """The table columns readers are compared on (the op column is not stored)."""
        return ["id", "v", "ts"] + (["seq"] if self.sequence else [])

    def __str__(self) -> str:
        sorted_by = f"/sorted by {self.sort_by}" if self.sort_by else ""
        return f"{self.operation}/{self.partition_by or 'unpartitioned'}/{'seq' if self.sequence else 'noseq'}/v{self.format_version}{sorted_by}"


def spark_schema(config: Config) -> T.StructType:
    fields = [T.StructField("id", T.LongType()), T.StructField("v", T.StringType()), T.StructField("ts", T.TimestampType())]
    if config.sequence:
        fields.append(T.StructField("seq", T.LongType()))
    if config.operation == "cdc":
        fields.append(T.StructField("op", T.StringType()))
    return T.StructType(fields)


def arrow_schema(config: Config) -> pa.Schema:
    fields = [("id", pa.int64()), ("v", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))]
    if config.sequence:
        fields.append(("seq", pa.int64()))
    if config.operation == "cdc":
        fields.append(("op", pa.string()))
    return pa.schema(fields)


# --------------------------------------------------------------------------- the input


@dataclass(frozen=True)
class Change:
    """One input row before labelling. `day` None means a null timestamp."""

    id: int
    op: str = "u"  # cdc: c/r/u/d; upsert and dedupe ignore it
    seq: int | None = None
    day: int | None = 0
    hour: int = 0
    bare: bool = False  # a delete row carrying only key (+ sequence)


# batch -> task -> Arrow batch -> rows
Task = list[list[Change]]
Batch = list[Task]


def record(config: Config, change: Change, label: str) -> dict:
    """The input row as a dict (v is a unique label, so the winning row is visible)."""
    is_delete = config.operation == "cdc" and change.op == "d"
    bare = is_delete and change.bare
    ts = None if (bare or change.day is None) else BASE_TS + timedelta(days=change.day, hours=change.hour)
    row = {"id": change.id, "v": None if bare else label, "ts": ts}
    if config.sequence:
        row["seq"] = change.seq if change.seq is not None else 0
    if config.operation == "cdc":
        row["op"] = change.op
    return row


def label_batches(config: Config, batches: Sequence[Batch], tag: str = "") -> list[list[list[list[dict]]]]:
    return [
        [
            [[record(config, c, f"{tag}b{b}t{t}a{a}r{r}") for r, c in enumerate(rows)] for a, rows in enumerate(task)]
            for t, task in enumerate(batch)
        ]
        for b, batch in enumerate(batches)
    ]


def in_order_sequences(batches: Sequence[Batch]) -> list[Batch]:
    """The same changes with sequences increasing in arrival order (no late data)."""
    counter = iter(range(1, 1 << 30))
    return [
        [[[Change(c.id, c.op, next(counter), c.day, c.hour, c.bare) for c in rows] for rows in task] for task in batch]
        for batch in batches
    ]


# --------------------------------------------------------------------------- input strategies


def changes(operation: str, sequence: bool):  # type: ignore[no-untyped-def]
    """Hypothesis strategy for one input row: a tiny key space (0..15) so keys collide
    within Arrow batches, tasks and batches; sequences from a small range so late changes
    and ties are common; cdc deletes are frequent (2 in 5) and may carry only key + seq."""
    from hypothesis import strategies as st

    return st.builds(
        Change,
        id=st.integers(0, 15),
        op=st.sampled_from(["c", "u", "r", "d", "d"]) if operation == "cdc" else st.just("u"),
        seq=st.integers(-2, 9) if sequence else st.none(),
        # A few days, so `days(ts)` tables move keys between partitions; null timestamps too.
        day=st.sampled_from([0, 1, 2, 3, None]),
        hour=st.integers(0, 23),
        bare=st.booleans(),
    )


def micro_batches(operation: str, sequence: bool, min_batches: int = 2, max_batches: int = 5):  # type: ignore[no-untyped-def]
    """min..max micro-batches, each of 1-3 tasks with 1-2 Arrow batches of 0-8 rows."""
    from hypothesis import strategies as st

    arrow_batch = st.lists(changes(operation, sequence), max_size=8)
    task = st.lists(arrow_batch, min_size=1, max_size=2)
    batch = st.lists(task, min_size=1, max_size=3)
    return st.lists(batch, min_size=min_batches, max_size=max_batches)


def to_arrow(config: Config, rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=arrow_schema(config))


# --------------------------------------------------------------------------- the model


def _event(name: str) -> None:
    """Hypothesis coverage statistics (--hypothesis-show-statistics); no-op elsewhere."""
    from hypothesis import event
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        event(name)


def _day(ts: datetime | None) -> object | None:
    return None if ts is None else ts.date()


@dataclass
class Model:
    config: Config
    live: dict[int, dict] = field(default_factory=dict)  # key -> stored row (no op column)
    seen: dict[int, int] = field(default_factory=dict)  # key -> sequence of its latest change (live or tombstone)

    def copy(self) -> Model:
        return Model(self.config, dict(self.live), dict(self.seen))

    def apply_task(self, task: list[list[dict]]) -> None:
        self.apply_chunk([row for arrow_rows in task for row in arrow_rows])

    def apply_batch(self, batch: list[list[list[dict]]]) -> None:
        for task in batch:
            self.apply_task(task)

    def apply_chunk(self, rows: list[dict]) -> None:
        """Resolve one winner per key among `rows` (input order), then apply each."""
        winners: dict[int, dict] = {}
        for row in rows:  # input order: a later row replaces an equal-or-lower sequence
            best = winners.get(row["id"])
            if self.config.operation == "dedupe":
                if best is None:  # dedupe: a key's first row is the one inserted
                    winners[row["id"]] = row
            elif best is None or not self.config.sequence or row["seq"] >= best["seq"]:
                winners[row["id"]] = row
        for row in winners.values():
            self._apply(row)

    def _apply(self, row: dict) -> None:
        key = row["id"]
        seq = row.get("seq") if self.config.sequence else None
        if seq is not None and key in self.seen:
            if self.seen[key] > seq:
                _event("late change ignored" + ("" if key in self.live else " (deleted key)"))
                return
            if self.seen[key] == seq:
                _event("equal sequence: the later arrival wins")
        stored = {c: row[c] for c in self.config.columns}
        old = self.live.get(key)
        if self.config.operation == "dedupe":
            if old is None:
                self.live[key] = stored
                self._saw(key, seq)
            else:
                _event("dedupe: duplicate of a live key ignored")
            return
        if self.config.operation == "cdc" and row["op"] == "d":
            if self.live.pop(key, None) is None:
                _event("delete of an absent key")
            self._saw(key, seq)
            return
        if old is not None and self.config.partition_by == "days(ts)" and _day(old["ts"]) != _day(stored["ts"]):
            _event("update moved the key to another day partition")
        self.live[key] = stored
        self._saw(key, seq)

    def _saw(self, key: int, seq: int | None) -> None:
        if seq is not None:
            self.seen[key] = seq

    def expected(self) -> Counter:
        return expected_rows(list(self.live.values()), self.config.columns)


# --------------------------------------------------------------------------- the driver

_duckdb = None


def duckdb_rows(metadata_location: str, columns: Sequence[str]) -> Counter:
    """`lakesink_testing.duckdb_rows` on one shared connection: loading the iceberg and
    avro extensions costs ~0.25 s, more than the scan of these small tables."""
    global _duckdb
    if _duckdb is None:
        _duckdb = duckdb_connection()
        _duckdb.execute("SET enable_external_file_cache = false")
    cols = ", ".join(f'"{c}"' for c in columns)
    return rows(_duckdb.execute(f"SELECT {cols} FROM iceberg_scan('{metadata_location}')").to_arrow_table(), columns)


class Harness:
    """One fresh warehouse + index directory, driven like Spark would (without Spark)."""

    def __init__(self, config: Config, *, root: str | None = None):
        self.config = config
        self.root = root or tempfile.mkdtemp(prefix="lakesink-keyed-")
        self.warehouse = os.path.join(self.root, "warehouse")
        self.index_dir = os.path.join(self.root, "index")
        raw = {
            "table": IDENT,
            "warehouse": self.warehouse,
            "operation": config.operation,
            "primary_key": "id",
            "index_dir": self.index_dir,
        }
        if config.operation == "cdc":
            raw["op_column"] = "op"
        if config.sequence:
            raw["sequence_column"] = "seq"
        if config.partition_by:
            raw["partition_by"] = config.partition_by
        if config.format_version != 3:
            raw["format_version"] = str(config.format_version)
        if config.sort_by:
            raw["sort_by"] = config.sort_by
        self.options = parse_options(raw)
        self.schema = spark_schema(config)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plan(self) -> WritePlan:
        return plan_write(self.options, self.schema, overwrite=False)

    def write(
        self, plan: WritePlan, task: list[list[dict]], batch_id: int, *, partition_id: int, attempt: int = 0
    ) -> LakeSinkCommitMessage:
        batches = [to_arrow(self.config, rows) for rows in task]
        who = TaskIdentity(partition_id=partition_id, attempt=attempt, batch_id=batch_id, query_id=QUERY)
        return write_task(plan, iter(batches), who=who)

    def commit(self, plan: WritePlan, messages: list, batch_id: int) -> CommitOutcome:
        """As the Spark commit does it: the compaction its tasks carried, then the batch's
        snapshot, with its deletes stored in the companion table before and after (sequenced
        writes); no maintenance after it."""
        sequenced = plan.keyed is not None and bool(plan.keyed.sequence_sources)
        if sequenced:
            store_tombstones_safely(loader.load(plan.catalog), plan.identifier)
        # The compaction the tasks carried (maintenance=auto) lands first, as in the sink's commit.
        land_compaction(plan, decode_messages(messages), batch_id)
        outcome = commit_write(plan, decode_messages(messages), batch_id)
        if sequenced and outcome.snapshot_id is not None:
            store_tombstones_safely(loader.load(plan.catalog), plan.identifier)
        return outcome

    def run_batch(self, batch: list[list[list[dict]]], batch_id: int) -> CommitOutcome:
        plan = self.plan()
        messages = [self.write(plan, task, batch_id, partition_id=i) for i, task in enumerate(batch)]
        return self.commit(plan, messages, batch_id)

    def host_dir(self, host: int) -> str:
        """The index directory of host `host` (0 is `index_dir`): each its own key index,
        as two Spark workers with their own HOME keep."""
        return self.index_dir if host == 0 else os.path.join(self.root, f"index-{host}")

    def index_path(self, host: int = 0) -> str:
        """Where host `host` keeps the table's index for this harness's writes (they run as
        streaming query QUERY, which keeps its own index, see index_location)."""
        from lakesink_datasource.index.for_write import index_location

        return index_location(self.host_dir(host), self.table().metadata, writer=QUERY)

    def on_host(self, plan: WritePlan, host: int) -> WritePlan:
        return msgspec.structs.replace(plan, options=msgspec.structs.replace(plan.options, index_dir=self.host_dir(host)))

    def run_batch_on_hosts(self, batch: list[list[list[dict]]], batch_id: int, hosts: Sequence[int]) -> tuple[CommitOutcome, list[TaskResult]]:
        """A batch whose task i runs on host `hosts[i]`; returns the outcome and the task
        results (each saying what its sync did to its host's index)."""
        plan = self.plan()
        messages = [self.write(self.on_host(plan, host), task, batch_id, partition_id=i) for i, (task, host) in enumerate(zip(batch, hosts))]
        return self.commit(plan, messages, batch_id), decode_messages(messages)

    def table(self):  # type: ignore[no-untyped-def]
        return load(self.warehouse, IDENT)

    def readers(self) -> tuple[Counter, Counter]:
        """What pyiceberg and DuckDB see (both empty before the first snapshot)."""
        table = self.table()
        if table.metadata.current_snapshot() is None:
            return Counter(), Counter()
        return pyiceberg_rows(table, self.config.columns), duckdb_rows(table.metadata_location, self.config.columns)

    def assert_matches(self, expected: Counter, where: str = "") -> None:
        table = self.table()
        if table.metadata.current_snapshot() is None:
            # Nothing committed yet (every change was a no-op): an empty table.
            assert expected == Counter(), f"{where}: no snapshot, but the model has rows {expected}"
            return
        for reader, got in (("pyiceberg", pyiceberg_rows(table, self.config.columns)), ("DuckDB", duckdb_rows(table.metadata_location, self.config.columns))):
            assert got == expected, (
                f"{where} [{self.config}]: {reader} disagrees with the model\n"
                f"  missing: {dict(expected - got)}\n  unexpected: {dict(got - expected)}"
            )
        violations = check_table(table)
        assert violations == [], f"{where} [{self.config}]: check_table: {violations}"

    def drop_index(self, *, new_process: bool = True, host: int | None = None) -> None:
        """Delete the index directory (shutil.rmtree, as an operator would).

        new_process: also close this process's cached LMDB handles, so the next task opens
        a fresh index like a new worker process would. Without it, this process keeps
        working on its open (now unlinked) environment, like a long-lived Spark worker."""
        folders = [self.host_dir(host)] if host is not None else [self.index_dir, *glob.glob(os.path.join(self.root, "index-*"))]
        for folder in folders:
            if new_process:
                prefix = os.path.abspath(folder) + os.sep
                for path in [p for p in list(environment._CACHE) if p.startswith(prefix)]:
                    environment.drop_index(path)
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        self.drop_index()
        config = loader.catalog_config(self.options)
        cached, _inode = loader._cache.pop((config.name, tuple(sorted(config.properties.items()))), (None, None))
        engine = getattr(cached, "engine", None)
        if engine is not None:
            engine.dispose()
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------- worker processes


def remote_write(plan: WritePlan, config: Config, task: list[list[dict]], batch_id: int, partition_id: int, attempt: int = 0) -> LakeSinkCommitMessage:
    """write_task in a (persistent) worker process, like a Spark Python worker: the
    process keeps its own cached LMDB handle and metadata between tasks."""
    batches = [to_arrow(config, rows) for rows in task]
    who = TaskIdentity(partition_id=partition_id, attempt=attempt, batch_id=batch_id, query_id=QUERY)
    return write_task(plan, iter(batches), who=who)
