"""lakesink's version, importable from every layer."""

__version__ = "0.1.0"
# The one pyiceberg release lakesink's v3 metadata layer is written against (iceberg/compat.py).
PINNED_PYICEBERG_VERSION = "0.12.0"
