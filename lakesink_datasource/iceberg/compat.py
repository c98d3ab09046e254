"""The one place lakesink leans on pyiceberg internals, pinned to one exact version.

pyiceberg 0.12.0 models format-version 3 metadata and reads it, but refuses to *write* it
(`TableMetadataV3.model_dump_json` raises) and leaves `next-row-id` unset on new v3 tables.
Every catalog that writes its own metadata files (SQL, Hive, Glue, ...) goes through that
serializer, so without help no v3 table can be created or committed through them.
Everything else v3 (manifests, manifest lists, snapshots, row lineage) is lakesink's own
code in this package.

The help is scoped: `v3_metadata_writes()` enables v3 serialisation for the calls made
inside it, in the calling thread (or asyncio task) only. Outside it pyiceberg behaves as
released, so importing lakesink changes nothing for other pyiceberg code in the process,
which could otherwise write v3 metadata without row lineage. lakesink enters the context
around its own catalog calls (create, commit); other code may opt in explicitly:

    with v3_metadata_writes():
        catalog.commit_table(table, requirements, updates)

The shim is version-guarded: a different pyiceberg must be re-checked against the v3
rules in docs/format.md before the pin moves.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyiceberg
from pyiceberg.table import metadata as _metadata
from pyiceberg.typedef import IcebergBaseModel

from lakesink_datasource.errors import LakesinkError
from lakesink_datasource.version import PINNED_PYICEBERG_VERSION

_enabled: contextvars.ContextVar[bool] = contextvars.ContextVar("lakesink_v3_metadata_writes", default=False)
_released_dump: Callable[..., str] | None = None


class UnsupportedPyIcebergVersion(LakesinkError, RuntimeError):
    pass


def _dump_v3_json(self: _metadata.TableMetadataV3, *args: Any, **kwargs: Any) -> str:
    if not _enabled.get():
        assert _released_dump is not None
        return _released_dump(self, *args, **kwargs)
    # `next-row-id` is required in v3 (Java's parser throws without it) and new tables
    # start at 0; pyiceberg leaves it None on create, so fill it in on the way out.
    target = self if self.next_row_id is not None else self.model_copy(update={"next_row_id": 0})
    kwargs.setdefault("exclude_none", True)
    kwargs.setdefault("by_alias", True)
    return IcebergBaseModel.model_dump_json(target, *args, **kwargs)


def check_version() -> None:
    if pyiceberg.__version__ != PINNED_PYICEBERG_VERSION:
        raise UnsupportedPyIcebergVersion(
            f"lakesink needs pyiceberg=={PINNED_PYICEBERG_VERSION} (found {pyiceberg.__version__}): "
            "its v3 metadata layer relies on that version's internals"
        )


def _install() -> None:
    """Put the context-aware serializer in place (idempotent)."""
    global _released_dump
    current = _metadata.TableMetadataV3.model_dump_json
    if current is _dump_v3_json:
        return
    _released_dump = current
    _metadata.TableMetadataV3.model_dump_json = _dump_v3_json  # type: ignore[method-assign]  # the scoped shim itself


def apply_updates(base: _metadata.TableMetadata, updates: tuple[Any, ...], metadata_location: str) -> _metadata.TableMetadata:
    """pyiceberg's `update_table_metadata` for a commit on `base` (stored at
    `metadata_location`), without its final deep copy of the whole metadata. That copy costs
    about 0.1 ms per retained snapshot on every commit; it guards against updates that
    share mutable state, and the 0.12 updates lakesink sends (add snapshot, set ref, set
    properties, remove snapshots) each build new lists and dicts (`model_copy(update=...)`)."""
    from pyiceberg.table.update import _apply_table_update, _TableMetadataUpdateContext, _update_table_metadata_log
    from pyiceberg.utils.datetime import datetime_to_millis

    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            from datetime import datetime

            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


@contextmanager
def v3_metadata_writes() -> Iterator[None]:
    """Let pyiceberg serialise v3 table metadata for calls made inside this block."""
    _install()
    token = _enabled.set(True)
    try:
        yield
    finally:
        _enabled.reset(token)


check_version()
