"""Publish a branch: fast-forward main to it (the last step of write-audit-publish).

    python -m lakesink_datasource.publish db.events --branch audit --warehouse /data/wh

A write with option `branch` commits to that branch and leaves main as it was; readers audit
the branch (pyiceberg `table.scan(snapshot_id=table.snapshot_by_name("audit").snapshot_id)`,
DuckDB `iceberg_scan(..., snapshot_from_id => ...)`), then this moves main to the branch's
head in one catalog commit, Iceberg Java's `fast_forward` procedure. Only a fast-forward: main's
current snapshot must be an ancestor of the branch's head, otherwise main has commits the
branch lacks and moving it would drop them (write the branch again on top of main, or merge
by hand). The branch itself is kept.

The Python API is `publish_branch(table, branch)`, returning main's new snapshot id.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import AssertRefSnapshotId, SetSnapshotRefUpdate

from lakesink_datasource.catalog import sql_commit
from lakesink_datasource.catalog.table_args import add_table_arguments, check_table_arguments, open_table_or_report
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.history import ancestors


class PublishError(LakesinkError, ValueError):
    """The branch cannot be published: missing, a tag, or not ahead of main."""


def publish_branch(table: Table, branch: str) -> int:
    metadata = table.metadata
    ref = metadata.refs.get(branch)
    if branch == "main":
        raise PublishError("branch 'main' is what gets published to; name the branch to publish")
    if ref is None:
        raise PublishError(f"table {'.'.join(table.name())} has no branch {branch!r} (branches: {_names(table)})")
    if ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise PublishError(f"{branch!r} is a tag, not a branch")
    main = metadata.current_snapshot()
    if main is not None and main.snapshot_id == ref.snapshot_id:
        return main.snapshot_id  # already published
    if main is not None and all(s.snapshot_id != main.snapshot_id for s in ancestors(metadata, ref.snapshot_id)):
        raise PublishError(
            f"main (snapshot {main.snapshot_id}) has commits branch {branch!r} does not: a fast-forward would drop them. "
            "Write the branch's changes again on top of main, or publish a branch created after main's last commit"
        )
    sql_commit.commit(
        table,
        requirements=(AssertRefSnapshotId(ref="main", snapshot_id=main.snapshot_id if main else None),),
        updates=(
            SetSnapshotRefUpdate(
                ref_name="main", type=SnapshotRefType.BRANCH, snapshot_id=ref.snapshot_id,
                max_ref_age_ms=None, max_snapshot_age_ms=None, min_snapshots_to_keep=None,
            ),
        ),
    )
    return ref.snapshot_id


def _names(table: Table) -> str:
    names = sorted(n for n, r in table.metadata.refs.items() if r.snapshot_ref_type == SnapshotRefType.BRANCH)
    return ", ".join(names) or "none"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lakesink_datasource.publish", description=__doc__.split("\n\n")[0])
    add_table_arguments(parser)
    parser.add_argument("--branch", required=True, help="the branch whose head main moves to")
    args = parser.parse_args(argv)
    check_table_arguments(parser, args)
    table = open_table_or_report(args)
    if table is None:
        return 2
    try:
        snapshot_id = publish_branch(table, args.branch)
    except PublishError as exc:
        print(f"cannot publish: {exc}", file=sys.stderr)
        return 1
    print(f"main of {args.table} is now snapshot {snapshot_id} (the head of branch {args.branch!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
