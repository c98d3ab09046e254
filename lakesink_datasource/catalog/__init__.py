"""The catalogs lakesink commits through."""

# Each catalog's errors, by type and status, for the retry policy: registered as soon as any
# catalog module is imported (a catalog's error can only come from one of them).
from lakesink_datasource.catalog import failures as _failures  # noqa: F401
