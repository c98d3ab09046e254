#!/usr/bin/env bash
# Make (or reuse) a virtualenv with lakesink and an older PySpark minor, for the compatibility
# set CI runs on every supported minor but the newest: scripts/compat_venv.sh 4.1 prints the
# venv's directory (.venv-spark4.1). The minors are SUPPORTED_MINORS in
# lakesink_datasource/spark_version.py (scripts/spark_minors.sh lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
MINOR=${1:?usage: scripts/compat_venv.sh MINOR (e.g. 4.1)}
VENV=".venv-spark$MINOR"
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
"$VENV/bin/python" -m pip install --quiet -e '.[test,cluster]' --config-settings editable_mode=compat "pyspark[connect,pipelines]==$MINOR.*" >&2
"$VENV/bin/python" -c "import pyspark, sys; v = pyspark.__version__; sys.exit(0 if v.startswith('$MINOR.') else 'installed PySpark ' + v)"
# Its own Spark's class archive (scripts/spark_class_archive.py): the set's drivers start faster.
"$VENV/bin/python" scripts/spark_class_archive.py >/dev/null
# And its own pyspark.zip with bytecode (scripts/compile_pyspark_zip.py), as for .venv.
"$VENV/bin/python" scripts/compile_pyspark_zip.py >/dev/null
# And lakesink's own modules' bytecode for its Python (scripts/setup.sh says why).
"$VENV/bin/python" -m compileall -q -j 0 lakesink_datasource pyspark_lakesink benchmarks >/dev/null
echo "$VENV"
