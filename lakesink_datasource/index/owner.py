"""Who resolves a key: a host's key index, and the names its work is known by.

A host is the pair (machine, index directory): two Spark workers on one machine, each with
its own HOME or `index_dir`, keep two indexes and are two hosts. Undo tokens
(`<write id>/<host>/<task>/<attempt>`) say which write and task attempt changed the index,
and the files a keyed task reports its deletes in carry the host's digest, so a host
catching up a batch made on several hosts can tell its own part from the others'.
"""

from __future__ import annotations

import hashlib
import os
import socket

from lakesink_datasource.iceberg.summary_keys import task_attempt
from lakesink_datasource.index.key_shards import SHARD_NAME_PREFIXES


def index_owner(path: str) -> str:
    """Names the index a task resolves its keys in: the host, plus a short digest of the
    index's directory. No ',' or '/': the names are listed in a snapshot summary and inside
    undo tokens."""
    digest = hashlib.sha1(os.path.realpath(path).encode()).hexdigest()[:8]
    host = f"{socket.gethostname().replace(',', '_').replace('/', '_')}:{digest}"
    # An index of one key shard says which, in progress lines and summaries.
    name = os.path.basename(path.rstrip(os.sep))
    for prefix in SHARD_NAME_PREFIXES:
        shard = name.partition(f".{prefix}")[2]
        if shard:
            return f"{host}#{prefix.removeprefix('key-')}{shard}"
    return host


def owner_digest(owner: str) -> str:
    """A short name of `owner` safe inside a file name."""
    return hashlib.sha1(owner.encode()).hexdigest()[:10]


def default_index_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lakesink", "index")


def token_for(write_id: str, host: str, partition_id: int, attempt: int) -> str:
    return f"{write_id}/{host}/{partition_id}/{attempt}"


def write_of(token: str) -> str:
    return token.split("/", 1)[0]


def task_attempt_of(token: str) -> str:
    """`<task>.<attempt>` of a token, as a snapshot lists the attempts it committed."""
    _write, _host, partition, attempt = token.rsplit("/", 3)
    return task_attempt(int(partition), int(attempt))
