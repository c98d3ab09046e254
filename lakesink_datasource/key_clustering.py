"""`cluster_by_key`: keyed writes whose key shards stay on their executor.

A keyed task resolves keys in its host's index. When any task may get any key, every host
must hold the whole index and follow every batch. `cluster_by_key` splits the key space
into shards (`pmod(xxhash64(keys), shards)`, computed by Spark, see index/key_shards.py) and
gives each Spark partition one shard, so a host holds only the shards its tasks get:

- On a streaming DataFrame the rows go through `applyInPandasWithState` grouped by shard.
  Spark runs a stateful operator's task where that partition's state store was last
  loaded (the state store coordinator), so a shard stays on its executor from batch to
  batch, and moves only when its executor goes. The keyed task's whole work runs inside
  that operator (rows cross into Python once; measured in
  benchmarks/experiments/key-route), and what reaches the lakesink sink is one commit
  message per shard: the sink commits them as one snapshot, as it commits its own tasks'.
- On a batch DataFrame the rows are repartitioned by shard, one shard per partition, and
  written by the sink's tasks as usual (batch jobs keep no state stores, so nothing pins a
  partition to an executor; each task still opens its one shard's index only).

A write routed to many tables (option `table_column`) is clustered the same way, by each
row's table key: the tables' keys differ in names and types and are only known once rows are
read, so the shard hashes each key field's text (from `key_column`, or the `primary_key`
fields of the payload; index/key_shards.py says how it stays exact). A shard's task then
writes its shard of every table it meets (routing/route_task.py), and the sink commits the
tables as an unclustered routed write does.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from lakesink_datasource.debezium.options import DebeziumOptions
from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.index.key_shards import (
    MAX_SHARDS,
    NO_SHARD,
    SHARD_BY_TEXT,
    SHARD_COLUMN,
    SHARD_KEY_COLUMNS,
    shard_values,
)
from lakesink_datasource.options import DEFAULT_WAREHOUSE, KEYED_OPERATIONS, OptionError, WriteOptions, parse_options
from lakesink_datasource.routing.route_options import RoutingOptions
from lakesink_datasource.schema.spark_types import SchemaError
from lakesink_datasource.table.setup import write_layout
from lakesink_datasource.write.routed_rows import RowCodec

__all__ = ["RESULT_COLUMN", "ClusteredStream", "cluster_by_key", "clustered_stream", "key_text_column"]

# The one column a clustered stream hands the sink: a keyed write's commit message per shard.
RESULT_COLUMN = "__lakesink_task_result"
_SPEC = "lakesink_routed_stream"  # the column's metadata key: what the sink needs to plan
# Options that only the commit uses: the sink may set them where cluster_by_key did not.
_COMMIT_ONLY = {"maintenance", "progress", "snapshot_properties", "checkpoint_location", "query_name", "new_checkpoint"}
_SPARK_OWNED = {"checkpointlocation", "queryname", "path"}  # what Spark itself passes a sink
log = logging.getLogger("lakesink")


class ClusteringError(LakesinkError, ValueError):
    """cluster_by_key cannot cluster this DataFrame as asked."""


def cluster_by_key(df: Any, *key_columns: str, shards: int | None = None, **options: str) -> Any:
    """`df` clustered by key shard for a keyed write with `options` (the write's options:
    `table`, `operation`, `warehouse` or a catalog, `sequence_column`, ...; `primary_key`
    defaults to `key_columns`, which must be the table's key, in its order). `shards`
    defaults to the executors' task slots (at most `spark.sql.shuffle.partitions`: a
    stream's partitions each hold one shard), so each shard keeps its executor. Write the result with `writeStream.format("lakesink")` (a
    stream: the sink takes the options given here) or `write.format("lakesink")` with the
    same options (a batch). Everything is checked here, before anything runs."""
    if any(k.lower() in ("table_column", "cdc_format") for k in options):
        if key_columns:
            raise ClusteringError(
                "cluster_by_key with option 'table_column' or 'cdc_format' clusters each row by its own table's key (from "
                f"'key_column' or each table's 'primary_key'): give no key columns (got {', '.join(key_columns)})"
            )
        return _cluster_tables(df, shards, options)
    if not key_columns:
        raise ClusteringError("cluster_by_key needs the key columns: cluster_by_key(df, 'id', table=..., operation='upsert', ...)")
    raw = _normalised(options, key_columns)
    parsed = parse_options(raw)
    if parsed.operation not in KEYED_OPERATIONS:
        raise OptionError(
            f"cluster_by_key is for keyed writes: give operation='upsert', 'cdc' or 'dedupe' (got {parsed.operation!r}); "
            "for appends, cluster_by_partition clusters rows by table partition"
        )
    key_types = _key_cast_types(df, parsed, key_columns)
    count, partitions = _shard_count(df, shards)
    clustered = df.withColumn(SHARD_COLUMN, _shard_column(key_columns, key_types, count, partitions if df.isStreaming else count))
    # The shard column names its key: a write of the clustered rows needs no primary_key option of its own.
    clustered = clustered.withMetadata(SHARD_COLUMN, {SHARD_KEY_COLUMNS: list(key_columns)})
    if not df.isStreaming:
        return clustered.repartition(count, SHARD_COLUMN)
    _check_stream_shards(count, partitions)
    if parsed.merge_schema or parsed.evolve_partition:
        raise OptionError(
            "cluster_by_key: options merge_schema and evolve_partition are not supported on a clustered stream (its tasks "
            "plan without the driver); evolve the table with one unclustered write first"
        )
    return _stateful_shards(clustered, raw, count)


def _shard_count(df: Any, shards: int | None) -> tuple[int, int]:
    """(the number of key shards, the session's shuffle partitions). By default one shard per
    task slot of the application's executors (at most the shuffle partitions): a stateful
    task waits for its executor only `spark.locality.wait.process`, so with more shards than
    slots a shard whose executor is still busy with another shard runs elsewhere, and that
    host then keeps a second copy of its index (benchmarks/experiments/shard-moves)."""
    spark = df.sparkSession
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    slots = task_slots(spark)
    if shards is None:
        if slots is None:
            log.warning(
                "cluster_by_key: cannot tell how many task slots the executors have (none registered yet, and neither "
                "spark.cores.max nor spark.executor.instances is set): %d key shards (spark.sql.shuffle.partitions); give "
                "shards= the executors' total cores so every shard keeps its executor", partitions)
        count = partitions if slots is None else min(partitions, slots)
    else:
        count = shards
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_SHARDS:
        raise OptionError(f"cluster_by_key: shards must be an integer between 1 and {MAX_SHARDS}, got {shards!r}")
    if slots is not None and count > slots and df.isStreaming:
        log.warning(
            "cluster_by_key: %d key shards on %d task slots: a shard whose executor is busy with another shard runs on "
            "another executor, which then keeps a copy of its index too; give shards=%d (the executors' total cores) or "
            "fewer", count, slots, slots)
    return count, partitions


def task_slots(spark: Any) -> int | None:
    """How many tasks the application's executors run at once: `spark.cores.max`, or
    `spark.executor.instances` x `spark.executor.cores` without dynamic allocation, or the
    cores of the executors registered now (a local master's threads); None when none of
    these is known (executors not registered yet, or a Spark Connect session without them)."""
    conf = spark.conf

    def number(key: str) -> int | None:
        value = conf.get(key, None)
        return int(value) if value is not None and str(value).strip().isdigit() and int(value) > 0 else None

    if (cores_max := number("spark.cores.max")) is not None:
        return cores_max
    dynamic = str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true"
    instances = number("spark.dynamicAllocation.maxExecutors") if dynamic else number("spark.executor.instances")
    if instances is not None:
        return instances * (number("spark.executor.cores") or 1)
    context = getattr(spark, "sparkContext", None)  # a Spark Connect session has none (an AttributeError)
    if context is None:
        return None
    local = _local_master_slots(str(context.master))
    if local is not None:
        return local
    if dynamic or conf.get("spark.default.parallelism", None) is not None:
        return None  # executors come and go, or defaultParallelism is the user's number, not the slots
    executors = context._jsc.sc().getExecutorMemoryStatus().size() - 1  # less the driver
    # A cluster's default parallelism is its registered executors' cores (at least 2).
    return int(context.defaultParallelism) if executors > 0 else None


def _local_master_slots(master: str) -> int | None:
    """The threads of `local`, `local[N]`, `local[*]`, `local[N, retries]`, and the cores of
    `local-cluster[workers, cores, memory]`; None for any other master."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master)
    if found is not None:
        threads = found.group(1)
        return 1 if threads is None else (os.cpu_count() or 1) if threads == "*" else int(threads)
    cluster = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    return int(cluster.group(1)) * int(cluster.group(2)) if cluster is not None else None


def _check_stream_shards(count: int, partitions: int) -> None:
    if importlib.util.find_spec("pandas") is None:  # PySpark's stateful operator refuses to run without it
        raise ClusteringError("cluster_by_key on a stream needs pandas (PySpark's applyInPandasWithState requires it): "
                         "pip install 'lakesink-datasource[cluster]'")
    if count > partitions:
        raise OptionError(
            f"cluster_by_key: shards={count} exceeds spark.sql.shuffle.partitions={partitions}; a stream's partitions each "
            "hold one shard: give at most that many shards, or raise spark.sql.shuffle.partitions before the query first runs"
        )


def _absolute_warehouse(options: Mapping[str, str]) -> dict[str, str]:
    """The options as the clustered tasks will parse them, on executors: the warehouse made
    absolute here (the executors' working directory differs)."""
    raw = {k: str(v) for k, v in options.items()}
    warehouse = next((k for k in raw if k.lower() == "warehouse"), None)
    raw[warehouse or "warehouse"] = os.path.abspath(raw[warehouse] if warehouse else DEFAULT_WAREHOUSE)
    return raw


def _normalised(options: Mapping[str, str], key_columns: tuple[str, ...]) -> dict[str, str]:
    """The options as the clustered tasks will parse them, the key spelled out."""
    raw = _absolute_warehouse(options)
    lowered = {k.lower(): k for k in raw}
    given = lowered.get("primary_key")
    if given is None:
        raw["primary_key"] = ",".join(key_columns)
    elif [c.strip().lower() for c in raw[given].split(",") if c.strip()] != [c.lower() for c in key_columns]:
        raise OptionError(
            f"cluster_by_key: the key columns ({', '.join(key_columns)}) differ from option 'primary_key' ({raw[given]}); "
            "cluster by exactly the primary key, in its order"
        )
    return raw


def _key_cast_types(df: Any, options: WriteOptions, key_columns: tuple[str, ...]) -> list[str]:
    """The Spark type each key column is cast to before hashing: its table column's (the
    index hashes the values as data files store them)."""
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        FixedType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
        TimestamptzType,
    )

    names = {f.name.lower(): f.name for f in df.schema.fields}
    for column in key_columns:
        if column.lower() not in names:
            raise SchemaError(f"cluster_by_key: key column '{column}' is not in the DataFrame (columns: {', '.join(df.columns)})")
    schema, _spec, _sources = write_layout(options, df.schema)
    identifier = [schema.find_column_name(i) or "" for i in sorted(schema.identifier_field_ids)]
    if identifier and [c.lower() for c in identifier] != [c.lower() for c in key_columns]:
        raise OptionError(
            f"cluster_by_key: the key columns ({', '.join(key_columns)}) differ from table {options.table}'s identifier "
            f"fields ({', '.join(identifier)}); cluster by exactly the table's key, in its order"
        )
    casts = []
    for column in key_columns:
        field = next(f for f in schema.fields if f.name.lower() == column.lower())
        t = field.field_type
        simple: dict[type, str] = {
            BooleanType: "boolean", IntegerType: "int", LongType: "bigint", DateType: "date", StringType: "string",
            BinaryType: "binary", FixedType: "binary", TimestampType: "timestamp_ntz", TimestamptzType: "timestamp",
        }
        cast = simple.get(type(t))
        if isinstance(t, DecimalType) and t.precision <= 18:
            cast = f"decimal({t.precision},{t.scale})"
        if cast is None:
            raise SchemaError(
                f"cluster_by_key: key column '{column}' has type {t}, which cannot be clustered (supported: boolean, int, "
                "long, date, timestamp, string, binary, decimal of up to 18 digits); write this table without cluster_by_key"
            )
        casts.append(cast)
    return casts


def _shard_column(key_columns: tuple[str, ...], casts: list[str], shards: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    hashed = F.xxhash64(*(F.col(f"`{c}`").cast(t) for c, t in zip(key_columns, casts)))
    values = shard_values(shards, partitions, key_columns)
    return F.element_at(F.array(*(F.lit(v) for v in values)), (F.pmod(hashed, F.lit(shards)) + 1).cast("int"))


def _cluster_tables(df: Any, shards: int | None, options: Mapping[str, str]) -> Any:
    """A DataFrame routed to many tables (`table_column`), clustered by each row's table key."""

    from lakesink_datasource.routing.route_plan import plan_routed_write

    raw = _absolute_warehouse(options)
    routing = plan_routed_write(raw, df.schema, overwrite=False).options  # refuses bad options and columns
    count, partitions = _shard_count(df, shards)
    if routing.debezium is not None:
        # Debezium's events say their tables and keys: each record goes by its message key.
        return _clustered(df, debezium_key_texts(routing.debezium, df.schema), count, partitions, raw)
    common = routing.table_options(f"{routing.namespace or 'routed'}.any_table")
    if common.operation not in KEYED_OPERATIONS:
        raise OptionError(
            f"cluster_by_key is for keyed writes: give operation='upsert', 'cdc' or 'dedupe' (got {common.operation!r})"
        )
    appended = sorted(t for t in routing.per_table if routing.table_options(t).operation not in KEYED_OPERATIONS)
    if appended:
        raise OptionError(
            f"cluster_by_key clusters keyed writes: table(s) {', '.join(appended)} are given a non-keyed operation; write "
            "them with a query of their own, or give them operation upsert, cdc or dedupe"
        )
    if routing.key_column is None and not common.primary_key:
        raise OptionError(
            "cluster_by_key with option 'table_column' clusters each row by its table's key: give option 'key_column' (each "
            "row's key, such as Debezium's message key) or 'primary_key' (each table's key columns; "
            "'tables.<namespace>.<table>.primary_key' for a table of its own)"
        )
    return _clustered(df, key_text_column(routing, df.schema), count, partitions, raw)


def _clustered(df: Any, texts: Any, count: int, partitions: int, raw: dict[str, str]) -> Any:
    """`df` with a text shard of the key texts `texts` (null: no key, NO_SHARD)."""
    from pyspark.sql import functions as F

    values = shard_values(count, partitions if df.isStreaming else count, None)
    shard = F.element_at(F.array(*(F.lit(v) for v in values)), (F.pmod(F.xxhash64(texts), F.lit(count)) + 1).cast("int"))
    # NO_SHARD for a row whose table has no key option: its task refuses it, naming the fix
    # (a non-null shard crosses the stateful operator as it is).
    clustered = df.withColumn(SHARD_COLUMN, F.coalesce(F.when(texts.isNotNull(), shard), F.lit(NO_SHARD)))
    clustered = clustered.withMetadata(SHARD_COLUMN, {SHARD_BY_TEXT: True})
    if not df.isStreaming:
        return clustered.repartition(count, SHARD_COLUMN)
    _check_stream_shards(count, partitions)
    return _stateful_shards(clustered, raw, count, tables=True)


def debezium_key_texts(debezium: DebeziumOptions, schema: Any) -> Any:
    """Each record's message key as the texts of its fields, ordered by lower-cased name: the
    key's `payload` with JsonConverter's wrapper, the key itself without it, a struct's
    fields. Null for a record without a key (a truncate, a table without a primary key)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    column = F.col(f"`{debezium.key_column}`")
    kind = {f.name: f.dataType for f in schema.fields}[debezium.key_column]
    text = F.to_json(column) if isinstance(kind, StructType) else column.cast("string")
    fields = F.from_json(F.coalesce(F.get_json_object(text, "$.payload"), text), "map<string,string>")
    lowered = F.transform_keys(fields, lambda k, _v: F.lower(k))
    return F.transform(F.array_sort(F.map_entries(lowered)), lambda e: e["value"])


def key_text_column(routing: RoutingOptions, schema: Any) -> Any:
    """Each row's key as the texts of its fields, ordered by lower-cased field name (a text
    shard's hash input, see index/key_shards.py): the `key_column`'s fields, or the fields its
    table's `primary_key` names in the payload (or the row). Null when the row's table has
    no key option."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    types = {f.name: f.dataType for f in schema.fields}

    def as_text_map(column: str) -> Any:
        # Every field as its JSON text: a number's digits, a string's characters, true/false.
        source = F.col(f"`{column}`")
        text = source if isinstance(types[column], StringType) else F.to_json(source)
        return F.transform_keys(F.from_json(text, "map<string,string>"), lambda k, _v: F.lower(k))

    # A top-level column (op, sequence, or any other shared one) wins over a payload's or
    # key's field of its name, as it does in each table's row (routing/route_rows.py).
    carried = {routing.table_column, routing.payload_column, routing.key_column}
    shared = {f.name.lower(): f.name for f in schema.fields if f.name not in carried}

    def shared_text(name: str) -> Any:
        return F.col(f"`{shared[name.lower()]}`").cast("string")

    if routing.key_column is not None:
        def field_text(e: Any) -> Any:
            value = e["value"]
            for lowered in shared:
                value = F.when(e["key"] == F.lit(lowered), shared_text(lowered)).otherwise(value)
            return value

        entries = F.map_entries(as_text_map(routing.key_column))
        return F.transform(F.array_sort(entries), field_text)
    payload = as_text_map(routing.payload_column) if routing.payload_column is not None else None

    def pick(names: tuple[str, ...]) -> Any:
        ordered = sorted(names, key=str.lower)
        if payload is not None:
            return F.array(*(shared_text(n) if n.lower() in shared else F.element_at(payload, F.lit(n.lower())) for n in ordered))
        return F.array(*(F.col(f"`{n}`").cast("string") for n in ordered))

    name = F.col(f"`{routing.table_column}`")
    table = name if routing.namespace is None else F.when(name.contains("."), name).otherwise(F.concat(F.lit(f"{routing.namespace}."), name))
    common = routing.table_options(f"{routing.namespace or 'routed'}.any_table").primary_key
    texts = pick(common) if common else F.lit(None).cast("array<string>")
    for identifier in routing.per_table:
        own = routing.table_options(identifier).primary_key
        if own:
            texts = F.when(table == F.lit(identifier), pick(own)).otherwise(texts)
    return texts


def _stateful_shards(clustered: Any, raw: dict[str, str], shards: int, *, tables: bool = False) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout
    from pyspark.sql.types import BinaryType, StructField, StructType

    codec = RowCodec(clustered.schema)  # a column it cannot carry exactly is refused here
    data_schema = clustered.schema.json()
    spec = {"options": raw, "schema": data_schema, "shards": shards, "tables": tables}
    output = StructType([StructField(RESULT_COLUMN, BinaryType(), False, metadata={_SPEC: spec})])
    encoded = codec.encode(clustered)
    writer = _TablesShardWriter(raw, data_schema) if tables else _ShardWriter(raw, data_schema)
    return encoded.groupBy(SHARD_COLUMN).applyInPandasWithState(writer, output, "unused int", "append", GroupStateTimeout.NoTimeout)


class _ShardWriter:
    """The function the stateful operator runs per shard and micro-batch, on an executor:
    plan against the table, write the shard's rows through its host's index, and hand on
    the commit message. Picklable: options and schema travel as plain values."""

    def __init__(self, raw: dict[str, str], data_schema: str) -> None:
        self.raw = raw
        self.data_schema = data_schema

    def __call__(self, key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        import pandas as pd
        from pyspark.sql.types import StructType

        from lakesink_datasource.table.setup import plan_clustered_task
        from lakesink_datasource.worker_gc import settle_imports
        from lakesink_datasource.write.task import write_task

        settle_imports()
        schema = StructType.fromJson(json.loads(self.data_schema))
        codec = RowCodec(schema)
        plan = plan_clustered_task(parse_options(self.raw), schema, _execution_write_id())
        message = write_task(plan, (codec.decode(frame) for frame in frames))
        yield pd.DataFrame({RESULT_COLUMN: [message.payload]})


class _TablesShardWriter(_ShardWriter):
    """A shard's task of a write routed to many tables: the shard of every table its rows
    name, written as routing/route_task.py writes a task's tables; one message for them all."""

    def __call__(self, key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        import pandas as pd
        from pyspark.sql.types import StructType

        from lakesink_datasource.routing.route_options import parse_routing
        from lakesink_datasource.routing.route_plan import RoutedWrite
        from lakesink_datasource.routing.route_task import write_routed_task
        from lakesink_datasource.worker_gc import settle_imports

        settle_imports()
        codec = RowCodec(StructType.fromJson(json.loads(self.data_schema)))
        write = RoutedWrite(options=parse_routing(self.raw), write_id=_execution_write_id())
        message = write_routed_task(write, (codec.decode(frame) for frame in frames))
        shard = ShardTables(message.tables, message.skipped, message.change_logs, message.truncates, message.sources)
        yield pd.DataFrame({RESULT_COLUMN: [msgspec.msgpack.encode(shard)]})


class ShardTables(msgspec.Struct, array_like=True):
    """What a shard's task of a write routed to many tables hands the sink: every table it
    wrote (identifier, pickled plan, task result) and, with cdc_format, what it skipped."""

    tables: list[tuple[str, bytes, bytes]]
    skipped: dict[str, int] = {}
    change_logs: list[str] = []
    truncates: dict[str, bytes] = {}
    sources: dict[str, list[str | None]] = {}  # cdc_format: table -> its source table


def _execution_write_id() -> str:
    """One id for every task of one execution of a micro-batch (Spark's query execution id,
    new when a restarted query runs the batch again): the tasks' undo tokens and the
    snapshot's write id must name the same write."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise ClusteringError("a clustered keyed task found no Spark query execution id; it runs only inside a streaming query")
    execution = ctx.getLocalProperty("spark.sql.execution.query.id")
    if execution:
        return uuid.UUID(execution).hex
    # PySpark 4.0 and 4.1 set no query execution id: the query run's id (Spark's job group,
    # new when a restarted query runs a batch again) and the SQL execution id (new for each
    # execution within a run) name the execution as well.
    run, sql_execution = ctx.getLocalProperty("spark.jobGroup.id"), ctx.getLocalProperty("spark.sql.execution.id")
    if not run or not sql_execution:
        raise ClusteringError("a clustered keyed task found no Spark query execution id; it runs only inside a streaming query")
    return uuid.uuid5(uuid.NAMESPACE_URL, f"lakesink:{run}:{sql_execution}").hex


@dataclass(frozen=True)
class ClusteredStream:
    """What the sink of a clustered stream plans with: the options cluster_by_key got (with
    commit-only options the sink adds) and the schema of the rows the tasks wrote."""

    options: dict[str, str]
    data_schema: Any
    shards: int
    tables: bool = False  # routed to many tables (table_column): the tasks' messages name them


def clustered_stream(schema: Any, sink_options: Mapping[str, str]) -> ClusteredStream | None:
    """The clustered stream behind a sink's input schema, or None when it is not one. Options
    given to the sink too must agree with cluster_by_key's (its tasks wrote with those)."""
    from pyspark.sql.types import StructType

    if len(schema.fields) != 1 or schema.fields[0].name != RESULT_COLUMN:
        return None
    spec = schema.fields[0].metadata.get(_SPEC)
    if spec is None:
        return None
    if spec.get("tables"):
        return _routed_tables(spec, sink_options)
    raw = {k.lower(): v for k, v in spec["options"].items()}
    merged = {**raw, **{k.lower(): v for k, v in sink_options.items()}}
    tasks, combined = parse_options(raw), parse_options(merged)
    differing = sorted(
        name for name in WriteOptions.__struct_fields__
        if name not in _COMMIT_ONLY and getattr(tasks, name) != getattr(combined, name)
    )
    if differing:
        raise OptionError(
            f"option(s) {', '.join(differing)} given to writeStream differ from cluster_by_key's, whose options the clustered "
            "tasks wrote with: give them to cluster_by_key only (the sink may add maintenance, progress, "
            "snapshot_property.* and checkpointLocation)"
        )
    return ClusteredStream(merged, StructType.fromJson(json.loads(spec["schema"])), int(spec["shards"]))


def _routed_tables(spec: Mapping[str, Any], sink_options: Mapping[str, str]) -> ClusteredStream:
    """A stream cluster_by_key clustered, routed to many tables: its tasks planned every table with
    cluster_by_key's options, so the sink takes none but Spark's own (checkpointLocation)."""
    from pyspark.sql.types import StructType

    given = {k.lower(): v for k, v in spec["options"].items()}
    differing = sorted(
        k for k, v in sink_options.items() if k.lower() not in _SPARK_OWNED and given.get(k.lower()) != str(v)
    )
    if differing:
        raise OptionError(
            f"option(s) {', '.join(differing)} given to writeStream differ from cluster_by_key's: a stream routed to many "
            "tables is written with the options given to cluster_by_key; give them there"
        )
    return ClusteredStream(dict(spec["options"]), StructType.fromJson(json.loads(spec["schema"])), int(spec["shards"]), tables=True)
