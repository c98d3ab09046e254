#!/usr/bin/env bash
# Pack lakesink and its dependencies into an archive for Spark's `spark.archives`, so that
# executors on workers without lakesink run it (docs/deploy.md):
#
#   ./scripts/pack_env.sh lakesink-env.tar.gz [PYTHON]
#
# PYTHON (default python3) must be the interpreter the workers have at the same path (a venv
# links to its base interpreter). PySpark is left out: executors take it from Spark itself.
# pandas is put in for cluster_by_key and cluster_by_partition. Set PIP_CONSTRAINT to a
# constraints file (e.g. `pip freeze` of the driver's environment) to pin the versions.
set -euo pipefail
out=${1:?usage: pack_env.sh OUT.tar.gz [PYTHON]}
python=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
case $out in /*) ;; *) out="$PWD/$out" ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/env"
"$work/env/bin/python" -m pip install --quiet --no-deps "$root"
requirements=$("$work/env/bin/python" - <<'PY'
import re
from importlib.metadata import requires
wanted = []
for spec in requires("lakesink-datasource") or []:
    name = re.split(r"[ ;<>=!\[]", spec, maxsplit=1)[0].lower()
    if "extra ==" in spec and 'extra == "cluster"' not in spec:
        continue
    if name == "pyspark":
        continue
    wanted.append(spec.split(";")[0].strip())
print("\n".join(wanted))
PY
)
mapfile -t specs <<<"$requirements"
"$work/env/bin/python" -m pip install --quiet --no-warn-conflicts "${specs[@]}" venv-pack==0.2.0  # lakesink needs PySpark: Spark brings it
"$work/env/bin/venv-pack" --prefix "$work/env" --output "$out" --force --quiet
echo "$out"
