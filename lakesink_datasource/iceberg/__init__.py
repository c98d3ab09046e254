"""The Iceberg format floor: everything lakesink writes or reads in a table's metadata.

Manifests and manifest lists (v2/v3, row lineage), live-file listing, snapshot history,
summary keys and counters, the partition-key codec, Puffin files and deletion vectors, and
the scoped pyiceberg v3 shim. Built on pyiceberg's models and FileIO; nothing here imports
another lakesink package, and every other package may import from here.
"""
