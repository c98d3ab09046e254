"""scripts/compile_pyspark_zip.py (docs/deploy.md, "Spark's Python workers with compiled
pyspark"), on a small Spark home of its own: a worker importing from the rebuilt zip runs the
bytecode, and Spark's own zip stays recoverable."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from project_scripts import compile_pyspark_zip

SOURCES = {
    "pyspark/__init__.py": "WHICH = 'spark'\n",
    "pyspark/worker.py": "import pyspark\nROLE = 'worker of ' + pyspark.WHICH\n",
    "pyspark/broken.py": "def (:\n",  # a module this Python cannot compile
}


def _spark_home(root: Path, sources: dict[str, str]) -> Path:
    lib = root / "python" / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:
        for name, text in sources.items():
            z.writestr(name, text)
    return root


def _import_from(zip_path: Path, module: str, attribute: str) -> str:
    """What a fresh interpreter with only the zip on its path finds, as a Spark worker would."""
    code = f"import sys; sys.path.insert(0, {str(zip_path)!r}); import {module}; print({module}.{attribute})"
    return subprocess.run([sys.executable, "-S", "-B", "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def _with_sources_replaced(zip_path: Path, replaced: dict[str, str]) -> None:
    with zipfile.ZipFile(zip_path) as z:
        entries = {name: z.read(name) for name in z.namelist()}
    entries.update({name: text.encode() for name, text in replaced.items()})
    with zipfile.ZipFile(zip_path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


def test_a_worker_importing_from_the_rebuilt_zip_runs_its_bytecode(tmp_path: Path) -> None:
    home = _spark_home(tmp_path / "spark", SOURCES)
    zip_path = compile_pyspark_zip.rebuild(home)
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
    assert {"pyspark/__init__.py", "pyspark/__init__.pyc", "pyspark/worker.py", "pyspark/worker.pyc"} <= names
    assert "pyspark/broken.py" in names and "pyspark/broken.pyc" not in names  # left to its source
    # The bytecode is what runs: with the sources changed after the rebuild, the module still
    # says what it was compiled from (a zip whose .pyc were ignored would say 'edited').
    _with_sources_replaced(zip_path, {"pyspark/__init__.py": "WHICH = 'edited'\n"})
    assert _import_from(zip_path, "pyspark.worker", "ROLE") == "worker of spark"


def test_spark_s_own_zip_is_kept_and_a_rerun_or_an_upgrade_rebuilds_from_the_right_one(tmp_path: Path) -> None:
    home = _spark_home(tmp_path / "spark", SOURCES)
    original = (home / "python" / "lib" / "pyspark.zip").read_bytes()
    compile_pyspark_zip.rebuild(home)
    backup = home / "python" / "lib" / "pyspark.zip.orig"
    assert backup.read_bytes() == original
    compile_pyspark_zip.rebuild(home)  # a second run rebuilds from Spark's zip, not from its own
    assert backup.read_bytes() == original
    # A Spark upgrade puts a new zip of its own in place: that one becomes the source.
    upgraded = _spark_home(tmp_path / "spark", {**SOURCES, "pyspark/__init__.py": "WHICH = 'spark 2'\n"})
    zip_path = compile_pyspark_zip.rebuild(upgraded)
    assert _import_from(zip_path, "pyspark.worker", "ROLE") == "worker of spark 2"
    assert zipfile.ZipFile(backup).read("pyspark/__init__.py") == b"WHICH = 'spark 2'\n"
