"""Modules imported when first used, not when a module that names them is imported.

`pyiceberg.io.pyarrow` imports `pyarrow.dataset` at its top and uses it only inside
functions (scans, reading delete files). `pyarrow.dataset` imports pandas: 0.3 s in every
planner and commit process of a write that never scans. Once lakesink is imported, importing
`pyarrow.dataset` gives a stand-in that imports the real module at its first attribute
access (under a lock: a batch commits its tables in threads) and hands the attribute over;
from then on `sys.modules` and `pyarrow.dataset` are the real module.

Python's `importlib.util.LazyLoader` does the same, but on Python 3.11 two threads touching
the module at once may both run it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

_lock = threading.RLock()
_DEFERRED = {"pyarrow.dataset"}
_loading: set[str] = set()


class _Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is asked for."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") and attribute.endswith("__"):
            # The import system asks for __loader__, __path__... while it sets the stand-in
            # up: not a use of the module.
            raise AttributeError(attribute)
        return getattr(_load(self.__name__), attribute)


def _load(name: str) -> types.ModuleType:
    with _lock:
        held = sys.modules.get(name)
        if held is not None and not isinstance(held, _Deferred):
            return held
        _loading.add(name)
        try:
            sys.modules.pop(name, None)
            module = importlib.import_module(name)  # the import system binds it on its package
        finally:
            _loading.discard(name)
        return module


class _StandIn(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Deferred(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _DEFERRED or name in _loading:
            return None
        return importlib.machinery.ModuleSpec(name, _StandIn())


def defer_heavy_modules() -> None:
    """From now on, `pyarrow.dataset` is imported at its first use (unless it already is)."""
    with _lock:
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
