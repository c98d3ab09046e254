"""What counts as an object store that is away, and the outage budget's end."""

from __future__ import annotations

import pytest

from lakesink_datasource.iceberg import outage
from lakesink_datasource.iceberg.outage import OUTAGE_TIMEOUT_MS, StoreUnavailable, is_transient_io, with_retries

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


def test_a_store_that_comes_back_within_the_budget_is_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    failures = [AWAY, AWAY]

    def call() -> str:
        if failures:
            raise failures.pop()
        return "read"

    assert with_retries(call, "opening s3://plain/a/b.json") == "read"
    assert "opening s3://plain/a/b.json failed" in capsys.readouterr().err  # it said what it waits for


def test_past_the_budget_the_error_names_what_failed_and_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outage, "_budget_ms", 0)

    def call() -> None:
        raise AWAY

    with pytest.raises(StoreUnavailable, match=rf"opening s3://plain/a/b\.json kept failing .* outage budget of 0 s.*{OUTAGE_TIMEOUT_MS}"):
        with_retries(call, "opening s3://plain/a/b.json")


def test_an_error_that_will_not_pass_is_raised_at_once() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise FileNotFoundError("s3://plain/missing.parquet")

    with pytest.raises(FileNotFoundError):
        with_retries(call, "opening s3://plain/missing.parquet")
    assert calls == [1]
