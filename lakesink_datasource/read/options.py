"""Read options: `spark.read.format("lakesink")`, `CREATE TEMPORARY VIEW ... USING lakesink`.

The table and catalog are named as for writes (`table`, `warehouse`, `catalog`,
`catalog.<key>`); the rest says which state of the table to read. Write-only options are
refused by name, so a copied write configuration does not silently mean something else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timezone

import msgspec

from lakesink_datasource.options import DEFAULT_WAREHOUSE, OptionError, TableTarget, bool_option, did_you_mean, int_option

# A range of snapshots: a stream starts there; a batch read reads what a stream would have
# emitted over the range (its appended rows, or with read_changes its changes).
_RANGE = {"starting_snapshot_id", "starting_timestamp", "read_changes", "skip_delete_snapshots", "skip_overwrite_snapshots"}
_STREAM_ONLY = {"max_files_per_trigger"}
_BATCH_ONLY = {"ending_snapshot_id", "ending_timestamp"}  # a stream ends where the table's head is
_READ = {"table", "warehouse", "catalog", "snapshot_id", "as_of_timestamp", "branch", "split_size_bytes", *_RANGE,
         *_STREAM_ONLY, *_BATCH_ONLY}
_ALIASES = {"path": "table", "snapshot-id": "snapshot_id", "as-of-timestamp": "as_of_timestamp",
            "split-size": "split_size_bytes", "snapshotid": "snapshot_id", "asoftimestamp": "as_of_timestamp",
            "maxfilespertrigger": "max_files_per_trigger", "streaming-max-files-per-micro-batch": "max_files_per_trigger",
            "stream-from-timestamp": "starting_timestamp",
            # Iceberg's Spark runtime
            "streaming-skip-delete-snapshots": "skip_delete_snapshots",
            "streaming-skip-overwrite-snapshots": "skip_overwrite_snapshots",
            "end-snapshot-id": "ending_snapshot_id",  # inclusive in Iceberg too
            # Delta's
            "timestampasof": "as_of_timestamp", "readchangefeed": "read_changes", "readchangedata": "read_changes",
            "startingtimestamp": "starting_timestamp", "endingtimestamp": "ending_timestamp"}
# Options of other engines that have no lakesink equivalent: refused with what to use instead.
_NOT_HERE = {
    "versionasof": "an Iceberg table has snapshot ids, not versions: use 'snapshot_id' (db.t.snapshots lists them) "
                   "or 'as_of_timestamp'",
    "startingversion": "an Iceberg table has snapshot ids, not versions: use 'starting_snapshot_id' or 'starting_timestamp'",
    "endingversion": "an Iceberg table has snapshot ids, not versions: use 'ending_snapshot_id' or 'ending_timestamp'",
    # Same name, other meaning: Iceberg's start is exclusive, lakesink's includes the snapshot.
    "start-snapshot-id": "Iceberg's start-snapshot-id leaves the snapshot out; lakesink's 'starting_snapshot_id' "
                         "reads from the snapshot it names on: give the snapshot after it as starting_snapshot_id",
    "streaming-max-rows-per-micro-batch": "lakesink limits a micro-batch by files: use 'max_files_per_trigger'",
    "maxbytespertrigger": "lakesink limits a micro-batch by files: use 'max_files_per_trigger'",
}
_SPARK_OWNED = {"checkpointlocation", "queryname"}

SQL_READ_HINT = (
    "Spark passes no options to a Python data source read through a catalog table; read it through a temporary "
    "view instead: CREATE TEMPORARY VIEW v USING lakesink OPTIONS (table 'ns.t', warehouse '...'); SELECT * FROM v"
)


class ReadOptions(TableTarget, frozen=True, kw_only=True):
    snapshot_id: int | None = None
    as_of_timestamp_ms: int | None = None
    branch: str | None = None  # a branch or tag name to read the head of
    split_size_bytes: int | None = None  # None: the table's read.split.target-size
    # readStream only
    starting_snapshot_id: int | None = None
    starting_timestamp_ms: int | None = None
    max_files_per_trigger: int | None = None
    read_changes: bool = False
    # batch reads of a range only: the last snapshot read (inclusive)
    ending_snapshot_id: int | None = None
    ending_timestamp_ms: int | None = None
    # A plain stream skips snapshots that delete (or overwrite) rows instead of failing on
    # them (Iceberg's streaming-skip-delete-snapshots / -overwrite-snapshots): it then misses
    # what they did, which the user asked for.
    skip_delete_snapshots: bool = False
    skip_overwrite_snapshots: bool = False

    @property
    def range_options(self) -> list[str]:
        """The options given that make a read one of a range of snapshots (or a stream's start)."""
        given = {
            "starting_snapshot_id": self.starting_snapshot_id is not None,
            "starting_timestamp": self.starting_timestamp_ms is not None,
            "ending_snapshot_id": self.ending_snapshot_id is not None,
            "ending_timestamp": self.ending_timestamp_ms is not None,
            "max_files_per_trigger": self.max_files_per_trigger is not None,
            "read_changes": self.read_changes,
            "skip_delete_snapshots": self.skip_delete_snapshots,
            "skip_overwrite_snapshots": self.skip_overwrite_snapshots,
        }
        return [name for name, present in given.items() if present]

    @property
    def is_range(self) -> bool:
        """A batch read of what snapshots did (not of one state of the table)."""
        return bool(set(self.range_options) - _STREAM_ONLY)


def parse_timestamp_ms(name: str, raw: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (UTC unless it names a zone)."""
    text = raw.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"option '{name}' must be milliseconds since the epoch or an ISO-8601 time such as "
            f"2026-01-31T12:00:00Z, got {raw!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def _snapshot_id(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be a snapshot id (an integer), got {raw!r}") from None


def parse_read_options(raw: Mapping[str, str]) -> ReadOptions:
    """Validate Spark's option map for a read; OptionError names the option."""
    values: dict[str, str] = {}
    catalog_properties: dict[str, str] = {}
    for key, value in raw.items():
        name = key.lower()
        if name.startswith("catalog."):
            catalog_properties[key[len("catalog.") :].lower()] = value
            continue
        if name in _SPARK_OWNED:
            continue
        if name in _NOT_HERE:
            raise OptionError(f"option '{key}': {_NOT_HERE[name]}")
        name = _ALIASES.get(name, name)
        if name not in _READ:
            raise OptionError(
                f"option '{key}' does not apply to reads{did_you_mean(name, _READ, _ALIASES)} "
                f"(read options: {', '.join(sorted(_READ | {'catalog.<property>'}))})"
            )
        values[name] = value
    table = values.get("table", "").strip()
    if not table:
        raise OptionError(f"option 'table' is required: the Iceberg table as 'namespace.table'. {SQL_READ_HINT}")
    if "." not in table:
        raise OptionError(f"option 'table' must be 'namespace.table', got {table!r}")
    kwargs: dict[str, object] = {
        "table": table,
        "warehouse": os.path.abspath(values.get("warehouse", DEFAULT_WAREHOUSE)),
        "catalog": values.get("catalog"),
        "catalog_properties": catalog_properties,
        "branch": values.get("branch", "").strip() or None,
    }
    for name in ("snapshot_id", "starting_snapshot_id", "ending_snapshot_id"):
        if name in values:
            kwargs[name] = _snapshot_id(name, values[name])
    if "as_of_timestamp" in values:
        kwargs["as_of_timestamp_ms"] = parse_timestamp_ms("as_of_timestamp", values["as_of_timestamp"])
    chosen = [n for n in ("snapshot_id", "as_of_timestamp", "branch") if values.get(n, "").strip()]
    if len(chosen) > 1:
        raise OptionError(f"options {' and '.join(repr(n) for n in chosen)} exclude each other: give one state to read")
    for name in ("split_size_bytes", "max_files_per_trigger"):
        if name in values:
            kwargs[name] = int_option(name, values[name])
    if "starting_timestamp" in values:
        kwargs["starting_timestamp_ms"] = parse_timestamp_ms("starting_timestamp", values["starting_timestamp"])
    if "ending_timestamp" in values:
        kwargs["ending_timestamp_ms"] = parse_timestamp_ms("ending_timestamp", values["ending_timestamp"])
    for end in ("starting", "ending"):
        if f"{end}_snapshot_id" in values and f"{end}_timestamp" in values:
            raise OptionError(f"options '{end}_snapshot_id' and '{end}_timestamp' exclude each other: give one")
    for name in ("read_changes", "skip_delete_snapshots", "skip_overwrite_snapshots"):
        if name in values:
            kwargs[name] = bool_option(name, values[name])
    options = msgspec.convert(kwargs, ReadOptions)
    if options.is_range and (chosen := [n for n in ("snapshot_id", "as_of_timestamp") if n in values]):
        raise OptionError(
            f"option '{chosen[0]}' reads one state of the table, while {', '.join(map(repr, options.range_options))} "
            "read what snapshots did: bound the range with 'ending_snapshot_id' or 'ending_timestamp' instead"
        )
    return options


def read_subset(raw: Mapping[str, str]) -> dict[str, str]:
    """The options of `raw` a read understands (for `schema()`, which Spark also calls for
    CREATE TABLE ... USING lakesink OPTIONS (...) with write options)."""
    return {k: v for k, v in raw.items() if k.lower().startswith("catalog.") or _ALIASES.get(k.lower(), k.lower()) in _READ}
