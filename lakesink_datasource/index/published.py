"""Published copies of a key index: a host that has never seen a table starts warm.

A host whose index cannot be walked to the planned snapshot (none yet: a new executor, a
lost node, a restarted cluster; its snapshot expired) would read the whole table's key
columns. Instead it takes a published copy and walks from there:

- Once the rows written since the last copy reach a tenth of the index's keys (a cold
  host then walks at most that much history), and once the index holds enough keys to be
  worth it, a host whose index is clean (its state a committed snapshot, no undo pending)
  copies its LMDB environments (compacted, from read transactions opened while it holds
  every shard's lock, so the copy is exactly that snapshot) in a background thread and
  uploads them through the table's FileIO to
  `<table location>/_lakesink_index/<sequence>-<snapshot id>-<host>/`, `manifest.json` last;
  an index of one key shard (`key_shards.py`) under `_lakesink_index/<key shard>/` instead,
  so a host that gets a shard it does not hold fetches that shard alone.
- A cold host lists the copies, takes the newest one whose snapshot is in the planned
  snapshot's history, checks every file's size and SHA-256 against the manifest (and the
  table, key columns and shard count), puts the files in place of its own environments and
  walks the rest of the history from the copy's state.

The copies are a cache, never referenced by table metadata: the table stays the only
source of truth. A copy that is damaged, of another table, or too old to walk from is
skipped (a rebuild follows, logged). Publishing keeps the newest `KEEP` complete copies
and deletes older ones; lakesink's orphan removal keeps those too; another engine's orphan
removal deleting them costs the next cold host a rebuild, nothing more.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time

import msgspec
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata

from lakesink_datasource.iceberg.history import ancestors
from lakesink_datasource.iceberg.listing import list_files
from lakesink_datasource.index.environment import IndexState
from lakesink_datasource.index.key_columns import KeyColumns
from lakesink_datasource.index.key_shards import SHARD_NAME_PREFIXES, KeyShard
from lakesink_datasource.index.owner import owner_digest
from lakesink_datasource.index.sharded_index import IndexSnapshot, ShardedIndex

log = logging.getLogger("lakesink")

# At the table's root, with a leading '_' (a directory engines treat as not the table's) and
# no hyphen: S3 table buckets (SeaweedFS's, for one) refuse any other name outside data/ and
# metadata/, and refuse index files inside them.
PUBLISHED_DIR = "_lakesink_index"
MANIFEST = "manifest.json"
KEEP = 2  # complete copies kept per table
# A copy is due once the rows written since the last one (what a cold host would walk) reach
# this share of the index's keys, and at least MIN_CHANGED_ROWS: a copy costs a compacted
# copy of the whole index in a background thread, so it is not made after every batch.
CHANGED_FRACTION = 0.1
MIN_CHANGED_ROWS = 100_000
MIN_KEYS = 100_000  # below this a rebuild is cheap: nothing is published
_CHUNK = 8 << 20


def manifest_sequence(columns: KeyColumns) -> str | None:
    """The sequence columns as a copy's manifest names them (one name, as copies always
    had; several joined by commas)."""
    return ",".join(columns.sequence) or None


class CopyManifest(msgspec.Struct, frozen=True):
    """What a published copy holds: written last, so its presence means the copy is whole."""

    table_uuid: str
    snapshot_id: int | None
    sequence_number: int | None
    shards: int
    key_columns: list[str]
    sequence_column: str | None
    files: dict[str, list[str | int]]  # environment name -> [size, sha256 hex]
    keys: int
    publisher: str
    created_ms: int
    format: int = 1
    key_shard: int | None = None  # the key shard the copy holds (None: every key)
    key_shards: int | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(CopyManifest)


def copies_root(metadata: TableMetadata, route: KeyShard | None = None) -> str:
    root = f"{metadata.location.rstrip('/')}/{PUBLISHED_DIR}"
    return root if route is None else f"{root}/{route.name()}"


def _is_shard_folder(name: str) -> bool:
    return name.startswith(SHARD_NAME_PREFIXES)  # KeyShard.name(): the folders of key shards' copies


def _copy_name(state: IndexState, publisher: str) -> str:
    """Sorted by snapshot sequence; the publisher's digest keeps two hosts' copies of one
    snapshot apart (their files differ: each host numbers data files its own way)."""
    return f"{state.sequence_number or 0:012d}-{state.snapshot_id}-{owner_digest(publisher)}"


# ----------------------------------------------------------------------------- publishing

_publishing = threading.Lock()  # one upload in flight per process


def maybe_publish(index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns, publisher: str) -> bool:
    """Start publishing a copy of `index` when it is due; the caller holds every shard's
    lock and the index reflects `metadata`'s current snapshot. Returns whether it started."""
    state = index.get_state()
    if state is None or state.snapshot_id is None or state.tombstone_floor is not None or index.pending_tokens():
        return False
    keys = index.count()
    if keys < MIN_KEYS:
        return False
    last = index.files.last_published()
    # A key shard's index takes its share of the rows written (the table counts them all).
    share = 1 / columns.route.shards if columns.route is not None else 1
    if last is not None and share * _rows_written_since(metadata, last) < max(MIN_CHANGED_ROWS * share, CHANGED_FRACTION * keys):
        return False
    if not _publishing.acquire(blocking=False):
        return False
    try:
        snapshot = index.read_snapshot()  # read transactions: the copy is exactly this state
    except BaseException:
        _publishing.release()
        raise
    index.files.set_last_published(state.sequence_number or 0)
    manifest_base = CopyManifest(
        str(metadata.table_uuid), state.snapshot_id, state.sequence_number, len(index.shards), list(columns.key),
        manifest_sequence(columns), {}, keys, publisher, 0,
        key_shard=columns.route.shard if columns.route else None, key_shards=columns.route.shards if columns.route else None,
    )
    root = copies_root(metadata, columns.route)

    def run() -> None:
        try:
            prefix = f"{state.sequence_number or 0:012d}-{state.snapshot_id}-"
            if not any(name.startswith(prefix) for name in complete_copies(io, root)):  # another host was first
                _publish(snapshot, io, root, _copy_name(state, publisher), manifest_base)
            _prune(io, root)
        except Exception:  # a cache: a failed copy costs a cold host a rebuild, no more
            log.warning("lakesink: publishing a copy of key index %s failed", index.path, exc_info=True)
        finally:
            snapshot.close()
            _publishing.release()

    threading.Thread(target=run, name="lakesink-index-publish", daemon=True).start()
    return True


