"""What a host's pending undo tokens become once the table's history says what committed.

A keyed task writes its changes into its host's index under a token
(`<write id>/<host>/<task>/<attempt>`, `owner.token_for`) and the undo log keeps them
until the table shows whether the batch landed. A sync settles them: an earlier attempt
of the same task never lands (a retried task must not see its failed attempt's rows), a
write absent from the history since the index's state never landed, and of a batch that
did land, only the task attempts its snapshot lists (`lakesink.task-attempts`) did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pyiceberg.table.snapshots import Snapshot

from lakesink_datasource.iceberg.summary_keys import HOSTS, WRITE_ID, listed_task_attempts
from lakesink_datasource.index.owner import task_attempt_of, token_for, write_of
from lakesink_datasource.index.sharded_index import ShardedIndex


def roll_back_earlier_attempts(index: ShardedIndex, write_id: str, host: str, partition_id: int, attempt: int) -> None:
    """Undo what earlier attempts of this very task left in the index."""
    mine = token_for(write_id, host, partition_id, attempt)
    stale = [t for t in index.pending_tokens() if t != mine and t.startswith(f"{write_id}/{host}/{partition_id}/")]
    if stale:
        index.rollback_tokens(stale)


def committed_writes(path: Iterable[Snapshot]) -> set[str]:
    """The write ids the snapshots of `path` committed."""
    return {s.summary.additional_properties[WRITE_ID] for s in path if s.summary and WRITE_ID in s.summary.additional_properties}


def roll_back_uncommitted(index: ShardedIndex, current_write: str, committed: set[str]) -> None:
    """Undo tokens of writes that are neither the current one nor known to be committed."""
    doomed = [t for t in index.pending_tokens() if write_of(t) not in committed and write_of(t) != current_write]
    if doomed:
        index.rollback_tokens(doomed)


@dataclass(frozen=True)
class OwnPart:
    """This host's part of the batch a snapshot committed, settled: `tokens` committed (their
    changes are in the index already), `only_here` when no other host took part."""

    tokens: list[str]
    only_here: bool


def settle_own_part(index: ShardedIndex, pending: list[str], snapshot: Snapshot, host: str) -> OwnPart | str:
    """Commit the tokens of this host's task attempts that `snapshot` committed and roll back
    those of attempts it did not list; the reason to start over when that cannot be told."""
    props = snapshot.summary.additional_properties if snapshot.summary else {}
    tokens = [t for t in pending if write_of(t) == props.get(WRITE_ID)]
    hosts = set(filter(None, props.get(HOSTS, "").split(",")))
    if not tokens:
        return OwnPart([], only_here=False)
    listed = listed_task_attempts(props)
    if listed is not None:
        # Attempts lost with their executor (another host ran the task again) never
        # committed: only the attempts the snapshot lists did.
        lost = [t for t in tokens if task_attempt_of(t) not in listed]
        if lost:
            index.rollback_tokens(lost)
        tokens = [t for t in tokens if task_attempt_of(t) in listed]
    elif not hosts <= {host}:
        return f"snapshot {snapshot.snapshot_id} is a batch of an earlier lakesink made on several hosts"
    index.commit_tokens(tokens)
    return OwnPart(tokens, only_here=hosts <= {host})
