"""lakesink found by name: `format("lakesink")` and `USING lakesink` with no register call.

At a session's first Python data source lookup, Spark imports every installed top-level
module whose name starts with `pyspark_` and registers its `DefaultSource` under the
source's `name()` (SPARK-45917, PySpark 4.0+; from 4.1 the static conf
`spark.sql.pyspark.dataSource.staticImport.enabled` switches it). This is lakesink's.

Spark imports it in every session that looks a Python source up, whether or not the session
uses lakesink, so it imports no more than the class: `lakesink_datasource.datasource` defers
pyarrow, msgspec and the rest to the methods Spark calls (tests/unit/test_pyspark_module.py
holds it to that). `DefaultSource` *is* `LakeSinkDataSource`: on PySpark 4.1+ an explicit
`spark.dataSource.register(LakeSinkDataSource)` replaces it with the same class. PySpark 4.0
refuses that register (DATA_SOURCE_ALREADY_EXISTS: a found source cannot be replaced
there); `LAKESINK_FIND_BY_NAME=0` in the driver's environment makes this module offer no
source, for code that must keep registering lakesink on 4.0.

Spark's lookup imports every `pyspark_*` module in one go and fails whole on the first one
that raises: a lakesink that cannot load here (its dependencies missing, an unsupported
PySpark) must not take the session's other Python sources down with it. Then
`DefaultSource` is a stand-in that says why when the source is used.
"""

from __future__ import annotations

import os

from pyspark.sql.datasource import DataSource

_unavailable = ""  # why lakesink could not be imported, for the stand-in


class Unavailable(DataSource):
    """lakesink could not be imported in this Python: every use says why."""

    @classmethod
    def name(cls) -> str:
        return "lakesink"

    def _fail(self) -> None:
        raise ImportError(f"the data source 'lakesink' is installed but cannot be loaded in this Python: {_unavailable}")

    def schema(self) -> str:
        self._fail()
        return ""

    def reader(self, schema: object) -> None:  # type: ignore[override]
        self._fail()

    def writer(self, schema: object, overwrite: bool) -> None:  # type: ignore[override]
        self._fail()

    def streamWriter(self, schema: object, overwrite: bool) -> None:  # type: ignore[override]
        self._fail()

    def streamReader(self, schema: object) -> None:  # type: ignore[override]
        self._fail()


def _load() -> type[DataSource]:
    global _unavailable
    try:
        from lakesink_datasource.datasource import LakeSinkDataSource
    except Exception as error:  # noqa: BLE001 - kept for the stand-in; see the docstring
        _unavailable = f"{type(error).__name__}: {error}"
        return Unavailable
    return LakeSinkDataSource


if os.environ.get("LAKESINK_FIND_BY_NAME", "1") != "0":  # "0": Spark finds nothing here
    DefaultSource = _load()
