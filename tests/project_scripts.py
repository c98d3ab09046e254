"""The project's scripts (scripts/*.py) as modules, for the tests that use or check them:
scripts/spark_class_archive.py's archive path and driver options (tests/conftest.py hands them
to every driver), scripts/compile_pyspark_zip.py's rebuild."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class_archive = _load("spark_class_archive")
compile_pyspark_zip = _load("compile_pyspark_zip")
