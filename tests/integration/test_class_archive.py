"""The class archive docs/deploy.md recommends for a driver's start is mapped by the drivers
started with it: the test session's own, which tests/conftest.py starts with the recipe's
`SPARK_SUBMIT_OPTS`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from project_scripts import class_archive


def test_a_driver_started_with_the_recipe_maps_the_class_archive(spark) -> None:  # type: ignore[no-untyped-def]
    archive = class_archive.ARCHIVE
    if not archive.exists():
        if os.environ.get("LAKESINK_TEST_REQUIRE_SERVERS") or os.environ.get("CI"):
            pytest.fail(f"no {archive}: scripts/setup.sh builds it (scripts/spark_class_archive.py)")
        pytest.skip("no class archive: ./scripts/setup.sh builds it")
    assert os.environ.get("SPARK_SUBMIT_OPTS", "").startswith(class_archive.use_options(archive))
    pid = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getPid()
    maps = Path(f"/proc/{pid}/maps").read_text()
    # Mapped means used: a JVM that rejects the archive (another JVM, another class path)
    # unmaps it and loads every class from the jars.
    assert str(archive) in maps
