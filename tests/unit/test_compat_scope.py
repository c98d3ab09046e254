"""The pyiceberg v3 shim applies only inside lakesink's own calls (`v3_metadata_writes`)."""

from __future__ import annotations

import threading

import pytest
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField

import lakesink_datasource  # noqa: F401  (importing lakesink must not change pyiceberg)
from lakesink_datasource.iceberg.compat import v3_metadata_writes


def _v3_metadata() -> TableMetadata:
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    return new_table_metadata(
        schema, PartitionSpec(), sort_order=UNSORTED_SORT_ORDER, location="file:///tmp/t", properties={"format-version": "3"}
    )


def test_outside_lakesink_pyiceberg_still_refuses_to_write_v3_metadata() -> None:
    metadata = _v3_metadata()
    with pytest.raises(NotImplementedError):
        metadata.model_dump_json()
    with v3_metadata_writes():
        text = metadata.model_dump_json()
    assert '"format-version":3' in text and '"next-row-id":0' in text
    with pytest.raises(NotImplementedError):  # and refuses again afterwards
        metadata.model_dump_json()


def test_the_scope_belongs_to_the_thread_that_entered_it() -> None:
    metadata = _v3_metadata()
    inside, outside_done = threading.Event(), threading.Event()
    seen: list[BaseException | str] = []

    def other_thread() -> None:
        inside.wait()
        try:
            metadata.model_dump_json()
            seen.append("serialised")
        except NotImplementedError as exc:
            seen.append(exc)
        outside_done.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with v3_metadata_writes():
        inside.set()
        outside_done.wait(timeout=30)
        assert "next-row-id" in metadata.model_dump_json()
    t.join()
    assert len(seen) == 1 and isinstance(seen[0], NotImplementedError)
