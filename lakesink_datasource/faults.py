"""Fault-injection points, so tests can crash the job exactly where exactly-once matters.

Off unless the environment variable LAKESINK_FAULTS names a JSON file. The file is read
at each point (a point fires a handful of times per batch, so the cost is nil), which
lets a test arm a fault after Spark's processes have started. Format:

    [{"point": "after_commit", "batch": 2, "action": "kill"}]

points: "task_files_written" (a task wrote its files, before returning its message),
"before_commit" (driver commit, before the catalog commit), "after_commit" (the Iceberg
commit landed, Spark has not recorded the batch yet), "index_file_done" (a task's key index
catch-up or rebuild indexed one more data file, before the next), "index_moves_recorded" (a
catch-up stored a compaction's move maps, before the state moves), "index_shard_<step>" (a step
that spans the key index's shards, `committed`, `rolled_back`, `state_set`, `catch_up_begun`
or `cleared`, finished one shard, before the next). actions: "kill" SIGKILLs the job's
process session leader group and its own (driver, JVM, Python workers: a machine crash), "raise" raises
InjectedFault, "kill_executor" SIGKILLs the JVM this Python worker serves (an executor lost
mid-task, on a cluster), "lose_answer" raises ConnectionResetError (a reply lost on the way
back, after the step it follows took effect), "run" runs `command` (argv list) and waits for
it. A rule with "once": true is disarmed (file rewritten without it) when it fires; one with
"nth": [n, ...] fires on those hits of its point only (the hits counted in the file).
"catalog_updated": a SQL catalog's compare-and-swap UPDATE is committed, its answer not yet
back (catalog/sql_commit.py). "catalog_call": a SQL catalog is about to be asked something
(a table's load, a compare-and-swap), with the table's name; the action "refuse" raises
ConnectionRefusedError there (a catalog that is away: nothing was asked). A rule with
"table" fires only at points of that table ("before_commit", "after_commit",
"catalog_call": one table of a routed write). "raise_pickled" raises an exception the test
built and pickled (with pyspark's cloudpickle, so a class the test defines travels by
value), base64 in "errors": with "nth", the one at the position of this hit among them
(tests: every exception type a catalog's clients raise, after the catalog applied a commit).
"catalog_updated" fires on every catalog: after a REST catalog's commit answered too.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import signal
import subprocess

ENV = "LAKESINK_FAULTS"


class InjectedFault(RuntimeError):
    pass


def _kill_everything() -> None:
    # Spark's Python workers may sit in process groups of their own, but they share the
    # session of the job's launcher (tests start it with start_new_session=True), whose
    # group holds the driver and its JVM: kill that group, then our own.
    for group in (os.getsid(0), os.getpgrp()):
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_executor_jvm() -> None:
    # A Python worker's ancestors are pyspark's daemon and then the executor's JVM.
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0]
        if os.path.basename(argv0) == b"java":
            os.kill(pid, signal.SIGKILL)
            return
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("kill_executor: no JVM among this process's ancestors")


def _rewrite(path: str, rules: list[dict]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(rules, f)
    os.replace(tmp, path)


def fault_point(point: str, batch_id: int | None = None, table: str | None = None) -> None:
    path = os.environ.get(ENV)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        rules = json.load(f)
    for i, rule in enumerate(rules):
        if rule.get("point") != point:
            continue
        if "batch" in rule and rule["batch"] != batch_id:
            continue
        if "table" in rule and rule["table"] != table:
            continue
        if "nth" in rule:
            # Counted across processes (each batch's commit may run in another): in the file.
            rule["hits"] = rule.get("hits", 0) + 1
            _rewrite(path, rules)
            if rule["hits"] not in rule["nth"]:
                continue
        if rule.get("once"):
            _rewrite(path, rules[:i] + rules[i + 1 :])
        action = rule.get("action")
        if action == "raise_pickled":
            errors = rule["errors"]
            which = rule["nth"].index(rule["hits"]) if "nth" in rule else 0
            raise pickle.loads(base64.b64decode(errors[which % len(errors)]))
        if action == "kill":
            _kill_everything()
        elif action == "kill_executor":
            _kill_executor_jvm()
        elif action == "raise":
            raise InjectedFault(f"injected fault at {point} (batch {batch_id}{f', table {table}' if table else ''})")
        elif action == "refuse":
            raise ConnectionRefusedError(f"injected fault at {point}: the catalog refused the connection")
        elif action == "lose_answer":
            raise ConnectionResetError(f"injected fault at {point}: the connection dropped before the answer came back")
        elif action == "run":
            subprocess.run(rule["command"], check=True)
        return
