"""A reference model of slowly changing dimension type 2 history, written from documentation.

`history(batches)` is the history table a reader sees after every batch has been applied:
one `Version` per stretch of time during which a key had one set of tracked values, with
`start` (`__START_AT`) and `end` (`__END_AT`, `None` while current). It is written from the
documented semantics of Databricks' `AUTO CDC ... STORED AS SCD TYPE 2`
(`create_auto_cdc_flow(..., stored_as_scd_type=2)`), of the same API in Apache Spark's
declarative pipelines, and of the general SCD type 2 definition; not from lakesink's code.

Sources, and the rule each gives (quotes are verbatim; "in substance" marks a paraphrase of a
page whose stored copy was read in another language or only in part):

[S1] https://docs.databricks.com/delta-live-tables/cdc.html ("The AUTO CDC APIs"), in
     substance: AUTO CDC handles out-of-sequence records itself; the user names a column to
     sequence records by, which the API reads as a monotonically increasing representation of
     the source's proper order; MERGE INTO "can produce incorrect results because of
     out-of-sequence records".
[S2] https://docs.databricks.com/gcp/dlt-ref/dlt-python-ref-apply-changes
     (`create_auto_cdc_flow`): "you must include the __START_AT and __END_AT columns with the
     same data type as the sequence_by fields"; `sequence_by` takes a column name, `col()` or
     `struct()` (several columns).
[S3] Apache Spark's declarative pipelines programming guide, section "SCD Type 2: Keeping
     History", as reviewed in https://www.mail-archive.com/reviews@spark.apache.org/msg1638650.html
     (PR #60086): "`__START_AT` - the sequence value at which the version became current";
     "`__END_AT` - the sequence value at which the version stopped being current, or `NULL`
     for the current version"; "The version that was current at a given sequence value is the
     row whose interval contains that value." Its parameter table
     (https://www.mail-archive.com/reviews@spark.apache.org/msg1638317.html): the tracked
     columns are "The columns whose changes open a new version".
[S4] https://docs.databricks.com/aws/en/dlt-ref/dlt-sql-ref-apply-changes-into
     (`APPLY AS DELETE WHEN`), in substance: for SCD type 2, to handle out-of-order data, a
     deleted row is kept for a while as a tombstone. Apache Spark's SCD2 processor review
     (https://mail-archive.com/reviews@spark.apache.org/msg1614062.html): "Deletes are
     represented as instantaneous tombstones, so an open upsert can also close against a
     delete."
[S5] Kimball, "Slowly Changing Dimensions, Part 2"
     (http://www.kimballgroup.com/2008/09/slowly-changing-dimensions-part-2/), "Type 2: Add a
     New Dimension Record"; https://www.liquisearch.com/slowly_changing_dimension/type_ii:
     "The null End_Date in row two indicates the current tuple version."

The rules, and where each comes from:

1. Order is by position, never by arrival [S1]. A key's changes are applied in `position`
   order; a late change (a lower position arriving after a higher one) takes its place in
   the past and splits or ends versions as needed. The model therefore keeps every applied
   change and recomputes each key's timeline from them in position order, so the result
   depends only on the set of changes, not on batches or arrival order.
2. Intervals are half-open [S3]: a version covers `start <= p < end`; `end is None` is the
   current version [S3, S5]. Positions are tuples compared as whole tuples (Python's
   lexicographic order, the order of a `struct()` sequence [S2]): `(1, 9) < (2, 0)`, and
   `(1, 5)` and `(1, 6)` are distinct positions.
3. Upsert at p [S3, S5]: if the tracked values differ from the version current just before p
   (in position order), or no version is current, it ends that version at p and starts a new
   one at p. If they are equal, no version starts (tracked columns are "the columns whose
   changes open a new version" [S3]) and the current version continues; the upsert still
   counts as a change at p (rule 1), so a late change below p cannot displace it:
   `upsert@10 a, upsert@30 a`, then late `delete@20` gives `a[10,20)`, `a[30,-)`.
4. Delete at p [S4]: ends the version current at p, at p; no version until the key's next
   upsert (a gap). With no version current it changes nothing in the table, but it is kept
   (the tombstone of [S4]), so an upsert below p arriving later ends at p.
5. Duplicates: a key change at exactly the position of a change already applied for the same
   key is a re-sent duplicate and is ignored; the first applied (arrival order, within a
   batch in the order given) stands. This is the brief's rule; [S3] shows the SCD type 1
   counterpart (a stale event "compares its version against the state already recorded").
6. Truncate at T: the documentation accepts `APPLY AS TRUNCATE WHEN` / `apply_as_truncates`
   in the syntax of both types, and (as recalled from the Databricks reference, not verified
   in a stored copy) supports it only for SCD type 1, so this rule is the project's own,
   derived from what a truncate means: it removes every row that exists at T. Every version
   current at T (start < T, not ended by T) ends at T; past versions are kept; changes after
   T start new versions. A truncate is a change in every key's position order, so a late
   change with a position below an applied truncate is placed before it and its version ends
   at T at the latest (earlier if a later change of its key comes first). At a position equal
   to T, the truncate comes first: a version that starts at T survives it. Truncates are
   idempotent (a re-sent truncate at T is the same truncate); `Change.key` is ignored for them.
7. Values compare with `==` on the whole mapping of tracked columns.

Output order: by key (natural order when keys compare, else by `repr`), then by `start`.
Bad input (a position that is not a tuple, an upsert without values, a delete or truncate
with values, an unknown op) raises before any history is computed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

OPS = ("upsert", "delete", "truncate")


@dataclass(frozen=True)
class Change:
    key: Hashable  # the row's primary key (ignored for a truncate)
    position: tuple  # the change's sequence (sequence_by), compared as a whole tuple: larger = later
    op: Literal["upsert", "delete", "truncate"]
    values: Mapping[str, Any] | None  # the tracked columns' values for an upsert; None otherwise


@dataclass(frozen=True)
class Version:
    key: Hashable
    values: Mapping[str, Any]
    start: tuple  # __START_AT: the position of the change that began it
    end: tuple | None  # __END_AT: the position of the change that ended it; None while current


# At one position a truncate sorts before a key change (rule 6), so a version starting at T outlives it.
_TRUNCATE_FIRST = 0
_KEY_CHANGE = 1


def history(batches: Sequence[Sequence[Change]]) -> list[Version]:
    """The history table after every batch has been applied, arrival order as given."""
    by_key: dict[Hashable, dict[tuple, Change]] = {}
    truncates: set[tuple] = set()
    for batch in batches:
        for change in batch:
            _check(change)
            if change.op == "truncate":
                truncates.add(change.position)
            else:
                # setdefault keeps the first change applied at a position: later ones are re-sends (rule 5)
                by_key.setdefault(change.key, {}).setdefault(change.position, change)
    ordered_truncates = sorted(truncates)
    versions: list[Version] = []
    for key in _ordered_keys(by_key):
        versions.extend(_timeline(key, by_key[key].values(), ordered_truncates))
    return versions


def _check(change: Change) -> None:
    if change.op not in OPS:
        raise ValueError(f"Change.op is {change.op!r}; use one of {', '.join(OPS)}")
    if not isinstance(change.position, tuple):
        raise TypeError(
            f"Change.position is {type(change.position).__name__} {change.position!r}; "
            "give the sequence as a tuple, e.g. (lsn,) or (ts, lsn)"
        )
    if change.op == "upsert" and not isinstance(change.values, Mapping):
        raise ValueError(f"Change.values of an upsert at {change.position!r} is {change.values!r}; give the tracked columns' values as a mapping")
    if change.op != "upsert" and change.values is not None:
        raise ValueError(f"Change.values of a {change.op} at {change.position!r} must be None, not {change.values!r}")


def _ordered_keys(keys: Iterable[Hashable]) -> list[Hashable]:
    """Keys in a fixed order that does not depend on arrival, so outputs compare as lists."""
    listed = list(keys)
    try:
        return sorted(listed)  # type: ignore[type-var]
    except TypeError:  # keys of mixed types do not compare
        return sorted(listed, key=repr)


def _timeline(key: Hashable, changes: Iterable[Change], truncates: Sequence[tuple]) -> list[Version]:
    """One key's versions: its changes and every truncate, folded in position order."""
    events: list[tuple[tuple, int, Change | None]] = [(c.position, _KEY_CHANGE, c) for c in changes]
    events += [(t, _TRUNCATE_FIRST, None) for t in truncates]
    events.sort(key=lambda event: (event[0], event[1]))
    closed: list[Version] = []
    current: Version | None = None  # the open version, end None
    for position, _, change in events:
        if change is not None and change.op == "upsert":
            assert change.values is not None  # checked by _check
            if current is not None and dict(current.values) == dict(change.values):
                continue  # same tracked values: the version continues (rule 3)
            if current is not None:
                closed.append(_ended(current, position))
            current = Version(key, dict(change.values), position, None)
        elif current is not None:  # a delete of this key, or a truncate of every key
            closed.append(_ended(current, position))
            current = None
    return closed + ([current] if current is not None else [])


def _ended(version: Version, position: tuple) -> Version:
    return Version(version.key, version.values, version.start, position)
