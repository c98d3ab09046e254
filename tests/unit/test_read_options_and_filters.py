"""Read options (bad input is named) and which Spark filters the reader takes, without Spark."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType, TimestampType, TimestamptzType
from pyspark.sql import datasource as f

from lakesink_datasource.options import OptionError
from lakesink_datasource.read.filters import to_iceberg
from lakesink_datasource.read.options import parse_read_options

SCHEMA = Schema(
    NestedField(1, "id", LongType()), NestedField(2, "name", StringType()), NestedField(3, "score", DoubleType()),
    NestedField(4, "day", DateType()), NestedField(5, "at", TimestamptzType()), NestedField(6, "local", TimestampType()),
)


def test_read_options_parse_times_and_name_what_is_wrong() -> None:
    options = parse_read_options({"path": "db.t", "as_of_timestamp": "2026-01-02T00:00:00Z"})
    assert options.table == "db.t" and options.as_of_timestamp_ms == 1_767_312_000_000
    assert parse_read_options({"table": "db.t", "as_of_timestamp": "1767312000000"}).as_of_timestamp_ms == 1_767_312_000_000
    assert parse_read_options({"table": "db.t", "maxFilesPerTrigger": "3"}).max_files_per_trigger == 3
    with pytest.raises(OptionError, match="option 'operation' does not apply to reads"):
        parse_read_options({"table": "db.t", "operation": "upsert"})
    with pytest.raises(OptionError, match="'snapshot_id' and 'as_of_timestamp' exclude each other"):
        parse_read_options({"table": "db.t", "snapshot_id": "1", "as_of_timestamp": "5"})
    with pytest.raises(OptionError, match="'as_of_timestamp' must be milliseconds since the epoch or an ISO-8601 time"):
        parse_read_options({"table": "db.t", "as_of_timestamp": "yesterday"})
    with pytest.raises(OptionError, match="option 'snapshot_id' must be a snapshot id"):
        parse_read_options({"table": "db.t", "snapshot_id": "abc"})
    with pytest.raises(OptionError, match="CREATE TEMPORARY VIEW v USING lakesink"):
        parse_read_options({})  # a catalog table read: Spark passes no options
    assert parse_read_options({"table": "db.t", "read_changes": "true"}).range_options == ["read_changes"]


def test_iceberg_s_and_delta_s_read_spellings_are_taken_or_refused_with_ours() -> None:
    delta = parse_read_options({"table": "db.t", "timestampAsOf": "2026-01-02T00:00:00Z"})
    assert delta.as_of_timestamp_ms == 1_767_312_000_000
    assert parse_read_options({"table": "db.t", "snapshot-id": "7"}).snapshot_id == 7
    iceberg = parse_read_options({"table": "db.t", "streaming-skip-delete-snapshots": "true",
                                  "streaming-skip-overwrite-snapshots": "true", "streaming-max-files-per-micro-batch": "2"})
    assert (iceberg.skip_delete_snapshots, iceberg.skip_overwrite_snapshots, iceberg.max_files_per_trigger) == (True, True, 2)
    with pytest.raises(OptionError, match="option 'versionAsOf': an Iceberg table has snapshot ids, not versions: use 'snapshot_id'"):
        parse_read_options({"table": "db.t", "versionAsOf": "3"})
    with pytest.raises(OptionError, match="use 'starting_snapshot_id'"):
        parse_read_options({"table": "db.t", "startingVersion": "3"})
    with pytest.raises(OptionError, match="use 'max_files_per_trigger'"):
        parse_read_options({"table": "db.t", "streaming-max-rows-per-micro-batch": "1000"})


def test_a_range_is_bounded_by_snapshot_or_time_and_excludes_one_state() -> None:
    delta = parse_read_options({"table": "db.t", "readChangeFeed": "true", "startingTimestamp": "5", "endingTimestamp": "9"})
    assert (delta.read_changes, delta.starting_timestamp_ms, delta.ending_timestamp_ms, delta.is_range) == (True, 5, 9, True)
    iceberg = parse_read_options({"table": "db.t", "starting_snapshot_id": "4", "end-snapshot-id": "8"})
    assert (iceberg.starting_snapshot_id, iceberg.ending_snapshot_id, iceberg.read_changes) == (4, 8, False)
    assert not parse_read_options({"table": "db.t", "max_files_per_trigger": "3"}).is_range
    with pytest.raises(OptionError, match="option 'start-snapshot-id': Iceberg's start-snapshot-id leaves the snapshot out"):
        parse_read_options({"table": "db.t", "start-snapshot-id": "3"})
    with pytest.raises(OptionError, match="use 'ending_snapshot_id' or 'ending_timestamp'"):
        parse_read_options({"table": "db.t", "endingVersion": "3"})
    with pytest.raises(OptionError, match="options 'ending_snapshot_id' and 'ending_timestamp' exclude each other"):
        parse_read_options({"table": "db.t", "ending_snapshot_id": "3", "ending_timestamp": "4"})
    with pytest.raises(OptionError, match=r"option 'snapshot_id' reads one state of the table.*bound the range with 'ending_snapshot_id'"):
        parse_read_options({"table": "db.t", "read_changes": "true", "snapshot_id": "3"})


def test_a_misspelt_read_option_gets_a_suggestion() -> None:
    with pytest.raises(OptionError, match="option 'snapshotid_' does not apply to reads; did you mean 'snapshot_id'"):
        parse_read_options({"table": "db.t", "snapshotid_": "3"})
    with pytest.raises(OptionError, match="option 'readChanges' does not apply to reads; did you mean 'read_changes'"):
        parse_read_options({"table": "db.t", "readChanges": "true"})


def test_only_filters_iceberg_evaluates_as_spark_does_are_taken() -> None:
    taken = {
        "id > 5": f.GreaterThan(("id",), 5),
        "name starts": f.StringStartsWith(("NAME",), "ab"),  # Spark's column case differs from the table's
        "in": f.In(("id",), (1, 2, 3)),
        "null": f.IsNull(("name",)),
        "date": f.EqualTo(("day",), date(2026, 1, 2)),
        "aware time on timestamptz": f.LessThan(("at",), datetime(2026, 1, 2, tzinfo=timezone.utc)),
        "naive time on timestamp": f.GreaterThanOrEqual(("local",), datetime(2026, 1, 2)),
    }
    for what, spark_filter in taken.items():
        assert to_iceberg(spark_filter, SCHEMA) is not None, what
    left = {
        "NaN ordering differs on doubles": f.GreaterThan(("score",), 1.5),
        "NOT": f.Not(f.EqualTo(("id",), 1)),
        "ends with": f.StringEndsWith(("name",), "z"),
        "null in an IN list": f.In(("id",), (1, None)),
        "string literal on a long column": f.EqualTo(("id",), "5"),
        "naive time on timestamptz": f.EqualTo(("at",), datetime(2026, 1, 2)),
        "unknown column": f.EqualTo(("nope",), 1),
    }
    for what, spark_filter in left.items():
        assert to_iceberg(spark_filter, SCHEMA) is None, what
    assert str(to_iceberg(f.EqualTo(("day",), date(1970, 1, 11)), SCHEMA)) == "EqualTo(term=Reference(name='day'), literal=DateLiteral(10))"
