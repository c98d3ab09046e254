"""`maintenance=background`: a stream's compaction runs beside its next micro-batch.

With `maintenance=auto` a batch's compaction runs in the commit, so Spark starts the next
micro-batch only once it is done: for large batches that is most of the time a stream spends
above the floor of a Python sink (benchmarks/STREAM-APPEND.md). Here the commit starts the
compaction in a thread of the driver's commit process and returns; Spark plans and runs the
next batch's tasks meanwhile (other processes), and the next commit of the table waits for
the compaction first. So the snapshots stay in the same order as with `auto` (a batch's
compaction lands before the next batch, on exactly the state it read) and nothing races.

The order is kept by a lock file per table on the driver's host, held from the moment the
commit decides to compact until the compaction is done: any lakesink commit of the table on
that host (this stream's next batch in whatever commit process Spark picks, a batch write in
the same application) takes the lock first. The operating system releases it if the process
dies; a compaction killed half-way leaves files no snapshot references, which orphan removal
collects, as after a killed `auto` compaction. A batch write (no next batch) compacts in its
commit, as with `auto`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lakesink_datasource.catalog.loader import CatalogConfig, catalog_config
from lakesink_datasource.maintenance.compaction import CompactionResult
from lakesink_datasource.options import parse_options

log = logging.getLogger("lakesink")

LOCK_DIR = Path(tempfile.gettempdir()) / "lakesink-maintenance"


def lock_path(catalog: CatalogConfig, identifier: str) -> Path:
    """The host's lock file of one table (of one catalog): the same for every process."""
    key = json.dumps([catalog.name, sorted(catalog.properties.items()), identifier])
    return LOCK_DIR / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"


def _acquire(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "ab")  # noqa: SIM115 - held past this function (by the compaction thread)
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # flock: one holder per open file, even in one process
    return handle


@contextmanager
def table_turn(catalog: CatalogConfig, identifier: str) -> Iterator[Callable[[Callable[[], None]], None]]:
    """Wait for the table's background compaction on this host, then hold the table until the
    block ends, or, if the block hands work to the yielded function, until that work ends
    in a thread of its own."""
    handle = _acquire(lock_path(catalog, identifier))
    handed_over = False

    def run_in_background(work: Callable[[], None]) -> None:
        nonlocal handed_over

        def run() -> None:
            try:
                work()
            except Exception:  # compaction never fails a stream; the next batch tries again
                log.warning("lakesink: background maintenance of %s failed", identifier, exc_info=True)
            finally:
                handle.close()

        handed_over = True
        threading.Thread(target=run, name=f"lakesink-maintenance-{identifier}", daemon=True).start()

    try:
        yield run_in_background
    finally:
        if not handed_over:
            handle.close()


def wait_for_maintenance(catalog: CatalogConfig, identifier: str) -> None:
    """Return once no background compaction of the table runs on this host."""
    _acquire(lock_path(catalog, identifier)).close()


def wait_for_table(options: Mapping[str, str]) -> None:
    """`wait_for_maintenance` for a table named as a write names it (the same options): what a
    job that reads or maintains the table right after its stream ended calls first."""
    target = parse_options(dict(options))
    wait_for_maintenance(catalog_config(target), target.table)


def report_background(table: str, batch_id: int | None, result: CompactionResult | None, progress: bool) -> None:
    if result is None or result.snapshot_id is None or not progress:
        return
    print(
        f"lakesink {table} after batch {batch_id}: compacted {result.files_rewritten + result.files_dropped} files into "
        f"{result.files_written} ({result.seconds:.2f} s, beside the next batch)",
        file=sys.stderr, flush=True,
    )



