"""The `lakesink` command (installed with the package): the operator tools under one name.

    lakesink maintain compact|expire|remove-orphans|all|repair-tombstones db.events --warehouse /data/wh
    lakesink register db.events --warehouse /data/wh          (= lakesink maintain register ...)
    lakesink check    db.events --warehouse /data/wh
    lakesink locate   db.events --warehouse /data/wh
    lakesink publish  db.events --branch audit --warehouse /data/wh

Each subcommand takes the arguments of its `python -m lakesink_datasource.<tool>` form and
exits with its status; `lakesink <subcommand> --help` lists them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _tools() -> dict[str, tuple[Callable[[Sequence[str]], int], str]]:
    # Imported on use: `lakesink --help` need not load pyiceberg and Spark's modules.
    from lakesink_datasource import check, locate, maintain, publish

    return {
        "maintain": (maintain.main, "compact, expire, remove orphans or repair tombstones of a table"),
        "register": (lambda argv: maintain.main(["register", *argv]), "put a table its catalog lost back into it"),
        "check": (check.main, "check a table's invariants (one live row per key, DVs, metadata)"),
        "locate": (lambda argv: locate.main(list(argv)), "print a table's current metadata file (for DuckDB and others)"),
        "publish": (publish.main, "fast-forward main to a branch's head"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    tools = _tools()
    if not args or args[0] in ("-h", "--help") or args[0] not in tools:
        lines = [f"  {name:<9} {summary}" for name, (_run, summary) in tools.items()]
        print("usage: lakesink <command> [arguments]\n\ncommands:\n" + "\n".join(lines), file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
        if args and args[0] not in ("-h", "--help"):
            print(f"\nlakesink: unknown command {args[0]!r}", file=sys.stderr)
            return 2
        return 0
    run, _summary = tools[args[0]]
    return run(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
