"""The options of a write routed to many tables, split from the options of each table.

`table_column` names the column holding each row's table (`namespace.table`, or a bare name
completed with `namespace`); `payload_column` a column holding the table's row (a JSON
string, a struct or a map) beside the columns shared by every table (op, sequence);
`key_column` a column holding each row's key (Debezium's message key: a JSON string, a struct
or a map), whose fields are the row's key columns and, for a keyed table lakesink creates,
its primary key; `create_tables` whether a table that does not exist is created from its first rows;
`commit_tables` whether a batch's tables land together where the catalog can (`together`,
the default) or one after another (`in_turn`).
Every other option applies to each table, and `tables.<namespace>.<table>.<option>` to one
(its keys, partitioning...). Parsed on the driver, before anything is written: each table's
options are checked when the table is first met, with the table's name filled in.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from lakesink_datasource.debezium.options import DEBEZIUM_OPTIONS, DebeziumOptions, parse_debezium
from lakesink_datasource.options import OptionError, WriteOptions, bool_option, parse_options

ROUTING_OPTIONS = ("table_column", "namespace", "payload_column", "key_column", "create_tables", "commit_tables")
COMMIT_MODES = ("together", "in_turn")
_PER_TABLE = "tables."
# What a routed write does not do (it appends or writes by key, on main, with the layout a
# table has): refused by name, for every table and each table's own.
_NOT_ROUTED = ("branch", "replace_where", "overwrite_mode", "evolve_partition")
# Options a routed write decides for every table at once: one value for all of them.
_SHARED_ONLY = ("table", "path", "txn_app_id", "txn_version", "op_column", "sequence_column", "index_dir", "warehouse", "catalog")


class RoutingOptions(msgspec.Struct, frozen=True, kw_only=True):
    table_column: str  # "" with cdc_format: the events name their tables
    namespace: str | None = None
    payload_column: str | None = None
    key_column: str | None = None
    create_tables: bool = True
    commit_tables: str = "together"
    common: dict[str, str] = {}  # options for every table, as Spark gave them
    per_table: dict[str, dict[str, str]] = {}  # table identifier -> its own options
    # cdc_format=debezium: the records are Debezium's, read from Spark's Kafka columns.
    debezium: DebeziumOptions | None = None

    def table_options(self, identifier: str, derived: Mapping[str, str] | None = None, without: tuple[str, ...] = ()) -> WriteOptions:
        """The write options of one table: the common ones, its own over them, and what its
        events decide (`derived`: with cdc_format, its key, op and order) over both; options
        named in `without` left out (what a change log cannot take)."""
        given = self._given(identifier)
        raw = {**{k: v for k, v in given.items() if k.lower() not in without}, **(derived or {}), "table": identifier}
        try:
            return parse_options(raw)
        except OptionError as exc:
            how = "cdc_format=debezium" if self.debezium is not None else f"routed by '{self.table_column}'"
            raise OptionError(f"table {identifier} ({how}): {exc}") from None

    def keeps_history(self, identifier: str) -> bool:
        """Whether the table's options (its own over the common ones) ask for history=true."""
        given = {k.lower(): v for k, v in self._given(identifier).items()}
        return "history" in given and bool_option("history", given["history"])

    def _given(self, identifier: str) -> dict[str, str]:
        """The options given for the table: its own over the common ones."""
        return {**self.common, **self.per_table.get(identifier, {})}

    def identifier(self, name: str) -> str:
        """`name` as `namespace.table`; a bare name takes option `namespace`."""
        if "." in name:
            return name
        if self.namespace is None:
            raise OptionError(
                f"column '{self.table_column}' names table {name!r} without a namespace: give option 'namespace' "
                "for bare names, or write 'namespace.table' in the column"
            )
        return f"{self.namespace}.{name}"


def is_routed(raw: Mapping[str, str]) -> bool:
    return any(key.lower() in ("table_column", "cdc_format") for key in raw)


def parse_routing(raw: Mapping[str, str]) -> RoutingOptions:
    """Split Spark's option map into the routing options, the common table options and each
    table's own; refuse what cannot apply (naming the option) before anything runs."""
    routing: dict[str, str] = {}
    common: dict[str, str] = {}
    per_table: dict[str, dict[str, str]] = {}
    debezium = parse_debezium(raw) if any(k.lower() == "cdc_format" for k in raw) else None
    for key, value in raw.items():
        name = key.lower()
        if debezium is not None and name in DEBEZIUM_OPTIONS:
            continue  # the format's own (DebeziumOptions)
        if name in ROUTING_OPTIONS:
            routing[name] = value
        elif name.startswith(_PER_TABLE):
            identifier, _, option = key[len(_PER_TABLE) :].rpartition(".")
            if not identifier or "." not in identifier or not option:
                raise OptionError(
                    f"option '{key}': a table's own option is 'tables.<namespace>.<table>.<option>', e.g. "
                    "'tables.db.orders.primary_key'"
                )
            if option.lower() in _SHARED_ONLY:
                raise OptionError(f"option '{key}': '{option}' applies to the whole routed write; give it once, not per table")
            per_table.setdefault(identifier, {})[option] = value
        else:
            common[key] = value
    for key in [*common, *(f"tables.{t}.{o}" for t, opts in per_table.items() for o in opts)]:
        if key.lower().rsplit(".", 1)[-1] in _NOT_ROUTED:
            raise OptionError(
                f"option '{key}' cannot be used with 'table_column': a routed write appends or writes by key to each "
                "table's main branch, with the partitioning it has; write that table on its own"
            )
    column = routing.get("table_column", "").strip()
    if not column and debezium is None:
        raise OptionError("option 'table_column' names the column holding each row's table, e.g. 'table'")
    clashing = sorted(k for k in common if k.lower() in ("table", "path", "txn_app_id", "txn_version"))
    if clashing:
        raise OptionError(
            f"option '{clashing[0]}' cannot be given with 'table_column': each row names its table "
            "(a batch write routed to many tables is exactly once per table by its own commit)"
        )
    namespace = routing.get("namespace", "").strip() or None
    if namespace is not None and any(not part.strip() for part in namespace.split(".")):
        raise OptionError(f"option 'namespace' must have no empty part, got {namespace!r}")
    commit_tables = routing.get("commit_tables", "together").strip().lower()
    if commit_tables not in COMMIT_MODES:
        raise OptionError(f"option 'commit_tables' must be one of {', '.join(COMMIT_MODES)}, got {commit_tables!r}")
    options = RoutingOptions(
        table_column=column, commit_tables=commit_tables, namespace=namespace, payload_column=routing.get("payload_column", "").strip() or None,
        key_column=routing.get("key_column", "").strip() or None if debezium is None else None,
        create_tables=bool_option("create_tables", routing["create_tables"]) if "create_tables" in routing else True,
        common=common, per_table=per_table, debezium=debezium,
    )
    # Every table's options are parsed now, so a bad one fails before anything is written;
    # a table met later without options of its own gets the common ones, checked here too.
    for identifier in [*per_table, f"{namespace or 'routed'}.any_table"]:
        options.table_options(identifier)
    return options
