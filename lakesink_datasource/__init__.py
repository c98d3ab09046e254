"""lakesink: exactly-once streaming, batch and SQL writes from PySpark into Apache Iceberg v3."""

from lakesink_datasource.compat import pyiceberg_v3 as _pyiceberg_v3  # noqa: F401  (v3 metadata writes)

__version__ = "0.1.0"

__all__ = ["LakeSinkDataSource", "__version__"]


def __getattr__(name: str):  # lazy: executors importing submodules need not import pyspark.sql.datasource eagerly
    if name == "LakeSinkDataSource":
        from lakesink_datasource.datasource import LakeSinkDataSource

        return LakeSinkDataSource
    raise AttributeError(name)
