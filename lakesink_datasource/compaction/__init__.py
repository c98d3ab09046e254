"""Compaction's parts that both sides of a write use: which files to merge (the driver plans
them with the batch) and how to rewrite them (a write task does it beside its rows)."""
