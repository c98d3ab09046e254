#!/usr/bin/env bash
# The PySpark minors lakesink supports, oldest first, one a line: SUPPORTED_MINORS in
# lakesink_datasource/spark_version.py (read without importing the package, so any Python will do).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import ast
source = open("lakesink_datasource/spark_version.py").read()
for node in ast.parse(source).body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SUPPORTED_MINORS":
        for major, minor in ast.literal_eval(node.value):
            print(f"{major}.{minor}")
PY
