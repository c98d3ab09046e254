"""The next metadata file's number follows the table's current one, whichever engine named it."""

from __future__ import annotations

import pytest

from lakesink_datasource.catalog.sql_commit import metadata_version


@pytest.mark.parametrize(
    ("location", "version"),
    [
        ("s3://b/db/t/metadata/00001-6c97e413-d51b-4538-ac70-12fe2a85cb83.metadata.json", 1),  # pyiceberg's, JdbcCatalog's
        ("file:///w/db/t/metadata/v11.metadata.json", 11),  # Hadoop tables', Java's tools'
        ("/w/db/t/metadata/v3.gz.metadata.json", 3),
        ("/w/db/t/metadata/00012-abc.gz.metadata.json", 12),
        ("/w/db/t/metadata/snapshot.metadata.json", -1),  # no number: the next one is 00000
    ],
)
def test_a_metadata_files_version_is_read_from_either_naming(location: str, version: int) -> None:
    assert metadata_version(location) == version
