"""Table maintenance for batch users and operators: the same steps a stream runs by itself.

    python -m lakesink_datasource.maintain compact        db.events --warehouse /data/wh
    python -m lakesink_datasource.maintain expire         db.events --warehouse /data/wh
    python -m lakesink_datasource.maintain remove-orphans db.events --warehouse /data/wh --dry-run
    python -m lakesink_datasource.maintain all            db.events --catalog prod
    python -m lakesink_datasource.maintain register       db.events --warehouse /data/wh
    python -m lakesink_datasource.maintain repair-tombstones db.events --warehouse /data/wh

`compact` merges every partition's small files (not only a budget's worth, as a stream
does) and drops fully deleted ones, row lineage kept; `expire` follows the table's
`history.expire.*` properties (or `--older-than-hours`); `remove-orphans` deletes files no
snapshot references that are older than the safety age (default: the table's
`lakesink.maintenance.orphan-min-age-ms`, 3 days). `all` runs the three in that order.
`--dry-run` reports what would happen and changes nothing. `register` puts a table its
catalog lost (and its companion table of tombstones) back into the catalog, from the
newest metadata file at its location (`--location`, `--metadata` to choose).
`repair-tombstones` rebuilds a keyed table's companion table of tombstones that cannot be
read from what can (`--accept-loss` when some deletes cannot be recovered).

The Python API is `maintain_table(table, action, ...)`, returning the same report.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table

from lakesink_datasource.catalog import loader
from lakesink_datasource.catalog.table_args import (
    add_table_arguments,
    catalog_config_from_arguments,
    check_table_arguments,
    open_table_or_report,
)
from lakesink_datasource.iceberg.gc import GcDisabled, refuse_deleting
from lakesink_datasource.iceberg.properties import TableSettings
from lakesink_datasource.maintenance.compaction import CompactionResult, compact, plan_for
from lakesink_datasource.maintenance.expire import ExpiryResult, expire_snapshots
from lakesink_datasource.maintenance.orphans import LocationShared, OrphanScan, remove_orphans
from lakesink_datasource.maintenance.register import RegisterError, register
from lakesink_datasource.maintenance.tombstone_repair import RepairRefused, repair_tombstones
from lakesink_datasource.maintenance.tombstone_storing import store_tombstones
from lakesink_datasource.table.tombstone_table import companion_identifier

ACTIONS = ("compact", "expire", "remove-orphans", "all")
COMMANDS = (*ACTIONS, "register", "repair-tombstones")
UNLIMITED = 1 << 62


@dataclass
class MaintenanceReport:
    dry_run: bool
    compaction: CompactionResult | None = None
    expiry: ExpiryResult | None = None
    orphans: OrphanScan | None = None
    lines: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return "\n".join(self.lines)


class _ProgressBar:
    """A one-line progress bar on a terminal; silent when output is not one."""

    def __init__(self, label: str, total: int, unit: str, out: TextIO | None) -> None:
        self._label, self._total, self._unit, self._out = label, max(total, 1), unit, out
        self._done = 0
        self._shown = 0.0

    def advance(self, amount: int) -> None:
        self._done += amount
        now = time.monotonic()
        if self._out is not None and (now - self._shown > 0.2 or self._done >= self._total):
            self._shown = now
            width = 30
            filled = min(width, int(width * self._done / self._total))
            self._out.write(f"\r{self._label} [{'#' * filled}{'.' * (width - filled)}] {self._done:,}/{self._total:,} {self._unit}")
            self._out.flush()

    def finish(self) -> None:
        if self._out is not None and self._done:
            self._out.write("\n")


def maintain_table(
    table: Table,
    action: str,
    *,
    dry_run: bool = False,
    target_file_size: int | None = None,
    older_than_ms: int | None = None,
    orphan_min_age_ms: int | None = None,
    progress_to: TextIO | None = None,
) -> MaintenanceReport:
    """Run one maintenance action (`compact`, `expire`, `remove-orphans` or `all`)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
    if action != "compact":
        # Before compacting too: `all` on such a table does nothing rather than half of it.
        refuse_deleting(table.metadata.properties, ".".join(table.name()), "expire snapshots or remove orphan files"
                        if action == "all" else ("expire snapshots" if action == "expire" else "remove orphan files"))
    report = MaintenanceReport(dry_run)
    bar: Callable[[str, int, str], _ProgressBar] = lambda label, total, unit: _ProgressBar(label, total, unit, progress_to)  # noqa: E731
    if action in ("compact", "all"):
        plan, _ = plan_for(table, UNLIMITED, target_file_size, tiered=False)
        progress = bar("compact", sum(g.bytes for g in plan.groups), "bytes")
        report.compaction = compact(
            table, budget_bytes=UNLIMITED, target_file_size=target_file_size, dry_run=dry_run, tiered=False,
            progress=progress.advance,
        )
        progress.finish()
        table = table.refresh()
        report.lines.append(f"compaction: {report.compaction.describe()}" if report.compaction.skipped_reason != "nothing to compact"
                            else "compaction: nothing to compact")
    if action in ("expire", "all"):
        if not dry_run:
            # A keyed table's deletes go to its companion table before their snapshots expire.
            name = ".".join(table.name())
            try:
                stored = store_tombstones(table.catalog, name)
            except Exception as exc:  # noqa: BLE001 - reported; expiry then keeps the snapshots naming them
                report.lines.append(
                    f"tombstones: cannot be stored in {companion_identifier(name)} ({type(exc).__name__}: {exc}); the snapshots "
                    f"naming them are kept. Repair: python -m lakesink_datasource.maintain repair-tombstones {name} ..."
                )
            else:
                if stored:
                    report.lines.append(f"tombstones: stored {stored} in {companion_identifier(name)}")
        report.expiry = expire_snapshots(table, max_age_ms=older_than_ms, dry_run=dry_run)
        table = table.refresh()
        report.lines.append(f"expiry: {report.expiry.describe(dry_run)}")
    if action in ("remove-orphans", "all"):
        age = TableSettings.of_table(table.metadata).orphan_min_age_ms if orphan_min_age_ms is None else orphan_min_age_ms
        progress = bar("scan", 0, "files")
        report.orphans = remove_orphans(table, min_age_ms=age, dry_run=dry_run, progress=progress.advance)
        progress.finish()
        report.lines.append(f"orphans: {report.orphans.describe(dry_run)}")
    return report


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lakesink_datasource.maintain",
        description="Compact small files, expire snapshots, remove orphan files of a table lakesink writes.",
    )
    parser.add_argument("action", choices=COMMANDS)
    add_table_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    parser.add_argument("--target-file-size", type=int, metavar="BYTES", help="compaction's output size (default: the table's)")
    parser.add_argument("--older-than-hours", type=float, help="expire snapshots older than this (default: the table's history.expire.*)")
    parser.add_argument("--orphan-min-age-hours", type=float, help="only remove orphans older than this (default: 72)")
    parser.add_argument("--location", help="register: the table's location (default: where the catalog puts it)")
    parser.add_argument("--metadata", help="register: the metadata file to register (default: the newest at the location)")
    parser.add_argument("--accept-loss", action="store_true",
                        help="repair-tombstones: rebuild even though some tombstones cannot be read (those deletes are forgotten)")
    args = parser.parse_args(argv)
    check_table_arguments(parser, args)
    if args.target_file_size is not None and args.target_file_size <= 0:
        parser.error(f"--target-file-size must be positive, got {args.target_file_size}")
    for name in ("older_than_hours", "orphan_min_age_hours"):
        value = getattr(args, name)
        if value is not None and value < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more, got {value}")
    if args.action != "register" and (args.location or args.metadata):
        parser.error("--location and --metadata apply to register")
    if args.action != "repair-tombstones" and args.accept_loss:
        parser.error("--accept-loss applies to repair-tombstones")
    return args


