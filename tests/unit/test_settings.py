"""One answer per setting: the write's own option, else the table's property, else the default."""

from __future__ import annotations

import pytest

from lakesink_datasource.iceberg.properties import PropertyError, TableSettings, read_split_target


@pytest.mark.parametrize(
    ("table", "write", "retries"),
    [({}, {}, 4), ({"commit.retry.num-retries": "2"}, {}, 2), ({"commit.retry.num-retries": "2"}, {"commit.retry.num-retries": "9"}, 9)],
    ids=["default", "table property", "the write's option wins"],
)
def test_a_write_setting_resolves_option_then_property_then_default(table: dict, write: dict, retries: int) -> None:
    assert TableSettings.for_write(table, write, "file:///t").commit_num_retries == retries


def test_a_bad_value_is_named_whichever_side_gave_it() -> None:
    with pytest.raises(PropertyError, match=r"write\.target-file-size-bytes"):
        TableSettings.for_write({}, {"write.target-file-size-bytes": "big"}, "file:///t")


def test_the_read_split_target_ignores_what_it_cannot_use() -> None:
    assert read_split_target({}) == 128 * 1024 * 1024
    assert read_split_target({"read.split.target-size": "1048576"}) == 1048576
    assert read_split_target({"read.split.target-size": "-5"}) == 128 * 1024 * 1024
