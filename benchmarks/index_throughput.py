"""Throughput of the primary-key index: 1M random int64 keys in 100K-row batches.

Run: .venv/bin/python benchmarks/index_throughput.py [--rows N] [--batch N] [--dir PATH]
Prints rows/s per phase. Timings depend on the disk (each apply is one fsync'd LMDB
commit) and on whether the index fits in the page cache.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from lakesink_datasource.index.environment import drop_index, open_index
from lakesink_datasource.index.key_encoding import encode_keys
from lakesink_datasource.index.key_shard import KeyShard
from lakesink_datasource.index.location_codec import Location


def timed(rows: int, run: Callable[[], None]) -> tuple[float, float]:
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    return seconds, rows / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="parent directory for the index (default: a temp dir)")
    args = parser.parse_args()

    rng = np.random.default_rng(7)
    values = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=args.rows, dtype=np.int64)
    batches = [pa.array(values[i : i + args.batch]) for i in range(0, args.rows, args.batch)]
    missing = [pa.array(b.to_numpy() ^ 1) for b in batches]  # different random keys: misses

    with tempfile.TemporaryDirectory(dir=args.dir) as parent:
        ix = open_index(KeyShard, f"{parent}/table")
        results: list[tuple[str, float, float]] = []
        keys: list[list[bytes]] = []

        def encode() -> None:
            keys.extend(encode_keys([b]) for b in batches)

        results.append(("encode int64 keys", *timed(args.rows, encode)))
        miss_keys = [encode_keys([b]) for b in missing]

        def apply(token_prefix: str, ordinal: int) -> Callable[[], None]:
            # Built outside the timed part: making the Location objects is the caller's cost.
            puts = [[(k, Location(ordinal, i)) for i, k in enumerate(batch)] for batch in keys]

            def run() -> None:
                for n, batch_puts in enumerate(puts):
                    ix.apply(f"{token_prefix}/{n}", batch_puts, [])

            return run

        def lookup(key_batches: list[list[bytes]]) -> Callable[[], None]:
            def run() -> None:
                for batch in key_batches:
                    ix.lookup(batch)

            return run

        def resolve(index: KeyShard, commit: bool, prefix: str) -> Callable[[], None]:
            tokens = [f"{prefix}/{n}" for n in range(len(keys))]
            return (lambda: index.commit_tokens(tokens)) if commit else (lambda: index.rollback_tokens(tokens))

        insert = apply("q/0", 0)
        results.append(("apply: insert new keys", *timed(args.rows, insert)))
        results.append(("commit_tokens", *timed(args.rows, resolve(ix, True, "q/0"))))
        results.append(("lookup: hits", *timed(args.rows, lookup(keys))))
        results.append(("lookup: misses", *timed(args.rows, lookup(miss_keys))))
        overwrite = apply("q/1", 1)
        results.append(("apply: overwrite existing", *timed(args.rows, overwrite)))
        results.append(("rollback_tokens", *timed(args.rows, resolve(ix, False, "q/1"))))
        assert ix.lookup(keys[0][:3]) == [Location(0, i) for i in range(3)]
        drop_index(ix.path)

    print(f"{args.rows:,} random int64 keys, {args.batch:,}-row batches")
    print(f"{'phase':<28}{'seconds':>10}{'rows/s':>14}")
    for name, seconds, rate in results:
        print(f"{name:<28}{seconds:>10.3f}{rate:>14,.0f}")


if __name__ == "__main__":
    main()
