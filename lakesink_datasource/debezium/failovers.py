"""MySQL and MariaDB failovers: which binlog a change's position belongs to.

A binlog position (`file`, `pos`) is a place in one server's binlog. After a failover the
connector reads the new primary's binlog, whose file numbers are its own (often lower), so
positions of two servers cannot be compared. Kafka keeps the connector's order within a
partition (a key's events stay in one), so lakesink counts, per topic-partition, the
failovers its events show, and puts that count first in each change's position: a change
read after a failover is ordered after every change read before it.

A failover shows as a change below the highest position the partition has shown on the
current server that is no re-send:
- a streamed change whose GTID (MySQL `source.gtid` "<server uuid>:<n>", MariaDB
  "<domain>-<server>-<n>") is new: its server's transaction number is above every one seen
  (a connector restart re-sends transactions already seen, with their GTIDs);
- a snapshot read at another position than the partition's last snapshot (a re-snapshot
  from the new primary; a restart re-sends the snapshot at its own position).
A change without a GTID (gtid_mode off, which Debezium's failover needs on) never shows
one. A re-sent change keeps the count it was first read with: per GTID origin, the count in
force when each of its transaction numbers was first seen.

What a task learned is a table property (`BINLOGS_PROPERTY`, JSON by partition): the next
batch's tasks start from it, and the commit merges every task's.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from lakesink_datasource.debezium.positions import FAILOVERS, GTID, STREAMED

BINLOGS_PROPERTY = "lakesink.debezium.binlogs"


class Binlog(msgspec.Struct, forbid_unknown_fields=False):
    """What one topic-partition's events showed of the source's binlogs."""

    failovers: int = 0
    top: tuple[int, int] | None = None  # highest (file number, pos) on the current server
    snapshot: tuple[int, int] | None = None  # where the newest snapshot's reads sit
    newest: dict[str, int] = {}  # GTID origin -> highest transaction number seen
    # GTID origin -> (failovers, first transaction number seen with that count), in order
    eras: dict[str, list[tuple[int, int]]] = {}


Binlogs = dict[str, Binlog]  # "<topic>/<partition>" -> what it showed


def read_binlogs(text: str | None) -> Binlogs:
    return msgspec.json.decode(text, type=Binlogs) if text else {}


def encode_binlogs(binlogs: Binlogs) -> str:
    return msgspec.json.encode(dict(sorted(binlogs.items()))).decode()


def gtid_of(text: Any) -> tuple[str, int] | None:
    """(origin, transaction number) of a GTID: MySQL's "<uuid>[:<tag>]:<n>", MariaDB's
    "<domain>-<server>-<n>" (a domain's numbers go on across its servers)."""
    if not isinstance(text, str) or not text:
        return None
    if ":" in text:
        origin, _, n = text.rpartition(":")
    else:
        parts = text.split("-")
        if len(parts) != 3:
            return None
        origin, n = parts[0], parts[2]
    return (origin, int(n)) if n.isdigit() else None


def _copied(binlog: Binlog) -> Binlog:
    """A copy whose dicts and lists the caller may change."""
    return msgspec.structs.replace(binlog, newest=dict(binlog.newest), eras={o: list(e) for o, e in binlog.eras.items()})


def _era(binlog: Binlog, origin: str, n: int) -> int:
    """The failover count a re-sent transaction was first read with."""
    eras = binlog.eras.get(origin)
    if not eras:
        return binlog.failovers
    at = bisect.bisect_right([first for _, first in eras], n) - 1
    return eras[max(at, 0)][0]


def count_failovers(position: pa.StructArray, partitions: Sequence[str], offsets: Sequence[Any], known: Binlogs) -> tuple[pa.StructArray, Binlogs]:
    """`position` (a MySQL/MariaDB table's, with its GTIDs) with each change's failover count,
    without the GTIDs, and what the partitions showed (`known` and these changes)."""
    binlogs = {k: _copied(v) for k, v in known.items()}
    names = [f.name for f in position.type]
    files = position.field(names.index("file_number")).to_pylist()
    poss = position.field(names.index("pos")).to_pylist()
    streamed = position.field(names.index(STREAMED)).to_pylist()
    gtids = position.field(names.index(GTID)).to_pylist()
    counts = np.zeros(len(position), dtype=np.int32)
    order = sorted(range(len(position)), key=lambda i: (partitions[i], offsets[i] if offsets[i] is not None else -1, i))
    for i in order:
        binlog = binlogs.setdefault(partitions[i], Binlog(newest={}, eras={}))
        here = (files[i], poss[i])
        gtid = gtid_of(gtids[i]) if streamed[i] else None
        resent = gtid is not None and gtid[1] <= binlog.newest.get(gtid[0], -1)
        below = not resent and binlog.top is not None and here < binlog.top and files[i] >= 0
        # Below the top: a new transaction, or a snapshot taken anew, is the new primary's.
        if below and (gtid is not None if streamed[i] else here != binlog.snapshot):
            binlog.failovers += 1
            binlog.top = here
        era = _era(binlog, *gtid) if resent and gtid is not None else binlog.failovers
        counts[i] = era
        if era != binlog.failovers:
            continue
        binlog.top = _higher(binlog.top, here)
        if not streamed[i]:
            binlog.snapshot = here
        if gtid is not None and not resent:
            origin, n = gtid
            binlog.newest[origin] = n
            eras = binlog.eras.setdefault(origin, [])
            if not eras or eras[-1][0] != era:
                eras.append((era, n))
    fields = [f for f in position.type if f.name != GTID]
    arrays = [pa.array(counts) if f.name == FAILOVERS else position.field(names.index(f.name)) for f in fields]
    return pa.StructArray.from_arrays(arrays, fields=fields), binlogs


def without_failovers(position: pa.StructArray) -> pa.StructArray:
    """The position of a table an earlier lakesink made, whose stored positions count no
    failovers: (file_number, pos, streamed, row)."""
    fields = [f for f in position.type if f.name not in (GTID, FAILOVERS)]
    return pa.StructArray.from_arrays([position.field(f.name) for f in fields], fields=fields)


def _higher(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    return b if a is None else a if b is None else max(a, b)


def merged(states: Iterable[Binlogs]) -> Binlogs:
    """Every task's view of the partitions as one: a partition's newest failover count and
    its place there; every GTID origin's numbers."""
    out: Binlogs = {}
    for state in states:
        for key, b in state.items():
            a = out.get(key)
            if a is None:
                out[key] = _copied(b)
                continue
            if b.failovers > a.failovers:
                a.failovers, a.top, a.snapshot = b.failovers, b.top, b.snapshot
            elif b.failovers == a.failovers:
                a.top, a.snapshot = _higher(a.top, b.top), _higher(a.snapshot, b.snapshot)
            for origin, n in b.newest.items():
                a.newest[origin] = max(n, a.newest.get(origin, n))
            for origin, eras in b.eras.items():
                firsts: dict[int, int] = dict(a.eras.get(origin, []))
                for era, first in eras:
                    firsts[era] = min(first, firsts.get(era, first))
                a.eras[origin] = sorted(firsts.items())
    return out
