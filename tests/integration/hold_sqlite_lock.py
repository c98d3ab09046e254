"""Hold an exclusive lock on a SQLite database from another process, as a backup tool or a
second application would.

usage: hold_sqlite_lock.py DB SECONDS READY_FILE
Takes `BEGIN EXCLUSIVE` (readers and writers of the file get "database is locked" once
their busy wait runs out), writes READY_FILE, holds the lock for SECONDS, then rolls back.
Run it detached (`start` below): the caller returns once the lock is held.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time


def hold(db: str, seconds: float, ready: str) -> None:
    con = sqlite3.connect(db, isolation_level=None, timeout=30)
    con.execute("BEGIN EXCLUSIVE")
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)  # the fault itself: a lock held this long
    con.execute("ROLLBACK")
    con.close()


def start(db: str, seconds: float, ready: str) -> None:
    """Start a detached holder and return once it holds the lock."""
    proc = subprocess.Popen([sys.executable, __file__, db, str(seconds), ready], start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the lock holder did not take the lock on {db}")
        time.sleep(0.05)


if __name__ == "__main__":
    if sys.argv[1] == "--start":
        start(sys.argv[2], float(sys.argv[3]), sys.argv[4])
    else:
        hold(sys.argv[1], float(sys.argv[2]), sys.argv[3])
