"""One LMDB environment against 8 shards, with LMDB alone (no Spark, no table):

python benchmarks/experiments/index-shards/lmdb_shards.py 30000000

Fills N 9-byte keys (12-byte values, like the key index) into one environment and into 8
environments routed as the sharded index routes them (hash of the key without its last
byte), then times repetitions of one keyed chunk, 25K updates of random existing keys + 25K
new keys (what each of scenario 4's two tasks gets): lookups and putmulti in key order, one
write transaction in the single environment, one per shard in the 8.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time

import lmdb
import numpy as np

from lakesink_datasource.index.key_encoding import key_hashes

VALUE = b"\x01\x00\x00\x00" + b"\x00" * 8
SHARDS = 8


def keys(ids: np.ndarray) -> list[bytes]:
    packed = np.empty(len(ids), dtype=[("tag", "u1"), ("value", ">u8")])
    packed["tag"] = 1
    packed["value"] = ids
    return packed.view("V9").tolist()


def shard_of(batch: list[bytes]) -> np.ndarray:
    return (key_hashes(batch, drop_last_byte=True) % np.uint64(SHARDS)).astype(np.int64)


def open_env(path: str) -> tuple[lmdb.Environment, object]:
    shutil.rmtree(path, ignore_errors=True)
    env = lmdb.open(path, map_size=1 << 36, sync=False, metasync=False, readahead=False, max_dbs=4)
    return env, env.open_db(b"keys")


def fill(envs: list[tuple[lmdb.Environment, object]], n: int) -> None:
    for start in range(0, n, 1_000_000):
        batch = keys(np.arange(start, min(n, start + 1_000_000)))
        route = shard_of(batch) if len(envs) > 1 else np.zeros(len(batch), dtype=np.int64)
        for s, (env, db) in enumerate(envs):
            part = [k for k, r in zip(batch, route.tolist()) if r == s]
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti([(k, VALUE) for k in part], append=True)


def chunk(envs: list[tuple[lmdb.Environment, object]], batch: list[bytes]) -> float:
    started = time.perf_counter()
    route = shard_of(batch) if len(envs) > 1 else np.zeros(len(batch), dtype=np.int64)
    for s, (env, db) in enumerate(envs):
        part = sorted(k for k, r in zip(batch, route.tolist()) if r == s)
        with env.begin(write=True) as txn:
            [txn.get(k, None, db) for k in part]
            txn.cursor(db=db).putmulti([(k, VALUE) for k in part])
    return time.perf_counter() - started


def main() -> None:
    n = int(sys.argv[1])
    reps = 12
    layouts = {"1 environment": [open_env("/tmp/lmdb-shards-one")],
               f"{SHARDS} shards": [open_env(f"/tmp/lmdb-shards-{s}") for s in range(SHARDS)]}
    for name, envs in layouts.items():
        started = time.perf_counter()
        fill(envs, n)
        print(f"{name}: filled {n:,} keys in {time.perf_counter() - started:.1f} s", flush=True)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {name: [] for name in layouts}
    next_id = n
    for rep in range(reps):
        batch = keys(rng.choice(n, 25_000, replace=False)) + keys(np.arange(next_id, next_id + 25_000))
        next_id += 25_000
        for name in (list(layouts) if rep % 2 == 0 else list(reversed(layouts))):
            times[name].append(chunk(layouts[name], batch) if rep else 0.0)
    for name, envs in layouts.items():
        size = sum(os.path.getsize(env.path() + "/data.mdb") for env, _ in envs) >> 20
        runs = times[name][1:]
        print(f"{name}: median {statistics.median(runs):.3f} s per 50K-key chunk "
              f"(min {min(runs):.3f}, max {max(runs):.3f}); data.mdb {size:,} MiB in all")
        for env, _ in envs:
            path = env.path()
            env.close()
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
