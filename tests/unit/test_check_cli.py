"""`python -m lakesink_datasource.check`: exit 0 on a sound table, one line per violation
and exit 1 on a broken one, exit 2 when the table cannot be opened.

The table under test has a deletion vector (committed through commit_write, the path a
keyed write's tasks take), so the checker has a DV blob to verify; the broken variant is
the same table with one byte of that blob flipped on disk, which a reader would reject
(Java checks the blob's CRC before applying it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from lakesink_testing import embedded_catalog
from pyroaring import BitMap64
from pyspark.sql import types as T

from lakesink_datasource.check import check_table, main
from lakesink_datasource.commit.committer import commit_write
from lakesink_datasource.iceberg.live_files import live_position_deletes
from lakesink_datasource.iceberg.manifests import content_offset, content_size_in_bytes
from lakesink_datasource.iceberg.puffin import DVBlobRef
from lakesink_datasource.messages import PositionDeletesMessage, TaskResult, decode_messages
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.setup import plan_write
from lakesink_datasource.write.task import TaskIdentity, write_task

IDENT = "db.t"
SPARK_SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])


def _table_with_dv(warehouse: str) -> tuple[Path, DVBlobRef]:
    """A v3 table with one append and one DV; returns the Puffin file and the blob's place."""
    opts = parse_options({"table": IDENT, "warehouse": warehouse, "partition_by": "bucket(2, id)"})
    plan = plan_write(opts, SPARK_SCHEMA, overwrite=False)
    batch = pa.record_batch({"id": pa.array(range(20), pa.int64()), "v": pa.array([f"v{i}" for i in range(20)])})
    results = decode_messages([write_task(plan, iter([batch]), who=TaskIdentity())])
    assert commit_write(plan, results, None).snapshot_id is not None

    # A second write that hides rows 1 and 3 of the first data file: the commit turns the
    # positions into a deletion vector in a Puffin file.
    target = results[0].data_files[0]
    plan = plan_write(opts, SPARK_SCHEMA, overwrite=False)
    delete = TaskResult(
        write_id=plan.write_id, query_id=None, batch_id=None, partition_id=0, attempt=0,
        planned_metadata_location=plan.metadata_location, planned_snapshot_id=plan.planned_snapshot_id,
        position_deletes=[PositionDeletesMessage(target.path, target.spec_id, target.partition, BitMap64([1, 3]).serialize())],
    )
    assert commit_write(plan, [delete], None).snapshot_id is not None
    table = embedded_catalog(warehouse).load_table(IDENT)
    (dv,) = live_position_deletes(table.io, table.metadata.current_snapshot()).values()
    ref = DVBlobRef(target.path, content_offset(dv.data_file), content_size_in_bytes(dv.data_file), dv.data_file.record_count)
    assert ref.cardinality == 2
    return Path(dv.data_file.file_path.removeprefix("file://")), ref


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A real child process: proves the module entry point and its exit status.
    return subprocess.run(
        [sys.executable, "-m", "lakesink_datasource.check", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_passes_a_sound_table_and_fails_a_corrupted_dv(warehouse: str) -> None:
    puffin, ref = _table_with_dv(warehouse)
    ok = _run_cli(IDENT, "--warehouse", warehouse)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith(f"OK: {IDENT} (format v3")

    # Flip one bitmap byte inside the blob (after length prefix and magic): the stored
    # CRC no longer matches, which is exactly what a reader would refuse.
    data = bytearray(puffin.read_bytes())
    data[ref.offset + 9] ^= 0xFF
    puffin.write_bytes(bytes(data))
    bad = _run_cli(IDENT, "--warehouse", warehouse)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = bad.stdout.splitlines()
    assert len(lines) == 1, lines
    assert str(puffin) in lines[0] and "CRC mismatch" in lines[0]


def test_cli_opens_a_catalog_given_by_name_and_properties(warehouse: str, capsys: pytest.CaptureFixture[str]) -> None:
    _table_with_dv(warehouse)
    status = main([
        IDENT, "--catalog", "lakesink",
        "--catalog-prop", "type=sql",
        "--catalog-prop", f"uri=sqlite:///{warehouse}/catalog.db",
        "--catalog-prop", f"warehouse=file://{warehouse}",
    ])
    assert status == 0, capsys.readouterr()
    assert capsys.readouterr().out.startswith("OK: ")


def test_cli_reports_an_unloadable_table_without_creating_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    assert main([IDENT, "--warehouse", str(missing)]) == 2
    assert "cannot load table db.t" in capsys.readouterr().err
    assert not missing.exists()  # a check never creates a catalog or warehouse


def test_cli_rejects_conflicting_or_malformed_catalog_arguments(warehouse: str) -> None:
    with pytest.raises(SystemExit) as both:
        main([IDENT, "--warehouse", warehouse, "--catalog", "x"])
    assert both.value.code == 2
    with pytest.raises(SystemExit) as malformed:
        main([IDENT, "--catalog", "x", "--catalog-prop", "novalue"])
    assert malformed.value.code == 2


def test_checker_reports_two_live_rows_for_one_key(warehouse: str) -> None:
    """A keyed table (identifier field id) that a plain append gave a second row for key 1
    (appends do not resolve keys); a key whose old row is hidden by a DV is fine."""
    keyed = {"table": IDENT, "warehouse": warehouse, "operation": "upsert", "primary_key": "id", "index_dir": f"{warehouse}/idx"}

    def write(options: dict[str, str], ids: list[int]) -> None:
        plan = plan_write(parse_options(options), SPARK_SCHEMA, overwrite=False)
        batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids])})
        assert commit_write(plan, decode_messages([write_task(plan, iter([batch]), who=TaskIdentity())]), None).snapshot_id

    write(keyed, [1, 2, 3])
    write(keyed, [2])  # an upsert: the old row of 2 is hidden, one live row per key
    table = embedded_catalog(warehouse).load_table(IDENT)
    assert check_table(table) == []
    write({"table": IDENT, "warehouse": warehouse}, [1])
    violations = check_table(embedded_catalog(warehouse).load_table(IDENT))
    assert violations == ["table: 1 key(s) of identifier fields (id) have more than one live row, e.g. (1,) (2 rows)"]
