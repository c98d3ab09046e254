"""The damage check `open_index` runs before it opens an environment (index/damage.py), while
another process commits to it: it must never take a live index for a damaged one, which
open_index would delete under its writer (the writer's changes then vanish with the unlinked
file: a shard of keys that lost every change one process made to it)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from lakesink_datasource.index.damage import damage
from lakesink_datasource.index.environment import drop_index, open_index
from lakesink_datasource.index.key_shard import KeyShard
from lakesink_datasource.index.location_codec import Location

CHECKS = 60_000


def _commit_until(path: str, stop: multiprocessing.synchronize.Event, started: multiprocessing.synchronize.Event) -> None:
    index = open_index(KeyShard, path)
    i = 0
    while not stop.is_set():
        # Each commit writes new pages (the file grows) and then its meta page.
        index.apply(f"t{i}", [(b"k%06d" % (i % 5000), Location(1, i))], [])
        i += 1
        if i == 50:
            started.set()


def test_an_index_another_process_commits_to_is_never_taken_for_damaged(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    open_index(KeyShard, path)
    context = multiprocessing.get_context("spawn")
    stop, started = context.Event(), context.Event()
    writer = context.Process(target=_commit_until, args=(path, stop, started))
    writer.start()
    try:
        assert started.wait(120), "the writer never committed"
        verdicts = [damage(path) for _ in range(CHECKS)]
    finally:
        stop.set()
        writer.join(120)
    assert writer.exitcode == 0
    assert [v for v in verdicts if v is not None] == []
    drop_index(path)
