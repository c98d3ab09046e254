"""Store a keyed table's tombstones in its companion table (`table/tombstone_table.py`).

Runs in the driver's commit process right before and right after every keyed batch's commit
(before: so a batch whose storing did not happen is caught up before this commit may expire
its snapshot; after: so this batch's deletes are safe at once), and before `maintain expire`.
Each run appends, in one companion snapshot, the tombstone files named by every main-table
snapshot after the companion's `stored-through` mark, and moves the mark. The companion is
kept small the same way as any lakesink table: old snapshots expired, its files compacted.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
from pyiceberg.table import Table

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.transient import catalog_call, catalog_unavailable, first_line
from lakesink_datasource.commit.append_rows import append_rows
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.history import ancestors
from lakesink_datasource.iceberg.live_files import live_data_files
from lakesink_datasource.iceberg.properties import METADATA_DELETE_AFTER_COMMIT, METADATA_PREVIOUS_VERSIONS_MAX, TableSettings
from lakesink_datasource.iceberg.retry import ANY, DEFAULT_POLICY, RetryClock, RetryPolicy
from lakesink_datasource.iceberg.summary_keys import TOMBSTONES, TOTAL_DATA_FILES
from lakesink_datasource.maintenance.compaction import compact
from lakesink_datasource.maintenance.expire import expire_snapshots
from lakesink_datasource.table.tombstone_table import STORED_THROUGH, companion_identifier, load_companion, stored_through

log = logging.getLogger("lakesink")

COMPACT_AT_FILES = 8  # the companion's small files are merged once this many accumulate
KEEP_SNAPSHOTS = 10  # the companion's history is expired past this many snapshots


def _pending_files(table: Table, through: int) -> tuple[list[str], int]:
    """Tombstone files of the main snapshots after sequence `through`, and the newest sequence."""
    files: list[str] = []
    newest = through
    for snapshot in ancestors(table.metadata):
        sequence = snapshot.sequence_number or 0
        if sequence <= through:
            break
        newest = max(newest, sequence)
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        files += [p for p in props.get(TOMBSTONES, "").split(",") if p]
    return files, newest


def _create_companion(catalog: Catalog, identifier: str, schema: pa.Schema, clock: RetryClock, catalog_name: str) -> Table:
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog_call(clock, lambda: catalog.create_namespace(namespace), what=f"creating namespace {namespace}", catalog=catalog_name)
    except NamespaceAlreadyExistsError:
        pass
    name = companion_identifier(identifier)
    try:
        return catalog_call(
            clock,
            lambda: catalog.create_table(
                name, schema=schema,
                properties={"format-version": "2", METADATA_DELETE_AFTER_COMMIT: "true", METADATA_PREVIOUS_VERSIONS_MAX: "10"},
            ),
            what=f"creating table {name}", catalog=catalog_name,
        )
    except TableAlreadyExistsError:
        return catalog_call(clock, lambda: catalog.load_table(name), what=f"loading table {name}", catalog=catalog_name)


def store_tombstones(catalog: Catalog, identifier: str, table: Table | None = None, clock: RetryClock | None = None) -> int:
    """Append the not yet stored tombstones of `identifier` (`table`, when the caller has it
    loaded) to its companion; returns rows. Raises when they cannot be stored; the
    companion's own upkeep (expiry, compaction) afterwards only logs its failures. `clock`:
    the operation's it is part of (iceberg/retry.py), else one of its own with the table's
    budgets: a race with another writer of the companion is tried again on the new state,
    within them."""
    name = f"catalog {catalog.name!r}"
    if clock is None:
        table = table or catalog_call(_default_clock(), lambda: sql_commit.load_table(catalog, identifier), what=f"loading table {identifier}", catalog=name)
        clock = RetryPolicy.of(TableSettings.of_table(table.metadata)).start(f"storing the tombstones of {identifier}")
    clock = clock.scoped(f"storing the tombstones of {identifier}")
    loaded = [table]

    def attempt() -> int:
        current = loaded[0] or catalog_call(clock, lambda: sql_commit.load_table(catalog, identifier), what=f"loading table {identifier}", catalog=name)
        loaded[0] = None  # a race: the next attempt reads the table again
        return _store(catalog, identifier, current, clock, name)

    with clock.active():
        return clock.run(attempt, doing=f"storing the tombstones of {identifier}", retry_on=ANY,
                         exhausted=catalog_unavailable(name, f"storing the tombstones of {identifier}: "))


def _default_clock() -> RetryClock:
    return DEFAULT_POLICY.start("loading a table")


def _store(catalog: Catalog, identifier: str, table: Table, clock: RetryClock, catalog_name: str) -> int:
    companion = catalog_call(clock, lambda: load_companion(catalog, identifier), what=f"loading {companion_identifier(identifier)}", catalog=catalog_name)
    files, newest = _pending_files(table, stored_through(companion))
    if not files:
        return 0
    parts = []
    for path in files:
        try:
            with table.io.new_input(path).open() as stream:
                parts.append(pq.read_table(stream))
        except FileNotFoundError:
            log.warning("lakesink: tombstone file %s is gone before it was stored; its deletes are forgotten", path)
    rows = pa.concat_tables(parts, promote_options="permissive") if parts else None
    if rows is None or rows.num_rows == 0:
        return 0
    if companion is None:
        companion = _create_companion(catalog, identifier, rows.schema, clock, catalog_name)
    # The mark is a table property set by the same commit: it survives any engine's
    # compaction and expiry of the companion, which keep table properties.
    companion = append_rows(companion, rows, properties={STORED_THROUGH: str(newest)}, clock=clock)
    try:
        if len(companion.metadata.snapshots) > KEEP_SNAPSHOTS:
            expire_snapshots(companion, max_age_ms=0, clock=clock)
            companion = companion.refresh()
        if _live_files(companion) >= COMPACT_AT_FILES:
            compact(companion, budget_bytes=1 << 40, tiered=False, clock=clock.scoped())
    except Exception:
        # The rows are stored; a companion left untidied is tidied by a later run.
        log.warning("lakesink: could not compact or expire %s", companion_identifier(identifier), exc_info=True)
    return rows.num_rows


def _live_files(companion: Table) -> int:
    """Live data files of the companion: its snapshot summary's total (no manifest read);
    the manifests when another engine's snapshot left no total."""
    snapshot = companion.metadata.current_snapshot()
    total = snapshot.summary.additional_properties.get(TOTAL_DATA_FILES) if snapshot and snapshot.summary else None
    return int(total) if total is not None else len(live_data_files(companion.io, snapshot))


