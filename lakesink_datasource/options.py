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
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet

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
    return ", ".join(sorted(OPTION_NAMES | {"catalog.<property>", "property.<table property>", "snapshot_property.<key>"}))


def _did_you_mean(name: str) -> str:
    return did_you_mean(name, OPTION_NAMES, _ALIASES)


def did_you_mean(name: str, valid: AbstractSet[str], aliases: Mapping[str, str]) -> str:
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


# How each option's text becomes its WriteOptions field: (option name, its text) -> value.
# An option missing from the map keeps WriteOptions' default; one that parses to None too.
_Parser = Callable[[str, str], object]


def _table_name(_name: str, raw: str) -> str:
    table = raw.strip()
    if not table:
        raise OptionError(_TABLE_REQUIRED)
    if "." not in table or any(not part.strip() for part in table.split(".")):
        raise OptionError(f"option 'table' must be 'namespace.table' with no empty part, got {table!r}")
    bad = sorted({c for c in table if c in "/\\" or not c.isprintable()})
    if bad:
        # Names become directory names: a slash would let two names share a directory.
        raise OptionError(f"option 'table' must not contain {', '.join(repr(c) for c in bad)}, got {table!r}")
    return table


def _absolute_path(_name: str, raw: str) -> str:
    # Made absolute here, on the driver: executors and the commit process may run with
    # another working directory.
    return os.path.abspath(raw)


def _as_given(_name: str, raw: str) -> str:
    return raw


def _text_or_none(_name: str, raw: str) -> str | None:
    return raw or None


def _stripped_or_none(_name: str, raw: str) -> str | None:
    return raw.strip() or None


def _stripped_if_given(_name: str, raw: str) -> str | None:
    return raw.strip() if raw else None


def _one_of(choices: tuple[str, ...], *, empty_means_unset: bool = False, quote_given: bool = False) -> _Parser:
    def parse(name: str, raw: str) -> str | None:
        value = raw.strip().lower()
        if empty_means_unset and not value:
            return None
        if value not in choices:
            raise OptionError(f"option '{name}' must be one of {', '.join(choices)}, got {raw if quote_given else value!r}")
        return value

    return parse


def _integer(allowed: tuple[int, ...] | None = None, minimum: int = 1) -> _Parser:
    return lambda name, raw: int_option(name, raw, allowed=allowed, minimum=minimum)


def _columns(*, example: str = "", unique: bool = False, required: bool = True) -> _Parser:
    """A comma-separated list of columns; `required`: at least one; `unique`: none named twice
    (case-insensitively)."""

    def parse(name: str, raw: str) -> tuple[str, ...]:
        columns = _csv(raw)
        if required and not columns:
            raise OptionError(f"option '{name}' names no column, got {raw!r}" + (f": give e.g. {example}" if example else ""))
        repeated = sorted({c for c in columns if [k.lower() for k in columns].count(c.lower()) > 1})
        if unique and repeated:
            raise OptionError(f"option '{name}' names {', '.join(repeated)} more than once")
        return columns

    return parse


_sequence_list = _columns(unique=True, required=False)


def _sequence_columns(name: str, raw: str) -> object:
    return _sequence_list(name, raw) if raw.strip() else None


def _delete_markers(_name: str, raw: str) -> tuple[str, ...]:
    ops = _csv(raw)
    if not ops:
        raise OptionError("option 'delete_ops' must list at least one delete marker")
    return ops


def _placeholder(_name: str, raw: str) -> str | None:
    if raw:
        placeholder_bytes(raw)  # checked here, used by the keyed writer
    return raw or None


def _branch(_name: str, raw: str) -> str | None:
    branch = raw.strip() or None
    if branch is not None and not branch.isprintable():
        raise OptionError(f"option 'branch' must be a printable name, got {branch!r}")
    return None if branch == "main" else branch


# Every option a write takes by name (lower case), in the order they are checked, with its
# parser. Prefixed options (catalog., property., snapshot_property.) and those Spark passes
# (checkpointLocation, queryName) are read apart, in parse_options.
_OPTIONS: dict[str, _Parser] = {
    "table": _table_name,
    "operation": _one_of(OPERATIONS),
    "maintenance": _one_of(MAINTENANCE_MODES),
    "overwrite_mode": _one_of(OVERWRITE_MODES, empty_means_unset=True),
    "replace_where": _stripped_or_none,
    "new_checkpoint": _one_of(NEW_CHECKPOINT_MODES, empty_means_unset=True, quote_given=True),
    "branch": _branch,
    "warehouse": _absolute_path,
    "catalog": _as_given,
    "partition_by": _text_or_none,
    "sort_by": _text_or_none,
    "target_file_size_bytes": _integer(),
    "progress": bool_option,
    "merge_schema": bool_option,
    "evolve_partition": bool_option,
    "history": bool_option,
    "track_history_columns": _columns(),
    "track_history_except_columns": _columns(),
    "txn_app_id": _as_given,  # checked with its partner (_check_idempotent_write)
    "txn_version": _as_given,
    "format_version": _integer(allowed=(2, 3)),
    "primary_key": _columns(example="'id' or 'tenant,id'", unique=True),
    "delete_ops": _delete_markers,
    "op_column": _stripped_if_given,
    "index_dir": _stripped_if_given,
    "unavailable_value": _placeholder,
    "sequence_column": _sequence_columns,
}
OPTION_NAMES = frozenset(_OPTIONS)  # every named write option (docs/options.md lists each)
_DEFAULTS = {"warehouse": DEFAULT_WAREHOUSE}  # options parsed even when not given
_TABLE_REQUIRED = (
    "option 'table' is required: the Iceberg table as 'namespace.table', e.g. "
    "df.write.format('lakesink').mode('append').save('ns.t') or writeStream.format('lakesink').start('ns.t'). "
    "saveAsTable, toTable and writeTo go through Spark's catalog, which passes a Python data source no "
    "options: use save()/start() instead. For SQL, Spark does not forward CREATE TABLE ... OPTIONS to "
    "INSERT for Python data sources; write INSERT INTO t WITH ('table' = 'ns.t', 'warehouse' = '...') SELECT ..."
)


