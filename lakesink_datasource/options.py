"""Write options: parsed once on the driver into a typed, validated msgspec Struct.

Spark hands options as a case-insensitive string map. Every name is snake_case and
matched case-insensitively; an unknown name is an error (a typo must not silently
fall back to a default), named in the message with the closest valid name.
`property.<key>` sets Iceberg table property `<key>` (checked like the table's own);
`catalog.<key>` passes `<key>` to the catalog.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

import msgspec

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.iceberg.properties import PropertyError
from lakesink_datasource.iceberg.properties import validate as validate_properties

OPERATIONS = ("append", "upsert", "cdc", "dedupe")
KEYED_OPERATIONS = ("upsert", "cdc", "dedupe")
MAINTENANCE_MODES = ("auto", "background", "off")
OVERWRITE_MODES = ("static", "dynamic")
# What the first batch of a new checkpoint does to a table that a stream of the same query
# name wrote from another checkpoint (table/new_checkpoint.py): a pipeline's --full-refresh-all.
NEW_CHECKPOINT_MODES = ("refuse", "replace", "append")
DEFAULT_WAREHOUSE = "./lakesink-warehouse"


class OptionError(LakesinkError, ValueError):
    """A write option is missing, unknown or malformed. Raised before anything is written."""


class TableTarget(msgspec.Struct, frozen=True, kw_only=True):
    """Which table, in which catalog: what reads and writes both name."""

    table: str
    warehouse: str
    catalog: str | None = None
    catalog_properties: dict[str, str] = {}

    @property
    def uses_embedded_catalog(self) -> bool:
        return self.catalog is None and not self.catalog_properties


class WriteOptions(TableTarget, frozen=True, kw_only=True):
    partition_by: str | None = None
    sort_by: str | None = None  # the sort order of a table lakesink creates; checked against an existing one
    target_file_size_bytes: int | None = None  # None: the table's write.target-file-size-bytes
    format_version: int | None = None  # of a table lakesink creates (None: 3); checked against an existing one
    table_properties: dict[str, str] = {}  # from property.<key> options
    snapshot_properties: dict[str, str] = {}  # from snapshot_property.<key>: into each commit's summary
    maintenance: str = "auto"
    progress: bool = True  # one line per committed batch on the driver's stderr
    # Idempotent batch writes (Delta's txnAppId / txnVersion): a write whose version is not
    # above the last one committed for its app id is skipped.
    txn_app_id: str | None = None
    txn_version: int | None = None
    branch: str | None = None  # None: main
    # mode("overwrite"): static replaces the whole table, dynamic only the partitions the
    # DataFrame writes to; replace_where only the rows matching a filter. None: not given,
    # Spark's session setting spark.sql.sources.partitionOverwriteMode decides (else static).
    overwrite_mode: str | None = None
    replace_where: str | None = None
    merge_schema: bool = False  # evolve the table's schema to accept the DataFrame, with the write
    evolve_partition: bool = False  # a partition_by that differs from the table's spec becomes its new default
    operation: str = "append"
    primary_key: tuple[str, ...] | None = None
    op_column: str | None = None
    delete_ops: tuple[str, ...] = ("d",)
    # A key's changes are ordered by these columns, compared one after another (a source
    # position of several parts, such as MySQL's binlog file and position).
    sequence_column: tuple[str, ...] | None = None
    # A value meaning "unchanged, not sent" (Debezium's unavailable.value.placeholder for
    # unchanged TOASTed columns): a keyed write keeps the value the table holds for the key.
    unavailable_value: str | None = None
    # Keep every version of each key (`__start_at`, `__end_at`): slowly changing dimensions,
    # type 2. A change of the tracked columns (all but the key, the bounds and the sequence,
    # unless `track_history_columns` or `track_history_except_columns` say) starts a version.
    history: bool = False
    track_history_columns: tuple[str, ...] | None = None
    track_history_except_columns: tuple[str, ...] | None = None
    index_dir: str | None = None
    # A streaming query's checkpoint (Spark passes it to the sink): its committed batches
    # tell that the query wrote before, its metadata file the query's id.
    checkpoint_location: str | None = None
    # writeStream.queryName (Spark passes it too; a pipeline's flow name): what ties a query's
    # checkpoints together, so a new one for the same name is noticed.
    query_name: str | None = None
    new_checkpoint: str | None = None  # one of NEW_CHECKPOINT_MODES; None: not given (refuse)


_SIMPLE = {
    "table",
    "warehouse",
    "catalog",
    "partition_by",
    "sort_by",
    "target_file_size_bytes",
    "format_version",
    "operation",
    "primary_key",
    "op_column",
    "delete_ops",
    "sequence_column",
    "unavailable_value",
    "history",
    "track_history_columns",
    "track_history_except_columns",
    "index_dir",
    "maintenance",
    "progress",
    "txn_app_id",
    "txn_version",
    "branch",
    "overwrite_mode",
    "replace_where",
    "merge_schema",
    "evolve_partition",
    "new_checkpoint",
}
# Summary keys a commit computes itself (Iceberg's counters and totals, the operation).
_RESERVED_SUMMARY_KEYS = {
    "operation", "engine-name", "engine-version", "lakesink-version", "changed-partition-count",
    *(f"{kind}-{what}" for kind in ("added", "removed", "deleted", "total")
      for what in ("data-files", "records", "files-size", "delete-files", "position-deletes", "equality-deletes", "dvs")),
}
# Spark passes the save()/start() argument as `path`; it means the table name.
_ALIASES = {  # Delta's and Iceberg's Spark writer's names
    "path": "table", "txnappid": "txn_app_id", "txnversion": "txn_version", "replacewhere": "replace_where",
    "partitionoverwritemode": "overwrite_mode", "mergeschema": "merge_schema", "merge-schema": "merge_schema",
}
# Options Spark itself consumes and still forwards to the data source.
_SPARK_OWNED = {"checkpointlocation", "queryname"}
_CHECKPOINT = "checkpointlocation"
_QUERY_NAME = "queryname"


def _valid_names() -> str:
    return ", ".join(sorted(_SIMPLE | {"catalog.<property>", "property.<table property>", "snapshot_property.<key>"}))


def _did_you_mean(name: str) -> str:
    return did_you_mean(name, _SIMPLE, _ALIASES)


def did_you_mean(name: str, valid: set[str], aliases: Mapping[str, str]) -> str:
    """`; did you mean 'x'?` for the closest valid option (also across camelCase/snake_case);
    shared by the write and the read options."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    candidates = sorted(valid | set(aliases))
    for probe in (name, snake, name.replace("-", "_")):
        if probe in valid:
            return f"; did you mean '{probe}'?"
    squashed = {c.replace("_", ""): c for c in candidates}
    if name.replace("_", "").replace("-", "") in squashed:
        found = squashed[name.replace("_", "").replace("-", "")]
        return f"; did you mean '{aliases.get(found, found)}'?"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f"; did you mean '{aliases.get(close[0], close[0])}'?" if close else ""


