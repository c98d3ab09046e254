"""Before a write: will the table's store take the files this write must write?

An object store may refuse object keys by name. An S3 table bucket (SeaweedFS's, by layout
rules like Amazon S3 Tables' early ones) takes only Parquet, ORC and Avro files under a
table's `data/`, so the Puffin file of a batch's deletion vectors is refused, after the
tasks wrote their rows, with a raw ACCESS_DENIED from the store. A write that will write
deletion vectors tries one tiny Puffin object where they go, once per process and data
path, before anything else is written, and is refused with the rule and the fix.
"""

from __future__ import annotations

import uuid

from pyiceberg.io import FileIO

from lakesink_datasource.catalog.transient import first_line
from lakesink_datasource.options import OptionError


class StoreRefusesFiles(OptionError):
    """The table's store refuses a kind of file the write must write."""


_accepted: set[str] = set()  # data paths that took a Puffin file in this process


def check_puffin_accepted(io: FileIO, data_path: str, identifier: str, location: str) -> None:
    if data_path in _accepted:
        return
    probe = f"{data_path}/lakesink-probe-{uuid.uuid4().hex}.puffin"
    try:
        with io.new_output(probe).create(overwrite=True) as out:
            out.write(b"PFA1")
    except OSError as exc:
        raise StoreRefusesFiles(
            f"the store refuses the deletion-vector files this write needs (Puffin files, *.puffin) under {data_path} "
            f"({first_line(exc)}): keyed writes and replace_where overwrites of table {identifier} (format version 3) "
            "write one per batch. An S3 table bucket such as SeaweedFS's takes only Parquet, ORC and Avro files under data/: "
            f"give the table a data path it exempts, option property.write.data.path={location.rstrip('/')}/_data (a "
            "directory whose name starts with '_'), or create the table with format_version=2 (position deletes are "
            "Parquet files). Nothing was written"
        ) from None
    try:
        io.delete(probe)
    except OSError:
        pass  # an orphan of a few bytes, collected by orphan removal
    _accepted.add(data_path)
