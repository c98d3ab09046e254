#!/usr/bin/env bash
# The compatibility set of one older PySpark minor, in its own venv (scripts/compat_venv.sh):
# the Spark-session tests of writes, keyed writes, reads, stream reads, SQL, metadata tables
# and key routing, Debezium's types (time is Iceberg time from 4.1, a long on 4.0), the
# foreachBatch sink, the demo (which finds lakesink by name, registering nothing), Spark's
# lookup of pyspark_lakesink, a spark-submit job that finds it by name and then registers it
# (refused on 4.0), the pipeline example (4.1 and newer: run, then
# run again with nothing new; the full refresh runs with the whole suite on the newest
# minor), and exactly-once kill tests of keyed upserts: each crash window (a SIGKILL after the
# commit, one during the tasks' writes, a task failure) once on every minor, the routing
# (cluster_by_key or not) alternating so 4.0 and 4.1 between them run all six pairs, and on
# 4.0, whose stream sink gets Rows where the others get Arrow, an append killed after its
# commit. The whole suite, all six pairs included, runs on the newest minor.
# Usage: scripts/compat_tests.sh 4.1
set -euo pipefail
cd "$(dirname "$0")/.."
MINOR=${1:?usage: scripts/compat_tests.sh MINOR}
VENV=$(./scripts/compat_venv.sh "$MINOR")
KEYED_KILLS="tests/integration/test_exactly_once.py::test_keyed_upserts_survive_crashes_and_the_index_recovers"
case "$MINOR" in
  4.1) KILLS=("$KEYED_KILLS[kill-after-commit-unrouted]" "$KEYED_KILLS[kill-during-task-writes-cluster_by_key]"
              "$KEYED_KILLS[task-failure-abort-unrouted]") ;;
  *) KILLS=("$KEYED_KILLS[kill-after-commit-cluster_by_key]" "$KEYED_KILLS[kill-during-task-writes-unrouted]"
            "$KEYED_KILLS[task-failure-abort-cluster_by_key]") ;;
esac
if [ "$MINOR" = "4.0" ]; then
  KILLS+=("tests/integration/test_exactly_once.py::test_kill_after_iceberg_commit_before_spark_commit_log_replays_without_duplicates")
fi
echo "lakesink: the compatibility set on PySpark $("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q \
  tests/integration/test_streaming_roundtrip.py tests/integration/test_keyed_writes.py tests/integration/test_read.py \
  tests/integration/test_stream_read.py tests/integration/test_batch_and_sql.py tests/integration/test_metadata_tables.py \
  tests/integration/test_key_routing.py tests/integration/test_demo.py tests/integration/test_debezium_types.py \
  "${KILLS[@]}" \
  tests/integration/test_batch_sink.py tests/unit/test_spark_rows.py \
  tests/unit/test_spark_version.py tests/unit/test_pyspark_module.py tests/integration/test_found_by_name.py \
  tests/integration/test_pipeline_example.py
