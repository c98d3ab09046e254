"""Why a keyed batch costs more in a bigger index, with LMDB alone (no lakesink):

python benchmarks/experiments/index-catchup/lmdb_random_updates.py 1000000
python benchmarks/experiments/index-catchup/lmdb_random_updates.py 10000000

Fills an LMDB database with N 9-byte keys (12-byte values, like the key index), then times
five write transactions of 50K updates of random existing keys + 50K new keys (lookup and
putmulti in key order), with writemap off (lakesink's setting) and on.
"""

import os
import shutil
import sys
import time

import lmdb
import numpy as np

VALUE = b"\x01\x00\x00\x00" + b"\x00" * 8


def keys(ids: np.ndarray) -> list[bytes]:
    packed = np.empty(len(ids), dtype=[("tag", "u1"), ("value", ">u8")])
    packed["tag"] = 1
    packed["value"] = ids
    return packed.view("V9").tolist()


def main() -> None:
    n = int(sys.argv[1])
    rng = np.random.default_rng(0)
    for writemap in (False, True):
        path = f"/tmp/lmdb-random-updates-{writemap}"
        shutil.rmtree(path, ignore_errors=True)
        env = lmdb.open(path, map_size=1 << 36, sync=False, metasync=False, writemap=writemap, max_dbs=4)
        db = env.open_db(b"keys")
        for start in range(0, n, 1_000_000):
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti([(k, VALUE) for k in keys(np.arange(start, min(n, start + 1_000_000)))], append=True)
        times = []
        for rep in range(5):
            batch = sorted(keys(rng.choice(n, 50_000, replace=False))) + keys(np.arange(n + rep * 50_000, n + (rep + 1) * 50_000))
            started = time.perf_counter()
            with env.begin(write=True) as txn:
                [txn.get(k, None, db) for k in batch]
                txn.cursor(db=db).putmulti([(k, VALUE) for k in batch])
            times.append(round(time.perf_counter() - started, 3))
        size = os.path.getsize(f"{path}/data.mdb") >> 20
        print(f"{n:,} keys, writemap={writemap}: {times} s per 100K-key transaction; data.mdb {size:,} MiB (apparent)")
        env.close()
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
