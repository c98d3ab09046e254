"""A per-table, per-host mutex shared by every process on the host (fcntl.flock).

LMDB serialises its own transactions, but a keyed change is lookup -> decide -> apply, and
two tasks must not both decide from the same lookup (both would hide the old row and both
would insert: a duplicate). Holding this lock around the three steps serialises per-key
changes across the tasks of a host.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


@contextmanager
def host_lock(path: str) -> Iterator[None]:
    # flock is per open file description, so threads of one process need their own lock too.
    with _guard:
        thread_lock = _thread_locks.setdefault(path, threading.Lock())
    with thread_lock:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
