"""What a streaming query's Spark checkpoint says it has committed.

Spark hands a stream's `checkpointLocation` to the sink with its options. Its `commits/`
folder holds one file per micro-batch Spark considers done, named by the batch id: a query
that has any will never write those batches again. Its `metadata` file names the query.
"""

from __future__ import annotations

import json
import logging
import os
from urllib.parse import urlparse

log = logging.getLogger("lakesink")


def committed_batches(checkpoint: str) -> list[int]:
    """The batch ids the checkpoint records as committed, ascending (empty when there is no
    such checkpoint yet, or it is on a file system lakesink cannot read from the driver)."""
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        log.info("lakesink: checkpoint %s is not on a local file system; its committed batches are not checked", checkpoint)
        return []
    folder = os.path.join(parsed.path if parsed.scheme else checkpoint, "commits")
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if n.isdigit())


def checkpoint_query_id(checkpoint: str) -> str | None:
    """The id of the streaming query whose checkpoint this is: Spark writes it to the
    checkpoint's `metadata` file when the query first starts, before any batch, and keeps it
    for every restart from that checkpoint (None when it cannot be read from the driver)."""
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return None
    path = os.path.join(parsed.path if parsed.scheme else checkpoint, "metadata")
    try:
        with open(path, encoding="utf-8") as f:
            # One JSON object on the first line (Spark's StreamMetadata), e.g. {"id":"..."}.
            found = json.loads(f.readline()).get("id")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, str) and found else None
