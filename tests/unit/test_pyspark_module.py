"""pyspark_lakesink, the module Spark imports at every session start to find `lakesink` by
name: it ships in the wheel and the sdist, imports light, is found by Spark's own lookup,
and a lakesink that cannot load there says why at use instead of breaking the lookup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pyspark
import pytest
from pyspark.sql.worker import lookup_data_sources

from lakesink_datasource.spark_lookup import lookup_problem

ROOT = Path(__file__).resolve().parents[2]
# What the lookup may not import: each is a cost every session would pay, used or not.
HEAVY = ("pyarrow", "msgspec", "pyiceberg.table", "pyiceberg.catalog", "lakesink_datasource.table", "lakesink_datasource.iceberg")


def _python(code: str, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                          env={**os.environ, **(env or {})})


def test_importing_the_module_gives_the_source_and_nothing_heavy() -> None:
    code = (
        "import json, sys; import pyspark.sql.datasource; import pyspark_lakesink; "
        "from lakesink_datasource import LakeSinkDataSource; "
        "print(json.dumps({'same': pyspark_lakesink.DefaultSource is LakeSinkDataSource, "
        "'name': pyspark_lakesink.DefaultSource.name(), 'modules': sorted(sys.modules)}))"
    )
    run = _python(code)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["same"] and seen["name"] == "lakesink"
    loaded = [m for m in seen["modules"] if any(m == h or m.startswith(f"{h}.") for h in HEAVY)]
    assert loaded == [], f"importing pyspark_lakesink pulled in {loaded}"


# PySpark 4.2 split the lookup from its socket protocol (`_main`); before, only Spark's runner
# can drive it (there the demo and test_found_by_name.py find lakesink through Spark itself).
needs_lookup_main = pytest.mark.skipif(
    not hasattr(lookup_data_sources, "_main"), reason="PySpark 4.0/4.1's lookup worker is driven by Spark's runner only"
)


def _lookup(sys_path: list[str], *flags: str, env: dict[str, str] | None = None) -> dict:
    """Run Spark's own lookup of `pyspark_*` modules (pyspark.sql.worker.lookup_data_sources,
    what a session's first Python source lookup runs) in a fresh Python with `sys_path`
    first, and use what it registered as a writer would."""
    code = f"""
import io, json, sys
sys.path[:0] = {sys_path!r}
from pyspark.serializers import UTF8Deserializer, read_int
from pyspark.sql.worker import lookup_data_sources
from pyspark.worker_util import pickleSer
out = io.BytesIO()
lookup_data_sources._main(io.BytesIO(), out)
found = io.BytesIO(out.getvalue())
sources = {{}}
for _ in range(read_int(found)):
    name = UTF8Deserializer().loads(found)
    sources[name] = pickleSer._read_with_length(found)
error = module = None
if "lakesink" in sources:
    module = sources["lakesink"].__module__
    try:
        sources["lakesink"](options={{}}).writer(None, False)
    except Exception as exc:
        error = f"{{type(exc).__name__}}: {{exc}}"
print(json.dumps({{"names": sorted(sources), "module": module, "error": error}}))
"""
    run = _python(code, *flags, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@needs_lookup_main
def test_spark_s_lookup_finds_lakesink() -> None:
    found = _lookup([])
    assert "lakesink" in found["names"], lookup_problem()
    assert found["module"] == "lakesink_datasource.datasource"
    assert "option 'table' is required" in found["error"]  # the real source, planning a write with no options


@needs_lookup_main
def test_lakesink_find_by_name_0_offers_no_source() -> None:
    # For PySpark 4.0 code that must keep registering lakesink (4.0 refuses a register of a
    # source Spark found by name).
    assert "lakesink" not in _lookup([], env={"LAKESINK_FIND_BY_NAME": "0"})["names"]


@needs_lookup_main
def test_a_lakesink_that_cannot_load_says_why_at_use_and_leaves_the_lookup_working(tmp_path: Path) -> None:
    # A Python with PySpark and lakesink but not lakesink's dependencies (lakesink installed
    # with --no-deps, as on an image whose packages came another way): no site-packages at all
    # (-S), only links to pyspark, py4j and lakesink's two packages.
    site = Path(pyspark.__file__).parent.parent
    for name, where in (("pyspark", site), ("py4j", site), ("lakesink_datasource", ROOT), ("pyspark_lakesink", ROOT)):
        os.symlink(where / name, tmp_path / name)
    found = _lookup([str(tmp_path)], "-S")
    assert found["names"] == ["lakesink"]
    assert found["module"] == "pyspark_lakesink"
    assert found["error"] == (
        "ImportError: the data source 'lakesink' is installed but cannot be loaded in this Python: "
        "ModuleNotFoundError: No module named 'pyiceberg'"
    )


@pytest.mark.slow
def test_the_wheel_and_the_sdist_ship_the_module(tmp_path: Path) -> None:
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stderr[-3000:]
    (built,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(built).namelist()
    assert "pyspark_lakesink/__init__.py" in names and "lakesink_datasource/datasource.py" in names
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert set(zipfile.ZipFile(built).read(top_level).decode().split()) == {"lakesink_datasource", "pyspark_lakesink"}

    sdist = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert sdist.returncode == 0, sdist.stderr[-3000:]
    with tarfile.open(tmp_path / sdist.stdout.strip().splitlines()[-1]) as archive:
        assert any(n.endswith("/pyspark_lakesink/__init__.py") for n in archive.getnames())



def test_an_install_spark_s_lookup_cannot_see_is_explained_with_what_to_run(tmp_path: Path) -> None:
    """setuptools' default editable install serves pyspark_lakesink through an import hook,
    not a sys.path entry: it imports, but Spark's lookup lists nothing. The same here: the
    module's directory taken off sys.path and served by a meta path finder."""
    import pyspark_lakesink

    assert lookup_problem() is None  # this Python: seen (CI installs lakesink in compat mode)
    home = str(Path(pyspark_lakesink.__file__).parents[1])
    code = f"""
import importlib.abc, importlib.util, sys
home = {home!r}
sys.path[:] = [p for p in sys.path if p not in (home, "")]
for name in [m for m in sys.modules if m.startswith(("pyspark_lakesink", "lakesink_datasource"))]:
    del sys.modules[name]
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ("pyspark_lakesink", "lakesink_datasource") and path is None:
            return importlib.util.spec_from_file_location(name, f"{{home}}/{{top}}/__init__.py", submodule_search_locations=[f"{{home}}/{{top}}"])
        return None
sys.meta_path.insert(0, Hook())
import pyspark_lakesink  # imports through the hook
from lakesink_datasource.spark_lookup import lookup_problem
print(lookup_problem())
"""
    run = _python(code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "editable_mode=compat" in run.stdout and "spark.dataSource.register" in run.stdout, run.stdout