def _rows_written_since(metadata: TableMetadata, sequence_number: int) -> int:
    """Rows the snapshots after `sequence_number` added, compactions aside (a cold host follows
    those through move maps, cheaply)."""
    rows = 0
    for snapshot in ancestors(metadata):
        if (snapshot.sequence_number or 0) <= sequence_number:
            break
        summary = snapshot.summary
        if summary is not None and summary.operation.value != "replace":
            rows += int(summary.additional_properties.get("added-records", 0))
    return rows


def wait_for_publishing() -> None:
    """Return once no copy is being published by this process."""
    with _publishing:
        pass


def _publish(snapshot: IndexSnapshot, io: FileIO, root: str, name: str, base: CopyManifest) -> None:
    started = time.perf_counter()
    target = f"{root}/{name}"
    with tempfile.TemporaryDirectory(prefix="lakesink-index-copy-") as local:
        files: dict[str, list[str | int]] = {}
        for env_name, path in snapshot.copy_to(local).items():
            files[env_name] = [os.path.getsize(path), _upload(io, path, f"{target}/{env_name}.mdb")]
    manifest = msgspec.structs.replace(base, files=files, created_ms=int(time.time() * 1000))
    with io.new_output(f"{target}/{MANIFEST}").create(overwrite=True) as out:
        out.write(_encoder.encode(manifest))
    log.info("lakesink: published a copy of the key index at %s (%d keys, %.1f MB, %.2f s)", target, base.keys,
             sum(int(v[0]) for v in files.values()) / 1e6, time.perf_counter() - started)


