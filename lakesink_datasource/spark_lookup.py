"""Whether Spark's lookup of Python data sources can see `pyspark_lakesink` in this Python.

Spark finds `format("lakesink")` by listing the top-level modules on `sys.path` whose names
start with `pyspark_` (`pkgutil.iter_modules`, in pyspark's lookup worker). setuptools'
default editable install (`pip install -e .`) serves the project's packages through an
import hook instead of a `sys.path` entry: `import pyspark_lakesink` works, but the listing
does not show it, and Spark says the data source is not found. Its `compat` mode (a path
entry) is seen.
"""

from __future__ import annotations

import importlib.util
import pkgutil

MODULE = "pyspark_lakesink"


def lookup_problem() -> str | None:
    """Why Spark's lookup will not find lakesink here, and what to run; None when it will.
    Lists every module on `sys.path` (tens of milliseconds): for error paths and checks."""
    if any(info.name == MODULE for info in pkgutil.iter_modules()):
        return None
    if importlib.util.find_spec(MODULE) is None:
        return f"{MODULE} is not installed in this Python: pip install lakesink-datasource"
    return (
        f"{MODULE} imports here, but Spark's lookup of data sources (pkgutil.iter_modules) cannot see it: it comes from an "
        "editable install made through setuptools' import hook (pip install -e . in its default mode). Reinstall with "
        "pip install -e . --config-settings editable_mode=compat (scripts/setup.sh does), or register the source in the "
        "session: from lakesink_datasource import LakeSinkDataSource; spark.dataSource.register(LakeSinkDataSource)"
    )
