"""The metadata cache's two tiers: few live objects, the rest pickled, values unchanged."""

from __future__ import annotations

import gc

from lakesink_datasource.iceberg.object_cache import TieredCache


def _value(i: int) -> list[dict[str, object]]:
    return [{"path": f"s3://b/{i}/{j}.parquet", "bounds": [i, j], "nested": {"n": j}} for j in range(10)]


def test_values_round_trip_through_the_cold_tier_and_live_objects_stay_bounded() -> None:
    cache: TieredCache[int, list[dict[str, object]]] = TieredCache(len, hot_weight=100, cold_bytes=1 << 20)
    for i in range(1_000):
        cache.put(i, _value(i))
    assert cache.hot_weight <= 100  # ten values of ten items stay live, the rest are bytes
    assert 0 < cache.cold_bytes <= 1 << 20
    assert cache.get(3) == _value(3)  # from the cold tier, parsed back
    assert cache.get(999) == _value(999)  # from the hot tier
    assert cache.get(5_000) is None
    # The collector walks the hot tier only: the 990 cold values are a few bytes objects each.
    tracked = sum(1 for o in gc.get_objects() if isinstance(o, dict) and str(o.get("path", "")).startswith("s3://b/"))
    assert tracked <= 110


def test_the_cold_tier_is_bounded_by_bytes_and_forgets_the_oldest() -> None:
    cache: TieredCache[int, list[dict[str, object]]] = TieredCache(len, hot_weight=10, cold_bytes=20_000)
    for i in range(500):
        cache.put(i, _value(i))
    assert cache.cold_bytes <= 20_000
    assert cache.get(0) is None  # the oldest went first
    assert cache.get(498) == _value(498)