class _Given(msgspec.Struct):
    """Spark's option map sorted by kind: named options (aliases resolved, lower case),
    prefixed properties, and what Spark itself passes."""

    values: dict[str, str] = {}
    catalog_properties: dict[str, str] = {}
    table_properties: dict[str, str] = {}
    snapshot_properties: dict[str, str] = {}
    checkpoint: str | None = None
    query_name: str | None = None


def _property_name(key: str, prefix: str, example: str) -> str:
    prop = key[len(prefix) :]
    if not prop:
        raise OptionError(f"option '{prefix}' needs {example}")
    return prop


def _sort(raw: Mapping[str, str]) -> _Given:
    given = _Given()
    for key, value in raw.items():
        name = key.lower()
        if name.startswith("catalog."):
            given.catalog_properties[_property_name(key, "catalog.", "a property name, e.g. 'catalog.uri'").lower()] = value
        elif name.startswith("property."):
            # Iceberg property names are lower case by convention; Spark lower-cases option
            # names anyway, so the key is taken as given in lower case.
            prop = _property_name(name, "property.", "a table property name, e.g. 'property.write.target-file-size-bytes'")
            given.table_properties[prop] = value
        elif name.startswith("snapshot_property."):
            prop = _property_name(name, "snapshot_property.", "a key, e.g. 'snapshot_property.source-offset'")
            if prop in _RESERVED_SUMMARY_KEYS or prop.startswith("lakesink.") or prop.startswith("spark.sql.streaming."):
                raise OptionError(
                    f"option 'snapshot_property.{prop}': {prop!r} is a summary key Iceberg or lakesink sets itself; "
                    "choose another key"
                )
            given.snapshot_properties[prop] = value
        elif name == _CHECKPOINT:
            given.checkpoint = value.strip() or given.checkpoint
        elif name == _QUERY_NAME:
            given.query_name = value.strip() or given.query_name
        else:
            name = _ALIASES.get(name, name)
            if name not in _OPTIONS:
                raise OptionError(f"unknown option '{key}'{_did_you_mean(name)} (valid options: {_valid_names()})")
            if name in given.values and given.values[name] != value:
                raise OptionError(f"option '{name}' given twice with different values ({given.values[name]!r}, {value!r})")
            given.values[name] = value
    return given


# Checks across options, in the order they run: each gets the parsed fields and the texts.
def _check_replace_where(fields: dict[str, object], _values: Mapping[str, str]) -> None:
    if fields.get("replace_where") is not None and fields.get("overwrite_mode") == "dynamic":
        raise OptionError(
            "options 'replace_where' and 'overwrite_mode' = 'dynamic' exclude each other: the first replaces the rows "
            "matching a filter, the second the partitions the DataFrame writes to; give one"
        )


def _check_tracked_history(fields: dict[str, object], _values: Mapping[str, str]) -> None:
    tracked = [n for n in ("track_history_columns", "track_history_except_columns") if n in fields]
    if len(tracked) == 2:
        raise OptionError(
            "options 'track_history_columns' and 'track_history_except_columns' exclude each other: name the columns "
            "whose changes start a version, or those whose changes do not"
        )
    if tracked and not fields.get("history"):
        raise OptionError(f"option '{tracked[0]}' applies to history tables: give history=true too")


def _check_idempotent_write(fields: dict[str, object], values: Mapping[str, str]) -> None:
    app_id, version = values.get("txn_app_id", "").strip(), values.get("txn_version")
    fields.pop("txn_app_id", None)
    fields.pop("txn_version", None)
    if bool(app_id) != (version is not None):
        given, missing = ("txn_app_id", "txn_version") if app_id else ("txn_version", "txn_app_id")
        raise OptionError(
            f"option '{given}' needs '{missing}' too: together they make a batch write idempotent "
            "(a write whose txn_version is not above the last one committed for its txn_app_id is skipped)"
        )
    if app_id:
        fields["txn_app_id"] = app_id
        fields["txn_version"] = int_option("txn_version", str(version), minimum=0)


_CROSS_CHECKS = (_check_replace_where, _check_tracked_history, _check_idempotent_write)


def parse_options(raw: Mapping[str, str]) -> WriteOptions:
    """Validate Spark's option map into WriteOptions; raise OptionError naming the option."""
    given = _sort(raw)
    if "table" not in given.values:
        raise OptionError(_TABLE_REQUIRED)
    texts = {**_DEFAULTS, **given.values}
    fields = {name: parse(name, texts[name]) for name, parse in _OPTIONS.items() if name in texts}
    for check in _CROSS_CHECKS:
        check(fields, texts)
    try:
        validate_properties(given.table_properties)
    except PropertyError as exc:
        raise OptionError(f"option 'property.{exc.name}': {exc}") from None
    checkpoint = given.checkpoint
    fields |= {
        "catalog_properties": given.catalog_properties,
        "table_properties": given.table_properties,
        "snapshot_properties": given.snapshot_properties,
        # Made absolute on the driver, where Spark resolves it too.
        "checkpoint_location": None if checkpoint is None else (checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)),
        "query_name": given.query_name,
    }
    return msgspec.convert(fields, WriteOptions)
