"""Scenario 5's changes: a base table, then batches of 70% updates of random live keys, 20%
inserts of new keys and 10% deletes of random live keys, with an `op` column (c, u, d) and a
sequence column `lsn` (the batch number). Shared by the scenario and the experiments that
take it apart, so they run on the same data."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

RowsOf = Callable[[np.ndarray, int], pa.Table]  # (ids, version) -> the scenario's columns


def with_ops(table: pa.Table, ops: list[str], lsn: int) -> pa.Table:
    return table.append_column("op", pa.array(ops)).append_column("lsn", pa.array(np.full(table.num_rows, lsn, dtype=np.int64)))


def cdc_batches(rows_of: RowsOf, base_rows: int, batch_rows: int, batches: int, seed: int = 5) -> Iterator[tuple[int, pa.Table, int]]:
    """(batch number, changes, live keys after it): batch 0 creates the base rows."""
    rng = np.random.default_rng(seed)
    live = np.arange(base_rows)
    yield 0, with_ops(rows_of(live, 0), ["c"] * base_rows, 0), base_rows
    next_id = base_rows
    for b in range(1, batches + 1):
        n_upd, n_ins = int(batch_rows * 0.7), int(batch_rows * 0.2)
        n_del = batch_rows - n_upd - n_ins
        picked = rng.choice(len(live), n_upd + n_del, replace=False)
        upd, dele = live[picked[:n_upd]], live[picked[n_upd:]]
        ins = np.arange(next_id, next_id + n_ins)
        next_id += n_ins
        live = np.concatenate([np.delete(live, picked[n_upd:]), ins])
        yield b, with_ops(rows_of(np.concatenate([upd, ins, dele]), b), ["u"] * n_upd + ["c"] * n_ins + ["d"] * n_del, b), len(live)