class TombstonesNotDurable(LakesinkError, RuntimeError):
    """The tombstones of earlier batches cannot be stored: a sequenced batch does not commit."""


def store_tombstones_before_commit(catalog: Catalog, identifier: str, clock: RetryClock) -> None:
    """Before a sequenced batch commits: store every earlier batch's tombstones, or refuse
    the batch. Its commit may expire the snapshots naming them (and other engines' expiry
    and orphan removal drop those files), so deletes whose only copy would go must reach
    the companion table first. `clock`: the batch's commit operation's: the storing, the
    catalog calls and file reads inside it wait within its one budget."""
    try:
        stored = store_tombstones(catalog, identifier, clock=clock)
    except Exception as exc:
        raise TombstonesNotDurable(
            f"the deletes of {identifier} cannot be stored in its tombstone table {companion_identifier(identifier)} "
            f"({type(exc).__name__}: {first_line(exc)}); a sequenced batch does not commit while its deletes cannot be made durable "
            "(a deleted key could come back once their snapshots expire). Repair the tombstone table: python -m "
            f"lakesink_datasource.maintain repair-tombstones {identifier} ... (nothing of this batch was committed)"
        ) from exc
    if stored:
        log.info("lakesink: stored %d tombstone(s) of %s in %s", stored, identifier, companion_identifier(identifier))


def store_tombstones_safely(catalog: Catalog, identifier: str, table: Table | None = None, clock: RetryClock | None = None) -> None:
    """After a batch's commit: `store_tombstones`, logging instead of raising (the batch
    landed; its snapshot names its tombstones, kept from lakesink's expiry until stored,
    and the next batch does not commit before they are)."""
    try:
        stored = store_tombstones(catalog, identifier, table, clock=clock)
        if stored:
            log.info("lakesink: stored %d tombstone(s) of %s in %s", stored, identifier, companion_identifier(identifier))
    except Exception:
        log.warning("lakesink: could not store the tombstones of %s; the next commit retries", identifier, exc_info=True)