def _upload(io: FileIO, path: str, location: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source, io.new_output(location).create(overwrite=True) as out:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _copies(io: FileIO, root: str) -> dict[str, list[str]]:
    """Copy directory name -> its files (full locations), of the copies right under `root`:
    the table's folder of copies, or one key shard's folder in it."""
    last = root.rstrip("/").rsplit("/", 1)[-1]
    shard_folder = last if _is_shard_folder(last) else None
    out: dict[str, list[str]] = {}
    for listed in list_files(io, root):
        parts = listed.path.split(f"/{PUBLISHED_DIR}/", 1)[-1].split("/")
        if shard_folder is not None:
            if parts[0] != shard_folder:
                continue
            parts = parts[1:]
        elif _is_shard_folder(parts[0]):
            continue  # at the table's level, a key shard's folder is not a copy
        out.setdefault(parts[0], []).append(listed.path)
    return out


def complete_copies(io: FileIO, root: str) -> list[str]:
    """Names of the copies whose manifest exists, newest first."""
    return sorted((n for n, files in _copies(io, root).items() if any(f.endswith(f"/{MANIFEST}") for f in files)), reverse=True)


def kept_files(io: FileIO, metadata: TableMetadata) -> set[str]:
    """The files of the copies publishing keeps, the whole index's and every key shard's
    (orphan removal must not delete them)."""
    top = copies_root(metadata)
    folders = {listed.path.split(f"/{PUBLISHED_DIR}/", 1)[-1].split("/", 1)[0] for listed in list_files(io, top)}
    roots = [top, *(f"{top}/{name}" for name in sorted(folders) if _is_shard_folder(name))]
    kept: set[str] = set()
    for root in roots:
        copies = _copies(io, root)
        keep = set(complete_copies(io, root)[:KEEP])
        kept |= {f for name, files in copies.items() if name in keep for f in files}
    return kept


def _prune(io: FileIO, root: str, now_ms: int | None = None) -> None:
    """Delete complete copies beyond the newest KEEP, and incomplete ones older than a day."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    copies = _copies(io, root)
    complete = complete_copies(io, root)
    doomed = set(complete[KEEP:])
    newest_kept = complete[KEEP - 1] if len(complete) >= KEEP else None
    for name in copies:
        # A copy still being uploaded has no manifest yet: only old incomplete ones go.
        if name not in complete and newest_kept is not None and name < newest_kept:
            doomed.add(name)
    for name in doomed:
        for path in copies[name]:
            try:
                io.delete(path)
            except OSError:
                pass


# ----------------------------------------------------------------------------- fetching


def fetch(index: ShardedIndex, io: FileIO, metadata: TableMetadata, columns: KeyColumns) -> str | None:
    """Replace `index`'s environments with the newest usable published copy (the caller
    holds every shard's lock). Returns the copy's name, or None (nothing usable)."""
    root = copies_root(metadata, columns.route)
    try:
        names = complete_copies(io, root)
    except Exception:
        log.info("lakesink: cannot list published key index copies at %s", root, exc_info=True)
        return None
    history = {s.snapshot_id for s in ancestors(metadata)}
    for name in names:
        try:
            manifest = _decoder.decode(_read(io, f"{root}/{name}/{MANIFEST}"))
        except Exception:  # noqa: BLE001 - a damaged manifest: try an older copy
            log.warning("lakesink: published key index copy %s/%s has an unreadable manifest", root, name)
            continue
        problem = _unusable(manifest, metadata, columns, len(index.shards), history)
        if problem is not None:
            log.info("lakesink: published key index copy %s skipped: %s", name, problem)
            continue
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="lakesink-index-fetch-", dir=os.path.dirname(index.path)) as local:
            try:
                paths = {env: _download(io, f"{root}/{name}/{env}.mdb", os.path.join(local, env), manifest.files[env]) for env in manifest.files}
            except _Damaged as exc:
                log.warning("lakesink: published key index copy %s is damaged: %s", name, exc)
                continue
            with _publishing:  # never under a copy this process is still making
                index.replace_environments(paths)
        state = index.get_state()
        if state is None or state.snapshot_id != manifest.snapshot_id:
            log.warning("lakesink: published key index copy %s does not hold the state its manifest names", name)
            continue
        log.info("lakesink: key index %s started from published copy %s (%d keys, %.2f s)", index.path, name, manifest.keys,
                 time.perf_counter() - started)
        return name
    return None


class _Damaged(Exception):
    pass


def _unusable(manifest: CopyManifest, metadata: TableMetadata, columns: KeyColumns, shards: int, history: set[int]) -> str | None:
    if manifest.format != 1:
        return f"format {manifest.format}"
    if manifest.table_uuid != str(metadata.table_uuid):
        return f"of another table ({manifest.table_uuid})"
    if manifest.key_columns != list(columns.key) or manifest.sequence_column != manifest_sequence(columns):
        return "of other key or sequence columns"
    if manifest.shards != shards:
        return f"{manifest.shards} shards, not {shards}"
    route = columns.route
    if (manifest.key_shard, manifest.key_shards) != ((route.shard, route.shards) if route else (None, None)):
        return f"key shard {manifest.key_shard} of {manifest.key_shards}, not {route.shard if route else None} of {route.shards if route else None}"
    if manifest.snapshot_id not in history:
        return f"snapshot {manifest.snapshot_id} is not in the table's current history"
    return None


def _read(io: FileIO, location: str) -> bytes:
    with io.new_input(location).open() as stream:
        return stream.read()


def _download(io: FileIO, location: str, folder: str, expected: list[str | int]) -> str:
    size, sha = int(expected[0]), str(expected[1])
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "data.mdb")
    digest = hashlib.sha256()
    try:
        with io.new_input(location).open() as source, open(path, "wb") as out:
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except FileNotFoundError as exc:
        raise _Damaged(f"{location} is missing") from exc
    if os.path.getsize(path) != size or digest.hexdigest() != sha:
        raise _Damaged(f"{location} is not the file its manifest names (size or SHA-256 differ)")
    return folder
