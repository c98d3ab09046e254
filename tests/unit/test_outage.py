"""What counts as an object store that is away (the budget is the retry policy's:
tests/unit/test_retry_policy.py)."""

from __future__ import annotations

import pytest

from lakesink_datasource.iceberg.outage import is_transient_io
from lakesink_datasource.iceberg.retry import current, store_unavailable

AWAY = OSError("When reading information for key 'a/b.json' in bucket 'plain': AWS Error NETWORK_CONNECTION during HeadObject "
               "operation: curlCode: 7, Couldn't connect to server")


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (AWAY, True),
        (OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate (SlowDown)"), True),
        (ConnectionResetError("Connection reset by peer"), True),
        (OSError("AWS Error SERVICE_UNAVAILABLE during GetObject operation: 503 Service Unavailable"), True),
        (FileNotFoundError("s3://plain/missing.parquet"), False),
        (OSError("AWS Error NO_SUCH_KEY during GetObject operation: The specified key does not exist (NoSuchKey)"), False),
        (OSError("AWS Error ACCESS_DENIED during PutObject operation: Access Denied"), False),
        (ValueError("not an I/O error"), False),
    ],
)
def test_only_errors_that_pass_by_themselves_are_waited_for(error: BaseException, transient: bool) -> None:
    assert is_transient_io(error) is transient


def test_an_error_that_will_not_pass_is_raised_at_once() -> None:
    """Through the FileIO's own retries (iceberg/file_io.py), outside any operation: a
    missing object is no outage."""
    calls = []

    def call() -> None:
        calls.append(1)
        raise FileNotFoundError("s3://plain/missing.parquet")

    with pytest.raises(FileNotFoundError):
        current({}, "opening s3://plain/missing.parquet").run(call, doing="opening s3://plain/missing.parquet", exhausted=store_unavailable)
    assert calls == [1]
