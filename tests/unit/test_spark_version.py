"""lakesink refuses, at import, a PySpark minor its CI does not test, naming what it found;
the declared range (setup.cfg), the checked minors and CI's minors are one list."""

from __future__ import annotations

import configparser
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.spark_version import SUPPORTED_MINORS, UnsupportedSparkError, check_pyspark, pyspark_version

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("found", ["3.5.9", "4.4.0", "5.0.0"])
def test_an_untested_pyspark_is_refused_naming_it_and_what_to_install(found: str) -> None:
    with pytest.raises(UnsupportedSparkError, match=rf"this Python has PySpark {found}\. .*pip install 'pyspark>=4\.0,<4\.4'") as refused:
        check_pyspark(found)
    assert isinstance(refused.value, LakesinkError) and isinstance(refused.value, ImportError)


@pytest.mark.parametrize("found", ["4.0.5", "4.1.4", "4.2.1", "4.3.0"])
def test_every_tested_minor_is_taken(found: str) -> None:
    check_pyspark(found)


def test_the_version_lakesink_checks_is_the_installed_distributions() -> None:
    """lakesink reads the version from the module (workers may have no package metadata); it
    must be the one pip installed, or the import check would judge another PySpark."""
    assert pyspark_version() == importlib.metadata.version("pyspark")


def test_importing_lakesink_under_an_untested_pyspark_fails_naming_it() -> None:
    """The import itself runs the check on the installed version: a PySpark reporting 4.4.0
    (set before lakesink is imported) makes `import lakesink_datasource` fail."""
    code = "import pyspark.version as v; v.__version__ = '4.4.0'; import lakesink_datasource"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0
    assert "UnsupportedSparkError" in done.stderr and "this Python has PySpark 4.4.0" in done.stderr


def test_setup_cfg_and_ci_name_the_same_minors() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requires = [line.strip() for line in config["options"]["install_requires"].splitlines()]
    low, high = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
    assert f"pyspark>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}" in requires
    listed = subprocess.run([str(ROOT / "scripts" / "spark_minors.sh")], capture_output=True, text=True, check=True).stdout.split()
    assert listed == [f"{a}.{b}" for a, b in SUPPORTED_MINORS]


def test_an_explicit_register_replaces_the_source_found_by_name_from_pyspark_4_1() -> None:
    from lakesink_datasource.spark_version import register_replaces_found

    # PySpark 4.0 refuses it (DATA_SOURCE_ALREADY_EXISTS): there lakesink is used unregistered.
    assert [register_replaces_found(v) for v in ("4.0.5", "4.1.0", "4.2.1", "4.3.0")] == [False, True, True, True]
