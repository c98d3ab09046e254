"""The one place lakesink leans on pyiceberg internals, pinned to one exact version.

pyiceberg 0.12.0 models format-version 3 metadata and reads it, but refuses to *write*
it (`TableMetadataV3.model_dump_json` raises) and leaves `next-row-id` unset on new v3
tables. Every catalog that writes its own metadata files (SQL, Hive, Glue, ...) goes
through that serializer, so without this shim no v3 table can be created or committed
through them. Everything else v3 (manifests, manifest lists, snapshots, row lineage)
is produced by lakesink's own code in `lakesink_datasource.commit`.

The shim is version-guarded: a different pyiceberg must be re-checked against
`iceberg-v3-write-notes.md` section 6 before the pin moves.
"""

from __future__ import annotations

from typing import Any

import pyiceberg
from pyiceberg.table import metadata as _metadata
from pyiceberg.typedef import IcebergBaseModel

PINNED_PYICEBERG_VERSION = "0.12.0"


class UnsupportedPyIcebergVersion(RuntimeError):
    pass


def _dump_v3_json(
    self: _metadata.TableMetadataV3,
    exclude_none: bool = True,
    exclude: Any | None = None,
    by_alias: bool = True,
    **kwargs: Any,
) -> str:
    # `next-row-id` is required in v3 (Java's parser throws without it) and new tables
    # start at 0; pyiceberg leaves it None on create, so fill it in on the way out.
    target = self if self.next_row_id is not None else self.model_copy(update={"next_row_id": 0})
    return IcebergBaseModel.model_dump_json(target, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs)


def install() -> None:
    """Enable v3 metadata serialisation. Idempotent; refuses an unvetted pyiceberg."""
    if pyiceberg.__version__ != PINNED_PYICEBERG_VERSION:
        raise UnsupportedPyIcebergVersion(
            f"lakesink needs pyiceberg=={PINNED_PYICEBERG_VERSION} (found {pyiceberg.__version__}): "
            "its v3 metadata layer relies on that version's internals"
        )
    if getattr(_metadata.TableMetadataV3.model_dump_json, "_lakesink", False):
        return
    _dump_v3_json._lakesink = True  # type: ignore[attr-defined]
    _metadata.TableMetadataV3.model_dump_json = _dump_v3_json  # type: ignore[method-assign]


install()
