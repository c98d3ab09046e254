"""The PySpark minors lakesink supports: the ones its CI runs the suite on.

PySpark 4.1 lacks `pyspark.sql.streaming.datasource` (the streaming reader's admission
control), so importing lakesink failed there with a bare ModuleNotFoundError; other minors
were never tested. lakesink checks at import and names what it found and what to install,
on the driver and on every executor (a cluster's workers may run another PySpark than the
driver's machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakesink_datasource.errors import LakesinkError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

SUPPORTED_MINORS = ((4, 0), (4, 1), (4, 2), (4, 3))  # each tested in CI (scripts/spark_minors.sh); setup.cfg declares the range


class UnsupportedSparkError(LakesinkError, ImportError):
    """The PySpark installed is not one lakesink supports."""


def pyspark_version() -> str:
    """The installed PySpark's version, from the module (as on workers that take PySpark from
    SPARK_HOME's zip, without package metadata). Not from importlib.metadata: that scans
    every installed distribution, a few hundred milliseconds on every Python worker's start."""
    from pyspark.version import __version__

    return str(__version__)


def register_replaces_found(found: str | None = None) -> bool:
    """Whether `spark.dataSource.register(LakeSinkDataSource)` may replace the source Spark
    found by name (pyspark_lakesink): from PySpark 4.1 on (SPARK-51919). PySpark 4.0 refuses
    it, DATA_SOURCE_ALREADY_EXISTS, so there lakesink is used without registering."""
    found = found or pyspark_version()
    try:
        return tuple(int(part) for part in found.split(".")[:2]) >= (4, 1)
    except ValueError:
        return True  # a development build: a newer Spark


def check_pyspark(found: str | None = None) -> None:
    """Raise UnsupportedSparkError unless `found` (default: the installed PySpark) is a
    supported minor."""
    found = found or pyspark_version()
    try:
        minor = tuple(int(part) for part in found.split(".")[:2])
    except ValueError:
        return  # a development build with an unusual version string: let it be
    if minor in SUPPORTED_MINORS:
        return
    supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_MINORS)
    raise UnsupportedSparkError(
        f"lakesink supports PySpark {supported} (the versions its tests run on); this Python has PySpark {found}. "
        f"Install a supported one: pip install 'pyspark>={SUPPORTED_MINORS[0][0]}.{SUPPORTED_MINORS[0][1]},"
        f"<{SUPPORTED_MINORS[-1][0]}.{SUPPORTED_MINORS[-1][1] + 1}' (on a cluster, in the environment the executors run; "
        "see docs/deploy.md)"
    )


def to_arrow_schema(spark_schema: StructType) -> pa.Schema:
    """PySpark's `to_arrow_schema` with timestamps in UTC, on every supported minor: 4.2 and
    newer take `timezone="UTC"`, 4.0 and 4.1 `timestamp_utc=True`."""
    from pyspark.sql.pandas import types

    try:
        return types.to_arrow_schema(spark_schema, timezone="UTC")
    except TypeError:
        return types.to_arrow_schema(spark_schema, timestamp_utc=True)  # type: ignore[call-arg]
