"""No commit path deletes a file on the strength of an exception alone (issue 60).

Once a commit request was sent, only the catalog's refusal proves that it did not apply;
after any other error the table must be read before the commit's files may go (Iceberg
Java's CommitStateUnknownException rule). This reads the package's source, as the sleep
scan of test_retry_policy.py does: every `except` around a commit request that deletes
files either catches only a refusal, or reads the table (or asks `not_applied`) before its
first deletion.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lakesink_datasource

ROOT = Path(lakesink_datasource.__file__).parent

# Calls that send a commit request to a catalog.
COMMITS = {"swap_in", "swap_settled", "commit_table", "swap_together", "commit", "swap", "_commit_rest", "send"}
# Calls that delete files (directly, or through a commit's cleanup).
DELETES = {"delete", "delete_files", "cleanup", "forget", "delete_outputs", "_discard", "expire", "gave_up"}
# Calls that settle the outcome before a deletion: the table read back, or the refusal proven.
SETTLES = {"read_back", "_settle", "load_table", "not_applied", "_landed_attempt"}
# Exceptions that are the catalog's answer that nothing applied (or raised before any request).
REFUSALS = {"CommitFailedException", "ConflictError", "TransactionAborted"}


def _name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _calls(nodes: list[ast.stmt]) -> list[ast.Call]:
    found = [n for node in nodes for n in ast.walk(node) if isinstance(n, ast.Call)]
    return sorted(found, key=lambda c: (c.lineno, c.col_offset))


def _caught(handler: ast.ExceptHandler) -> set[str]:
    if handler.type is None:
        return {"BaseException"}
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", "?") for t in types}


def _commit_handlers() -> list[tuple[str, ast.ExceptHandler]]:
    """Every `except` of a `try` whose body sends a commit request, with where it is."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Try) and any(_name(c) in COMMITS for c in _calls(node.body)):
                out += [(f"{path.relative_to(ROOT)}:{h.lineno}", h) for h in node.handlers]
    return out


def test_the_scan_sees_the_commit_paths() -> None:
    where = {place.split(":")[0] for place, _ in _commit_handlers()}
    # The one commit loop every commit runs in (a scan that found no commit request would
    # pass on anything).
    assert "catalog/commit_loop.py" in where


def test_no_file_is_deleted_after_a_commit_error_before_the_table_is_read() -> None:
    wrong = []
    for place, handler in _commit_handlers():
        if _caught(handler) <= REFUSALS:
            continue
        for call in _calls(handler.body):
            name = _name(call)
            if name in SETTLES:
                break  # settled first: what follows may delete
            if name in DELETES:
                wrong.append(f"{place}: {name}() after {sorted(_caught(handler))} without reading the table first")
                break
    assert not wrong, "\n".join(wrong)
