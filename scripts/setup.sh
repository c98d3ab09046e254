#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with lakesink and its test dependencies.
# Spark needs Java 17+ on PATH (the machine image has it; say so loudly if not).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1; then
  echo "lakesink: Java 17+ is required by Spark (apt-get install -y openjdk-17-jre-headless)" >&2
  exit 1
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# compat: the project's folder on sys.path, where Spark's lookup of `pyspark_*` modules
# (pkgutil.iter_modules) sees pyspark_lakesink; setuptools' default editable finder hides it.
.venv/bin/python -m pip install --quiet -e '.[test]' --config-settings editable_mode=compat
# Spark's drivers start in half the time from a class archive of this venv's Spark, recorded
# once by a small job (about a minute; kept while Spark and Java stay the same). The tests hand
# it to every driver they start; without it they only start slower.
.venv/bin/python scripts/spark_class_archive.py >/dev/null
# Spark's Python workers import pyspark from a zip with no bytecode, compiling it again in every
# daemon Spark starts (half a second of CPU or more each): rebuilt once with bytecode, as
# docs/deploy.md recommends to any deployment (seconds; Spark's own zip kept beside it).
.venv/bin/python scripts/compile_pyspark_zip.py >/dev/null
# An editable install leaves lakesink's own modules without bytecode, and where
# PYTHONDONTWRITEBYTECODE is set (this machine's image sets it) no process writes any: every
# Python worker Spark starts would compile the modules its role imports again (0.2-0.4 s of CPU
# each, measured in docs/performance.md). Installing a wheel compiles them; so does this.
.venv/bin/python -m compileall -q -j 0 lakesink_datasource pyspark_lakesink benchmarks >/dev/null
