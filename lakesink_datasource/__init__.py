"""lakesink: exactly-once streaming, batch and SQL writes from PySpark into Apache Iceberg v3."""

from __future__ import annotations

from typing import Any

import pyiceberg as _pyiceberg

from lakesink_datasource import deferred_imports as _deferred_imports
from lakesink_datasource import spark_version as _spark_version
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.version import PINNED_PYICEBERG_VERSION, __version__

if _pyiceberg.__version__ != PINNED_PYICEBERG_VERSION:
    # Fail at import, not at the first commit, on an unvetted pyiceberg. Only then is the
    # compat layer imported here (it raises, naming the version to install): it pulls in
    # pyiceberg's table model, which every Python worker Spark starts would pay for.
    from lakesink_datasource.iceberg import compat as _compat  # noqa: F401
_spark_version.check_pyspark()  # and on a PySpark minor lakesink was not tested on
_deferred_imports.defer_heavy_modules()  # pandas only where a scan needs it

__all__ = ["LakeSinkDataSource", "LakesinkError", "__version__", "batch_sink", "cluster_by_key", "cluster_by_partition"]


def __getattr__(name: str) -> Any:
    # Lazy: executors importing submodules need not import pyspark.sql.datasource eagerly.
    if name == "LakeSinkDataSource":
        from lakesink_datasource.datasource import LakeSinkDataSource

        return LakeSinkDataSource
    if name == "cluster_by_partition":
        from lakesink_datasource.clustering import cluster_by_partition

        return cluster_by_partition
    if name == "batch_sink":
        from lakesink_datasource.foreach_batch import batch_sink

        return batch_sink
    if name == "cluster_by_key":
        from lakesink_datasource.key_clustering import cluster_by_key

        return cluster_by_key
    raise AttributeError(name)
