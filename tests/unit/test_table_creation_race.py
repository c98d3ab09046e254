"""Several tasks of one routed write meet a new table at once, and each creates it (issue 47):
every one must end up writing the one table that won, in a namespace that may be new too,
and the losers' first metadata files must not stay behind (a location holding another
table's metadata is refused by lakesink's own creation and orphan removal)."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lakesink_datasource.catalog import loader
from lakesink_datasource.options import parse_options
from lakesink_datasource.table.location_guard import metadata_files
from lakesink_datasource.table.setup import create_table, planning_clock

WRITERS = 6
SCHEMA = StructType([StructField("id", LongType(), False), StructField("name", StringType())])


@pytest.mark.parametrize("round_", range(4))
def test_writers_creating_one_table_at_once_all_get_the_winner_and_no_stray_metadata(warehouse: str, round_: int) -> None:
    identifier = f"fresh{round_}.t"  # a new namespace: its creation races too
    options = parse_options({"table": identifier, "warehouse": warehouse, "operation": "upsert", "primary_key": "id"})
    config = loader.catalog_config(options)
    start = threading.Barrier(WRITERS)

    def create(_: int) -> str:
        catalog = loader.load(config)
        start.wait()
        return str(create_table(catalog, options, SCHEMA, config, planning_clock(options)).metadata.table_uuid)

    with ThreadPoolExecutor(WRITERS) as pool:
        uuids = set(pool.map(create, range(WRITERS)))
    table = loader.load(config).load_table(identifier)
    assert uuids == {str(table.metadata.table_uuid)}
    names = [p.rsplit("/", 1)[1] for p in metadata_files(table.io, table.metadata.location)]
    assert names == [table.metadata_location.rsplit("/", 1)[1]]


def _open_catalog(warehouse: str, start: Any) -> None:
    config = loader.catalog_config(parse_options({"table": "db.t", "warehouse": warehouse}))
    start.wait()
    loader.load(config).list_namespaces()


def test_processes_opening_a_new_embedded_catalog_at_once_all_open_it(tmp_path: Path) -> None:
    """Spark's tasks are processes: the first write to a new warehouse may be several tasks
    at once, each creating the embedded catalog's tables."""
    context = multiprocessing.get_context("fork")
    for round_ in range(5):
        warehouse = str(tmp_path / f"warehouse{round_}")
        start = context.Barrier(WRITERS)
        workers = [context.Process(target=_open_catalog, args=(warehouse, start)) for _ in range(WRITERS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [w.exitcode for w in workers] == [0] * WRITERS
