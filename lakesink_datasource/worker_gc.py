"""Keep Spark's per-invocation garbage collection cheap in reused Python workers.

pyspark's daemon runs a full `gc.collect()` in a reused worker after every task, plan and
commit. A full collection walks every container object the process holds, and a worker that
imported pyspark, pyarrow, pyiceberg and lakesink holds about 150,000 of them before doing
any work: each such collection took 50 to 200 ms on the 2-core benchmark machine, once per
worker per micro-batch, and the next batch waits for it. Those objects (modules, classes,
functions, constants) live as long as the process, so lakesink moves them into the
collector's permanent generation (`gc.freeze()`) at the start of a process's first three
invocations, after which the daemon's collections only walk what was created since.

Whatever is alive at that moment (and any cycle already garbage then) is never collected as
part of a reference cycle any more (reference counting still frees what it can). That
happens three times per process, so at most the objects of three invocations are kept:
bounded. `LAKESINK_GC_FREEZE=0` in the workers' environment turns it off.
"""

from __future__ import annotations

import gc
import os

_FREEZES = 3  # invocations per process whose imports are frozen: modules imported lazily by
# the first ones (Parquet, LMDB, the catalog's drivers) are caught by the next
_freezes: dict[int, int] = {}  # pid -> freezes done (a forked child starts again)


def settle_imports() -> None:
    """Freeze the objects alive now into the permanent generation, for the first few
    invocations of each process."""
    pid = os.getpid()
    done = _freezes.get(pid, 0)
    if done >= _FREEZES or os.environ.get("LAKESINK_GC_FREEZE", "1") == "0":
        return
    _freezes[pid] = done + 1
    # No collection first: imports leave no garbage (measured: none found) and the daemon
    # collected after the previous invocation, while a collection of a process that has just
    # imported pyiceberg walks ~110,000 objects: ~60 ms on a fresh process's first batch, in
    # each role.
    gc.freeze()
