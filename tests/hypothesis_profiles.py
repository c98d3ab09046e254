"""Hypothesis profiles of the suite, and per-test example counts relative to them.

- `dev` (the default): a quarter of the examples, random, so that the fast set a plain
  `pytest` runs stays fast; a failure is saved in `.hypothesis/` and replayed first on the
  next run, so a failure seen once is seen again until it is fixed.
- `ci` (`.ci/run`): every example, derandomised: every run draws the same examples for the same code, so a
  red CI run belongs to the commit that made it and can be re-run; a failure prints the
  `@reproduce_failure` blob that replays it anywhere.
- `deep`: ten times the examples, random, with the database: the wider search, run on
  purpose (`pytest --hypothesis-profile=deep tests/unit/test_keyed_property.py`).

A test states its examples for the `ci` budget with `examples(n)`; other profiles
scale it (a keyed scenario costs ~0.5 s an example, a codec round trip ~1 ms).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_BASE = 100  # max_examples of the ci profile: examples(n) gives n there, n/4 under dev

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
settings.register_profile("dev", max_examples=_BASE // 4, **_COMMON)
settings.register_profile("ci", max_examples=_BASE, derandomize=True, print_blob=True, **_COMMON)
settings.register_profile("deep", max_examples=10 * _BASE, **_COMMON)


def examples(n: int) -> int:
    """`n` examples under the ci profile, scaled with the active profile's budget."""
    return max(1, round(n * settings.default.max_examples / _BASE))
