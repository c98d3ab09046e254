#!/usr/bin/env bash
# The compatibility set of one older PySpark minor, in its own venv (scripts/compat_venv.sh):
# the tests of what changes between minors, not the whole suite again (which runs on the
# newest minor). What changes is Spark's face: how a Python source is found, registered and
# planned, what a stream sink is handed (Rows on 4.0, Arrow after), the types Spark has
# (time from 4.1), pushed filters and admission control on reads, Spark's own key hash,
# pipelines (4.1+), and the Python processes that plan, write and commit. So each minor runs:
# a stream, a keyed stream and keyed batch, SQL and batch writes, reads, stream reads, a
# metadata table, key routing (the replayed hash against Spark's), Debezium's types, the
# foreachBatch sink, the demo (found by name), Spark's lookup of pyspark_lakesink, a
# spark-submit job that finds it by name and then registers it (refused on 4.0), the pipeline
# example (4.1 and newer: run, then run again with nothing new), and one exactly-once kill
# test of a keyed upsert stream, a different crash window on each minor (after the commit,
# during the tasks' writes, a task failure), so the three older minors cover all three; the
# newest minor runs the three other (window, cluster_by_key or not) pairs. 4.0, whose stream
# sink gets Rows, also kills an append after its commit. Every test the set
# names keeps all its assertions; the whole suite runs on the newest minor.
# Usage: scripts/compat_tests.sh 4.1
set -euo pipefail
cd "$(dirname "$0")/.."
MINOR=${1:?usage: scripts/compat_tests.sh MINOR}
# .ci/run makes the venvs beforehand (LAKESINK_COMPAT_VENVS_MADE=1): no install runs beside
# the suite's own wheel and sdist builds of this tree.
if [ "${LAKESINK_COMPAT_VENVS_MADE:-}" = 1 ] && [ -x ".venv-spark$MINOR/bin/python" ]; then
  VENV=".venv-spark$MINOR"
else
  VENV=$(./scripts/compat_venv.sh "$MINOR")
fi
KEYED_KILLS="tests/integration/test_exactly_once.py::test_keyed_upserts_survive_crashes_and_the_index_recovers"
case "$MINOR" in
  4.0) KILLS=("$KEYED_KILLS[kill-after-commit-cluster_by_key]"
              "tests/integration/test_exactly_once.py::test_kill_after_iceberg_commit_before_spark_commit_log_replays_without_duplicates") ;;
  4.1) KILLS=("$KEYED_KILLS[kill-during-task-writes-unrouted]") ;;
  *) KILLS=("$KEYED_KILLS[task-failure-abort-cluster_by_key]") ;;
esac
I=tests/integration
SET=(
  "$I/test_streaming_roundtrip.py::test_each_micro_batch_is_one_snapshot_visible_to_other_readers"
  "$I/test_streaming_roundtrip.py::test_a_stream_restarted_with_a_wider_source_schema_evolves_the_table"
  "$I/test_streaming_roundtrip.py::test_foreach_batch_writing_every_batch_twice_leaves_each_row_once"
  "$I/test_streaming_roundtrip.py::test_txn_options_on_a_streaming_write_are_refused_before_a_table_is_created"
  "$I/test_keyed_writes.py::test_batch_upsert_and_dedupe"
  "$I/test_keyed_writes.py::test_streaming_cdc_with_sequence_hides_old_rows_with_deletion_vectors"
  "$I/test_batch_and_sql.py::test_sql_create_insert_and_insert_overwrite"
  "$I/test_batch_and_sql.py::test_sql_insert_without_options_explains_the_workaround"
  "$I/test_batch_and_sql.py::test_spark_rejects_errorifexists_and_ignore_before_lakesink_runs"
  "$I/test_batch_and_sql.py::test_complete_mode_replaces_the_table_every_batch"
  "$I/test_batch_and_sql.py::test_partial_overwrites_and_a_branch_through_df_write"
  "$I/test_read.py::test_pushed_filters_give_the_same_rows_and_read_fewer_files"
  "$I/test_read.py::test_sql_reads_go_through_a_temporary_view_and_a_catalog_table_says_so"
  "$I/test_read.py::test_a_large_file_is_read_by_several_tasks_cut_at_row_groups"
  "$I/test_read.py::test_a_keyed_table_reads_like_duckdb_and_pyiceberg_with_its_deletes_applied[2]"
  "$I/test_stream_read.py::test_a_file_limit_spreads_snapshots_over_micro_batches"
  "$I/test_stream_read.py::test_appended_snapshots_are_emitted_once_across_a_restart"
  "$I/test_stream_read.py::test_the_change_feed_of_a_cdc_table_replays_every_later_snapshot"
  "$I/test_metadata_tables.py::test_a_view_over_snapshots_answers_sql"
  "$I/test_metadata_tables.py::test_lakesink_history_has_each_batch_s_figures"
  "$I/test_key_clustering.py::test_the_replayed_hashes_equal_sparks"
  "$I/test_key_clustering.py::test_a_routed_batch_write_gives_each_task_one_shard"
  "$I/test_key_clustering.py::test_a_routed_upsert_stream_writes_every_value_exactly_and_each_host_holds_its_shards"
  "$I/test_debezium_types.py" "$I/test_batch_sink.py" "$I/test_demo.py" "$I/test_found_by_name.py"
  "$I/test_pipeline_example.py"
  tests/unit/test_spark_rows.py tests/unit/test_spark_version.py tests/unit/test_pyspark_module.py
)
echo "lakesink: the compatibility set on PySpark $("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
"$VENV/bin/python" -m pytest -p no:cacheprovider -q "${SET[@]}" "${KILLS[@]}"
