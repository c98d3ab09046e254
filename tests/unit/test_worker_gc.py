"""Spark's reused workers collect garbage after every invocation: lakesink freezes the
objects its imports made, once per process, so those collections stay cheap."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = """
import gc, os, time
import lakesink_datasource.datasource, lakesink_datasource.write.task  # what a task's worker imports
from lakesink_datasource.worker_gc import settle_imports

before = len(gc.get_objects())
settle_imports()
frozen = gc.get_freeze_count()
settle_imports()
settle_imports()
settle_imports()  # the fourth invocation in the same process freezes nothing more
junk = [[i] for i in range(1000)]  # created afterwards: still collected as usual
print(before, frozen, gc.get_freeze_count(), len(gc.get_objects()))
"""


def _probe(env: dict[str, str]) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return [int(x) for x in out.stdout.split()]


def test_imports_are_frozen_and_later_objects_stay_collectable() -> None:
    before, frozen, frozen_after, tracked_after = _probe({})
    assert before > 50_000  # pyspark, pyarrow, pyiceberg and lakesink: what every collection walked
    assert frozen >= before * 0.9
    assert frozen_after - frozen < 1_000  # later invocations add only what was created meanwhile
    assert 1_000 <= tracked_after < 5_000  # only what was made since: the 1,000 lists and little else


def test_the_environment_turns_it_off() -> None:
    before, frozen, _, tracked_after = _probe({"LAKESINK_GC_FREEZE": "0"})
    assert frozen == 0
    assert tracked_after >= before
