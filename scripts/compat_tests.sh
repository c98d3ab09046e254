#!/usr/bin/env bash
# The compatibility set of one older PySpark minor, in its own venv (scripts/compat_venv.sh):
# the Spark-session tests of writes, keyed writes, reads, stream reads, SQL, metadata tables
# and key routing, the exactly-once kill tests of keyed upserts (a SIGKILL after the commit,
# during the tasks' writes, a task failure; routed and not) and of an append after its
# commit, the foreachBatch sink, the demo (which finds lakesink by name, registering nothing),
# Spark's lookup of pyspark_lakesink, and the pipeline example (4.1 and newer: run, then run
# again with nothing new; the full refresh runs with the whole suite on the newest minor). Usage: scripts/compat_tests.sh 4.1
set -euo pipefail
cd "$(dirname "$0")/.."
MINOR=${1:?usage: scripts/compat_tests.sh MINOR}
VENV=$(./scripts/compat_venv.sh "$MINOR")
echo "lakesink: the compatibility set on PySpark $("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q \
  tests/integration/test_streaming_roundtrip.py tests/integration/test_keyed_writes.py tests/integration/test_read.py \
  tests/integration/test_stream_read.py tests/integration/test_batch_and_sql.py tests/integration/test_metadata_tables.py \
  tests/integration/test_key_routing.py tests/integration/test_demo.py \
  "tests/integration/test_exactly_once.py::test_keyed_upserts_survive_crashes_and_the_index_recovers" \
  "tests/integration/test_exactly_once.py::test_kill_after_iceberg_commit_before_spark_commit_log_replays_without_duplicates" \
  tests/integration/test_batch_sink.py tests/unit/test_spark_rows.py \
  tests/unit/test_spark_version.py tests/unit/test_pyspark_module.py tests/integration/test_pipeline_example.py