def _warn_about_zero_ages(args: argparse.Namespace) -> None:
    if args.orphan_min_age_hours == 0 and args.action in ("remove-orphans", "all") and not args.dry_run:
        print(
            "note: --orphan-min-age-hours 0 also removes the files of writes still in flight (not committed yet), "
            "which then fail: run it only while nothing writes to the table", file=sys.stderr,
        )
    if args.older_than_hours == 0 and args.action in ("expire", "all") and not args.dry_run:
        print(
            "note: --older-than-hours 0 expires every snapshot but the newest (and history.expire.min-snapshots-to-keep): "
            "time travel and incremental reads to them end", file=sys.stderr,
        )


def _register(args: argparse.Namespace) -> int:
    config = catalog_config_from_arguments(args)
    # Explicitly asked for: an embedded catalog that is missing is created here.
    if config.name == loader.EMBEDDED_CATALOG_NAME:
        os.makedirs(config.properties["warehouse"].removeprefix("file://"), exist_ok=True)
    catalog = load_catalog(config.name, **config.properties)
    try:
        done = register(catalog, args.table, location=args.location, metadata=args.metadata)
    except RegisterError as exc:
        print(f"cannot register {args.table}: {exc}", file=sys.stderr)
        return 2
    for item in done:
        print(f"registered {item.identifier} from {item.metadata_location}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.action == "register":
        return _register(args)
    _warn_about_zero_ages(args)
    table = open_table_or_report(args)
    if table is None:
        return 2
    if args.action == "repair-tombstones":
        try:
            repaired = repair_tombstones(table.catalog, args.table, accept_loss=args.accept_loss)
        except RepairRefused as exc:
            print(f"{args.table}: not repaired: {exc}", file=sys.stderr)
            return 1
        print(f"{args.table}: {repaired.describe()}")
        return 0
    hours = 3600 * 1000
    try:
        report = maintain_table(
            table,
            args.action,
            dry_run=args.dry_run,
            target_file_size=args.target_file_size,
            older_than_ms=None if args.older_than_hours is None else int(args.older_than_hours * hours),
            orphan_min_age_ms=None if args.orphan_min_age_hours is None else int(args.orphan_min_age_hours * hours),
            progress_to=sys.stderr if sys.stderr.isatty() else None,
        )
    except (LocationShared, GcDisabled) as exc:
        print(f"{args.table}: refused: {exc}", file=sys.stderr)
        return 2
    print(f"{args.table}{' (dry run: nothing changed)' if args.dry_run else ''}")
    print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