def placeholder_bytes(text: str) -> bytes:
    """Option `unavailable_value` as bytes (what a binary column holds): Debezium's `hex:`
    prefix gives the octets in hex, anything else is the text's UTF-8."""
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise OptionError(f"option 'unavailable_value' {text!r}: after 'hex:' give hexadecimal octets") from None
    return text.encode()


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def int_option(name: str, raw: str, allowed: tuple[int, ...] | None = None, minimum: int = 1) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {raw!r}") from None
    if allowed is not None and value not in allowed:
        raise OptionError(f"option '{name}' must be one of {', '.join(map(str, allowed))}, got {value}")
    if value < minimum:
        raise OptionError(f"option '{name}' must be >= {minimum}, got {value}")
    return value


def bool_option(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option '{name}' must be true or false, got {raw!r}")
    return value == "true"


def parse_options(raw: Mapping[str, str]) -> WriteOptions:
    """Validate Spark's option map into WriteOptions; raise OptionError naming the option."""
    values: dict[str, str] = {}
    checkpoint: str | None = None
    query_name: str | None = None
    catalog_properties: dict[str, str] = {}
    table_properties: dict[str, str] = {}
    snapshot_properties: dict[str, str] = {}
    for key, value in raw.items():
        name = key.lower()
        if name.startswith("catalog."):
            prop = key[len("catalog.") :]
            if not prop:
                raise OptionError("option 'catalog.' needs a property name, e.g. 'catalog.uri'")
            catalog_properties[prop.lower()] = value
            continue
        if name.startswith("property."):
            # Iceberg property names are lower case by convention; Spark lower-cases option
            # names anyway, so the key is taken as given in lower case.
            prop = name[len("property.") :]
            if not prop:
                raise OptionError("option 'property.' needs a table property name, e.g. 'property.write.target-file-size-bytes'")
            table_properties[prop] = value
            continue
        if name.startswith("snapshot_property."):
            prop = name[len("snapshot_property.") :]
            if not prop:
                raise OptionError("option 'snapshot_property.' needs a key, e.g. 'snapshot_property.source-offset'")
            if prop in _RESERVED_SUMMARY_KEYS or prop.startswith("lakesink.") or prop.startswith("spark.sql.streaming."):
                raise OptionError(
                    f"option 'snapshot_property.{prop}': {prop!r} is a summary key Iceberg or lakesink sets itself; "
                    "choose another key"
                )
            snapshot_properties[prop] = value
            continue
        if name in _SPARK_OWNED:
            if name == _CHECKPOINT and value.strip():
                checkpoint = value.strip()
            elif name == _QUERY_NAME and value.strip():
                query_name = value.strip()
            continue
        name = _ALIASES.get(name, name)
        if name not in _SIMPLE:
            raise OptionError(f"unknown option '{key}'{_did_you_mean(name)} (valid options: {_valid_names()})")
        if name in values and values[name] != value:
            raise OptionError(f"option '{name}' given twice with different values ({values[name]!r}, {value!r})")
        values[name] = value

    table = values.get("table", "").strip()
    if not table:
        raise OptionError(
            "option 'table' is required: the Iceberg table as 'namespace.table', e.g. "
            "df.write.format('lakesink').mode('append').save('ns.t') or writeStream.format('lakesink').start('ns.t'). "
            "saveAsTable, toTable and writeTo go through Spark's catalog, which passes a Python data source no "
            "options: use save()/start() instead. For SQL, Spark does not forward CREATE TABLE ... OPTIONS to "
            "INSERT for Python data sources; write INSERT INTO t WITH ('table' = 'ns.t', 'warehouse' = '...') SELECT ..."
        )
    if "." not in table or any(not part.strip() for part in table.split(".")):
        raise OptionError(f"option 'table' must be 'namespace.table' with no empty part, got {table!r}")
    bad = sorted({c for c in table if c in "/\\" or not c.isprintable()})
    if bad:
        # Names become directory names: a slash would let two names share a directory.
        raise OptionError(f"option 'table' must not contain {', '.join(repr(c) for c in bad)}, got {table!r}")

    operation = values.get("operation", "append").strip().lower()
    if operation not in OPERATIONS:
        raise OptionError(f"option 'operation' must be one of {', '.join(OPERATIONS)}, got {operation!r}")
    maintenance = values.get("maintenance", "auto").strip().lower()
    if maintenance not in MAINTENANCE_MODES:
        raise OptionError(f"option 'maintenance' must be one of {', '.join(MAINTENANCE_MODES)}, got {maintenance!r}")
    overwrite_mode = values.get("overwrite_mode", "").strip().lower() or None
    if overwrite_mode is not None and overwrite_mode not in OVERWRITE_MODES:
        raise OptionError(f"option 'overwrite_mode' must be one of {', '.join(OVERWRITE_MODES)}, got {overwrite_mode!r}")
    replace_where = values.get("replace_where", "").strip() or None
    if replace_where is not None and overwrite_mode == "dynamic":
        raise OptionError(
            "options 'replace_where' and 'overwrite_mode' = 'dynamic' exclude each other: the first replaces the rows "
            "matching a filter, the second the partitions the DataFrame writes to; give one"
        )
    new_checkpoint = values.get("new_checkpoint", "").strip().lower() or None
    if new_checkpoint is not None and new_checkpoint not in NEW_CHECKPOINT_MODES:
        raise OptionError(
            f"option 'new_checkpoint' must be one of {', '.join(NEW_CHECKPOINT_MODES)}, got {values['new_checkpoint']!r}"
        )
    branch = values.get("branch", "").strip() or None
    if branch is not None and not branch.isprintable():
        raise OptionError(f"option 'branch' must be a printable name, got {branch!r}")
    try:
        validate_properties(table_properties)
    except PropertyError as exc:
        raise OptionError(f"option 'property.{exc.name}': {exc}") from None

    kwargs: dict[str, object] = {
        "table": table,
        # Made absolute here, on the driver: executors and the commit process may run
        # with another working directory.
        "warehouse": os.path.abspath(values.get("warehouse", DEFAULT_WAREHOUSE)),
        "catalog": values.get("catalog"),
        "catalog_properties": catalog_properties,
        "partition_by": values.get("partition_by") or None,
        "sort_by": values.get("sort_by") or None,
        "operation": operation,
        "maintenance": maintenance,
        "table_properties": table_properties,
        "snapshot_properties": snapshot_properties,
        "overwrite_mode": overwrite_mode,
        "replace_where": replace_where,
        "branch": None if branch == "main" else branch,
        # Made absolute on the driver, where Spark resolves it too.
        "checkpoint_location": None if checkpoint is None else (checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)),
        "query_name": query_name,
        "new_checkpoint": new_checkpoint,
    }
    if "target_file_size_bytes" in values:
        kwargs["target_file_size_bytes"] = int_option("target_file_size_bytes", values["target_file_size_bytes"])
    if "progress" in values:
        kwargs["progress"] = bool_option("progress", values["progress"])
    if "merge_schema" in values:
        kwargs["merge_schema"] = bool_option("merge_schema", values["merge_schema"])
    if "evolve_partition" in values:
        kwargs["evolve_partition"] = bool_option("evolve_partition", values["evolve_partition"])
    if "history" in values:
        kwargs["history"] = bool_option("history", values["history"])
    tracked = {n: _csv(values[n]) for n in ("track_history_columns", "track_history_except_columns") if n in values}
    if len(tracked) == 2:
        raise OptionError(
            "options 'track_history_columns' and 'track_history_except_columns' exclude each other: name the columns "
            "whose changes start a version, or those whose changes do not"
        )
    for name, columns in tracked.items():
        if not kwargs.get("history"):
            raise OptionError(f"option '{name}' applies to history tables: give history=true too")
        if not columns:
            raise OptionError(f"option '{name}' names no column, got {values[name]!r}")
        kwargs[name] = columns
    app_id, version = values.get("txn_app_id", "").strip(), values.get("txn_version")
    if bool(app_id) != (version is not None):
        given, missing = ("txn_app_id", "txn_version") if app_id else ("txn_version", "txn_app_id")
        raise OptionError(
            f"option '{given}' needs '{missing}' too: together they make a batch write idempotent "
            "(a write whose txn_version is not above the last one committed for its txn_app_id is skipped)"
        )
    if app_id:
        kwargs["txn_app_id"] = app_id
        kwargs["txn_version"] = int_option("txn_version", str(version), minimum=0)
    if "format_version" in values:
        kwargs["format_version"] = int_option("format_version", values["format_version"], allowed=(2, 3))
    if "primary_key" in values:
        key_columns = _csv(values["primary_key"])
        if not key_columns:
            raise OptionError(f"option 'primary_key' names no column, got {values['primary_key']!r}: give e.g. 'id' or 'tenant,id'")
        repeated = sorted({c for c in key_columns if [k.lower() for k in key_columns].count(c.lower()) > 1})
        if repeated:
            raise OptionError(f"option 'primary_key' names {', '.join(repeated)} more than once")
        kwargs["primary_key"] = key_columns
    if "delete_ops" in values:
        ops = _csv(values["delete_ops"])
        if not ops:
            raise OptionError("option 'delete_ops' must list at least one delete marker")
        kwargs["delete_ops"] = ops
    for name in ("op_column", "index_dir"):
        if values.get(name):
            kwargs[name] = values[name].strip()
    if values.get("unavailable_value"):
        placeholder_bytes(values["unavailable_value"])  # checked here, used by the keyed writer
        kwargs["unavailable_value"] = values["unavailable_value"]
    if values.get("sequence_column", "").strip():
        sequence = _csv(values["sequence_column"])
        repeated = sorted({c for c in sequence if [s.lower() for s in sequence].count(c.lower()) > 1})
        if repeated:
            raise OptionError(f"option 'sequence_column' names {', '.join(repeated)} more than once")
        kwargs["sequence_column"] = sequence
    return msgspec.convert(kwargs, WriteOptions)
