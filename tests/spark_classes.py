"""scripts/spark_class_archive.py as a module: the archive's path and the driver options that
map it, for tests/conftest.py (which hands them to every driver) and the test that checks it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("spark_class_archive", Path(__file__).parents[1] / "scripts" / "spark_class_archive.py")
assert _spec is not None and _spec.loader is not None
class_archive = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(class_archive)
