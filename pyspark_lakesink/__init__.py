"""lakesink found by name: `format("lakesink")` and `USING lakesink` with no register call.

At the start of a session's first Python data source lookup, Spark imports every installed
top-level module whose name starts with `pyspark_` and registers its `DefaultSource` under
the source's `name()` (SPARK-45917; the static conf
`spark.sql.pyspark.dataSource.staticImport.enabled` switches it). This is lakesink's.

Spark imports it in every session that looks a Python source up, whether or not the session
uses lakesink, so it imports no more than the class: `lakesink_datasource.datasource` defers
pyarrow, msgspec and the rest to the methods Spark calls (tests/unit/test_discovery.py holds
it to that). `DefaultSource` *is* `LakeSinkDataSource`, so an explicit
`spark.dataSource.register(LakeSinkDataSource)` registers the same class again, harmlessly.

Spark's lookup imports every `pyspark_*` module in one go and fails whole on the first one
that raises: a lakesink that cannot load here (an unsupported PySpark, the wrong pyiceberg)
must not take the session's other Python sources down with it. Then `DefaultSource` is a
stand-in that raises lakesink's own error when the source is used.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

__all__ = ["DefaultSource"]

try:
    from lakesink_datasource.datasource import LakeSinkDataSource as DefaultSource
except Exception as _error:  # noqa: BLE001 - kept for the stand-in below; see the docstring
    _UNAVAILABLE = f"{type(_error).__name__}: {_error}"

    class DefaultSource(DataSource):  # type: ignore[no-redef]
        """lakesink could not be imported in this Python: every use says why."""

        @classmethod
        def name(cls) -> str:
            return "lakesink"

        def _unavailable(self) -> None:
            raise ImportError(f"the data source 'lakesink' is installed but cannot be loaded in this Python: {_UNAVAILABLE}")

        def schema(self) -> str:
            self._unavailable()
            return ""

        def reader(self, schema: object) -> None:  # type: ignore[override]
            self._unavailable()

        def writer(self, schema: object, overwrite: bool) -> None:  # type: ignore[override]
            self._unavailable()

        def streamWriter(self, schema: object, overwrite: bool) -> None:  # type: ignore[override]
            self._unavailable()

        def streamReader(self, schema: object) -> None:  # type: ignore[override]
            self._unavailable()
