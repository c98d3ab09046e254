"""Per-table, per-host mutexes shared by every process on the host (fcntl.flock).

LMDB serialises its own transactions, but a keyed change is lookup -> decide -> apply, and
two tasks must not both decide from the same lookup (both would hide the old row and both
would insert: a duplicate). Holding a lock around the three steps serialises per-key
changes across the tasks of a host. The key index has one lock per shard (a key lives in
exactly one shard), so tasks working in different shards do not wait for each other;
whatever touches every shard (sync, rollback) holds all of them.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


@contextmanager
def host_lock(path: str, *, blocking: bool = True) -> Iterator[bool]:
    """Hold the lock file at `path`; yields False (holding nothing) when `blocking` is off
    and another thread or process holds it."""
    # flock is per open file description, so threads of one process need their own lock too.
    with _guard:
        thread_lock = _thread_locks.setdefault(path, threading.Lock())
    if not thread_lock.acquire(blocking=blocking):
        yield False
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                locked = True
            except BlockingIOError:
                locked = False
            try:
                yield locked
            finally:
                if locked:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        thread_lock.release()


@contextmanager
def host_locks(paths: Sequence[str]) -> Iterator[None]:
    """Hold every lock of `paths`, taken in sorted order so that two holders of several
    locks cannot deadlock (a holder of one lock never waits for another)."""
    with ExitStack() as stack:
        for path in sorted(paths):
            stack.enter_context(host_lock(path))
        yield
