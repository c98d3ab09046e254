"""`maintenance=auto`: the maintenance a batch's commit runs in the driver besides the snapshot.

Snapshot expiry and the bounded metadata log already travel inside the batch's own commit;
this adds the steps that cannot: landing the compaction the batch's tasks carried, right
before the batch's snapshot (`land_compaction`); after it, compaction where the tasks
carried none (`maintain_after_commit`: its own `replace` snapshot, within a budget per
batch) and, at most once per `lakesink.maintenance.orphan-interval-ms` per process,
orphan-file removal in a background thread. None may fail or stall the stream: errors are
logged and the batch commits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from pyiceberg.table import Table

from lakesink_datasource.catalog import loader, sql_commit
from lakesink_datasource.catalog.transient import catalog_call
from lakesink_datasource.compaction.budget import compaction_budget, compaction_min_files
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.iceberg.retry import RetryClock
from lakesink_datasource.maintenance.compaction import CompactionResult, compact, land_carried
from lakesink_datasource.maintenance.orphans import remove_orphans
from lakesink_datasource.messages import TaskResult
from lakesink_datasource.table.plan import WritePlan, retry_clock

log = logging.getLogger("lakesink")

_orphan_scans: dict[str, float] = {}  # table uuid -> monotonic time of this process's last scan
_orphan_lock = threading.Lock()


def carried_by_tasks(plan: WritePlan) -> bool:
    """Whether a write's compaction is carried by its tasks (table/setup.py plans it with the
    write; compaction/carried.py) rather than run here after its commit: `auto` on main,
    unless the write is routed (its tasks plan for themselves), an overwrite or evolves the
    table. Decided from the plan's kind, not its `compaction` field: a stream's commit may
    run on another planning call's plan than its tasks did."""
    return (
        plan.options.maintenance == "auto" and plan.options.branch is None and not plan.overwrite
        and not (plan.keyed is not None and plan.keyed.clustered)
        and plan.write_schema_json is None and plan.write_spec_id is None
    )


def land_compaction(
    plan: WritePlan, results: Sequence[TaskResult], batch_id: int | None, clock: RetryClock | None = None
) -> CompactionResult | None:
    """Land what the write's tasks compacted (before the batch's own snapshot). Never fails
    the batch: on any error the new files are left to orphan removal and the groups are
    planned again with a later write. `clock`: the batch's commit operation's."""
    if not any(r.compaction is not None for r in results):
        return None
    clock = clock if clock is not None else retry_clock(plan, f"committing batch {batch_id} to {plan.identifier}")
    try:
        table = _load(plan, clock)
        result = land_carried(table, results, batch_id, clock)
    except Exception:
        log.warning("lakesink: landing the compaction batch %s carried failed; the batch goes on", batch_id, exc_info=True)
        return None
    if result is not None and result.snapshot_id is None:
        log.info("lakesink: the compaction batch %s carried was not committed: %s", batch_id, result.describe())
    return result


def _load(plan: WritePlan, clock: RetryClock) -> Table:
    name = loader.describe(plan.catalog)
    catalog = catalog_call(clock, lambda: loader.load(plan.catalog), what="opening the catalog", catalog=name)
    return catalog_call(clock, lambda: sql_commit.load_table(catalog, plan.identifier), what=f"loading table {plan.identifier}", catalog=name)


def maintain_after_commit(
    plan: WritePlan, batch_bytes: int, batch_id: int | None, table: Table | None = None, batch_files: int = 0,
    clock: RetryClock | None = None,
) -> CompactionResult | None:
    """`table`: the table as the batch's commit left it (loaded from the catalog if not given);
    `batch_bytes`, `batch_files`: what the batch wrote; `clock`: the batch's commit
    operation's (maintenance may run in a thread of its own: its scope counts apart)."""
    if plan.options.maintenance == "off":
        return None
    clock = clock.scoped("maintenance") if clock is not None else retry_clock(plan, f"maintenance of {plan.identifier}")
    try:
        table = table or _load(plan, clock)
        settings = TableSettings.of_table(table.metadata)
        if carried_by_tasks(plan):
            _maybe_remove_orphans(table, settings)
            return None
        result = compact(
            table, budget_bytes=compaction_budget(settings, batch_bytes), batch_id=batch_id,
            min_files=compaction_min_files(settings, batch_files), clock=clock,
        )
        if result.snapshot_id is not None:
            log.info("lakesink: compaction after batch %s: %s in %.3f s", batch_id, result.describe(), result.seconds,
                     extra={"lakesink_event": {"event": "compaction", "batch": batch_id, "seconds": result.seconds,
                                               "snapshot_id": result.snapshot_id}})
        elif result.skipped_reason not in (None, "nothing to compact"):
            log.info("lakesink: compaction after batch %s skipped: %s", batch_id, result.describe())
        if result.snapshot_id is not None:
            # The scan must see the compaction's own files as referenced: from the table as
            # the compaction left it, not as the batch did.
            table = _load(plan, clock)
        _maybe_remove_orphans(table, settings)
        return result
    except Exception:
        log.warning("lakesink: maintenance after batch %s failed; the batch is committed, the next one retries", batch_id, exc_info=True)
        return None


def _maybe_remove_orphans(table: Table, settings: TableSettings) -> None:
    if not settings.gc_enabled:
        return  # the table's files may be another table's (iceberg/gc.py); the progress line said so
    uuid = str(table.metadata.table_uuid)
    now = time.monotonic()
    with _orphan_lock:
        last = _orphan_scans.get(uuid)
        if last is not None and now - last < settings.orphan_interval_ms / 1000:
            return
        _orphan_scans[uuid] = now

    def scan() -> None:
        try:
            found = remove_orphans(table, min_age_ms=settings.orphan_min_age_ms)
            if found.orphans:
                log.info("lakesink: %s", found.describe(dry_run=False))
        except Exception:
            log.warning("lakesink: orphan-file removal failed", exc_info=True)

    threading.Thread(target=scan, name="lakesink-orphans", daemon=True).start()
