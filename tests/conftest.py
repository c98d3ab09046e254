"""One SparkSession for the whole test session, plus per-test warehouses."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import hypothesis_profiles  # noqa: F401  (registers the dev, ci and deep profiles)
import pytest
from hypothesis import settings

# Spark's Python workers must run this interpreter (the venv with pyarrow, lmdb, ...),
# and the fault-injection file must be known before the JVM and its workers start.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

# `--hypothesis-profile=NAME` (read by hypothesis' plugin after this) overrides the default.
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def faults_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults") / "faults.json"
    os.environ["LAKESINK_FAULTS"] = str(path)
    return path


@pytest.fixture
def arm_fault(faults_file: Path) -> Iterator:
    """Arm fault rules for one test; always disarmed afterwards."""

    def arm(*rules: dict) -> None:
        faults_file.write_text(json.dumps(list(rules)))

    yield arm
    faults_file.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def spark(faults_file: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    from lakesink_datasource import LakeSinkDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("lakesink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={tmp_path_factory.mktemp('derby')}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LakeSinkDataSource)
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


@pytest.fixture
def postgres_uri() -> str:
    """The PostgreSQL server `.ci/run` starts (LAKESINK_TEST_POSTGRES_URI). Outside CI a test
    needing it is skipped without one; in CI (CI=true) a missing server is a failure, so such
    a test can never silently not run there."""
    uri = os.environ.get("LAKESINK_TEST_POSTGRES_URI")
    if not uri:
        if os.environ.get("CI"):
            pytest.fail("LAKESINK_TEST_POSTGRES_URI is not set in CI: .ci/run should have started PostgreSQL")
        pytest.skip("no PostgreSQL server (set LAKESINK_TEST_POSTGRES_URI)")
    return uri
