"""A stream that starts again from a new checkpoint, under the name of one that wrote the table.

lakesink's exactly-once bookkeeping is per streaming query id (table/idempotency.py), and
Spark keeps a query's id in its checkpoint. A new checkpoint (a pipeline's `--full-refresh-all`,
which gives the flow a new one; a user who deletes a checkpoint to start over) is therefore a
new query, and its source sends every row again from the start: appended, each would be in
the table twice. What the old and the new checkpoint share is the query's name
(`writeStream.queryName`, which a pipeline sets to the flow's name). So each streaming commit
of a named query records, in the table property `lakesink.stream.<name>`, the id of the
query writing under that name; the first batch of another id under the name meets option
`new_checkpoint`:

- `refuse` (the default): the batch fails before anything is written, saying what to choose;
- `replace`: the table is emptied in a snapshot of its own, which records the new id, and the
  batch then writes as usual: the table holds what the new checkpoint's query writes, as a
  pipeline's own tables do after a full refresh (readers see it empty in between, as they see
  those);
- `append`: the rows are added to what is there, as a write with no checkpoint check does.

Planning decides (the driver reads the id from the checkpoint's `metadata` file); the commit
checks again with the id the tasks report, so a checkpoint the driver cannot read (not on a
local file system) is refused rather than appended twice.
"""

from __future__ import annotations

from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.options import WriteOptions
from lakesink_datasource.table.checkpoint import checkpoint_query_id
from lakesink_datasource.table.idempotency import last_committed_epoch

STREAM_PREFIX = "lakesink.stream."
NEW_CHECKPOINT_SUMMARY = "lakesink.new-checkpoint"  # on the snapshot that emptied the table


class NewCheckpointRefused(LakesinkError, RuntimeError):
    """The first batch of a new checkpoint would write rows the table already holds."""


class ContentsToReplace(Exception):  # a signal to the planner's caller, not an error
    """Planning stopped: the table must be emptied for a new checkpoint (`replace`) before the
    batch is planned against it; the caller empties it and plans again."""

    def __init__(self, query_name: str, query_id: str, previous: str) -> None:
        super().__init__(f"query {query_name!r}: new checkpoint {query_id} after {previous}")
        self.query_name, self.query_id, self.previous = query_name, query_id, previous


def stream_property(query_name: str) -> str:
    return f"{STREAM_PREFIX}{query_name}"


def recorded_query(metadata: TableMetadata, query_name: str) -> str | None:
    """The id of the query that last wrote the table under `query_name`."""
    return metadata.properties.get(stream_property(query_name))


def new_checkpoint_of(metadata: TableMetadata, query_name: str | None, query_id: str | None) -> str | None:
    """The id of the query that wrote under `query_name` before, when `query_id` is a new
    checkpoint's query under that name that has not written the table yet; else None."""
    if not query_name or not query_id:
        return None
    previous = recorded_query(metadata, query_name)
    if previous is None or previous == query_id:
        return None
    if last_committed_epoch(metadata, query_id) is not None:
        # This id wrote here already: two live queries share the name (in two sessions),
        # neither is starting over.
        return None
    return previous


def refusal(options: WriteOptions, query_id: str, previous: str, *, unreadable: bool = False) -> NewCheckpointRefused:
    why = (
        f" (new_checkpoint=replace needs the driver to read the checkpoint's metadata, and {options.checkpoint_location} "
        "is not on a local file system: empty the table yourself, e.g. with a batch overwrite, then set new_checkpoint=append)"
        if unreadable else ""
    )
    return NewCheckpointRefused(
        f"table {options.table} was written by streaming query {options.query_name!r} from another checkpoint (query id "
        f"{previous}); this is its first batch from checkpoint {options.checkpoint_location} (query id {query_id}), whose "
        "source sends its rows again from the start. Nothing was written. Set option new_checkpoint to 'replace' to make "
        "this batch replace the table's contents (what a pipeline's --full-refresh-all means), or to 'append' to add its rows "
        f"to the table's (rows already there land twice); or restart from the old checkpoint{why}"
    )


def check_planned_stream(options: WriteOptions, metadata: TableMetadata, *, overwrite: bool) -> None:
    """At planning: raise NewCheckpointRefused (`refuse`) or ContentsToReplace (`replace`) for
    the first batch of a new checkpoint of a query name that wrote the table."""
    name = options.query_name
    if overwrite or name is None or options.checkpoint_location is None or options.new_checkpoint == "append":
        return  # complete mode replaces the table at every batch: nothing lands twice
    if recorded_query(metadata, name) is None:
        return  # the common case, decided without reading the checkpoint
    query_id = checkpoint_query_id(options.checkpoint_location)
    previous = new_checkpoint_of(metadata, name, query_id)
    if previous is None or query_id is None:
        return
    if options.new_checkpoint != "replace":
        raise refusal(options, query_id, previous)
    others = sorted(
        key[len(STREAM_PREFIX):] for key in metadata.properties if key.startswith(STREAM_PREFIX) and key != stream_property(name)
    )
    if others:
        raise NewCheckpointRefused(
            f"option new_checkpoint=replace would empty table {options.table} for streaming query {name!r}, but streaming "
            f"queries {', '.join(repr(o) for o in others)} write it too and their rows would go with it. Nothing was "
            "written. Give each query a table of its own to replace, or set new_checkpoint=append"
        )
    raise ContentsToReplace(name, query_id, previous)
