"""The package's import graph points downward only: a format floor at the bottom, the Spark
face at the top. A package may import its own modules and anything in a lower layer; an
import of a sibling or of a higher layer (which is what every import cycle needs) fails."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lakesink_datasource

ROOT = Path(lakesink_datasource.__file__).parent

# Lowest first. Each name is a top-level package or module of lakesink_datasource.
LAYERS: list[set[str]] = [
    {"errors", "version", "deferred_imports"},  # the base of lakesink's errors, which every layer raises; lakesink's version; imports at first use
    {"iceberg", "faults", "worker_gc", "arrays", "spark_version", "spark_lookup"},  # the Iceberg format floor, plain values, the PySpark found
    {"options", "messages"},  # write options; executor -> driver messages, known to both sides
    {"catalog", "schema"},
    {"io", "index"},  # storage: Parquet writing, the key index
    {"compaction", "debezium"},  # which files to merge and how (planned with a write, run in its tasks); Debezium records -> tables' rows
    {"table"},  # table state: planning, metadata cache, idempotency
    {"write", "commit", "read"},  # the task side, the commit side, the read side
    {"maintenance", "routing"},  # after a commit; one write routed to many tables (each written and committed as one)
    {"progress"},  # what the driver prints per batch
    {"key_clustering"},  # cluster_by_key: clusters keyed writes by key shard (the sink commits what it wrote)
    {"spark_rows", "foreach_batch"},  # PySpark 4.0's stream sinks: Rows into Arrow; foreachBatch exactly once
    {"check", "duckdb_reader", "maintain", "locate", "publish", "clustering", "datasource", "worker_daemon", "preload"},  # tools and the Spark face
    {"cli"},  # the `lakesink` command: the tools under one name
    {"__init__"},  # the package's public names
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def _unit(module: str) -> str:
    """`lakesink_datasource.x.y` -> `x`; the package itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    """Every lakesink module imported anywhere in `path` (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "lakesink_datasource":
                # `from lakesink_datasource import x`: x may be a subpackage or a name of __init__.
                found |= {f"lakesink_datasource.{a.name}" if (ROOT / a.name).exists() or (ROOT / f"{a.name}.py").exists()
                          else "lakesink_datasource" for a in node.names}
            elif node.module.startswith("lakesink_datasource."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lakesink_datasource")}
    return found


def _sources() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append(("lakesink_datasource" + "".join(f".{p}" for p in parts), path))
    return out


def test_every_unit_has_a_layer() -> None:
    units = {_unit(module) for module, _ in _sources()}
    assert units <= set(LAYER_OF), f"give these a layer in LAYERS: {sorted(units - set(LAYER_OF))}"


@pytest.mark.parametrize(("module", "path"), _sources(), ids=[m for m, _ in _sources()])
def test_imports_point_downward(module: str, path: Path) -> None:
    here = _unit(module)
    wrong = sorted(
        target for target in _imports(path)
        if _unit(target) != here and LAYER_OF.get(_unit(target), len(LAYERS)) >= LAYER_OF[here]
    )
    assert not wrong, f"{module} (layer {LAYER_OF[here]}: {here}) imports upward or sideways: {wrong}"


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    # The rule itself must be able to fail: a floor module importing the commit side.
    bad = tmp_path / "bad.py"
    bad.write_text("from lakesink_datasource.commit.committer import commit_write\n")
    targets = _imports(bad)
    assert targets == {"lakesink_datasource.commit.committer"}
    assert LAYER_OF[_unit(next(iter(targets)))] > LAYER_OF["iceberg"]


def test_the_architecture_page_lists_these_layers() -> None:
    """docs/architecture.md's layer table names the same packages, layer by layer."""
    page = (ROOT.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", page, flags=re.MULTILINE)
    documented = [(int(n), set(re.findall(r"`([a-z_]+)`", names))) for n, names in rows]
    assert documented == list(enumerate(LAYERS)), "make docs/architecture.md's layer table match LAYERS"
