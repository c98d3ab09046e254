#!/usr/bin/env bash
# Install and start a local PostgreSQL for the PostgreSQL-catalog test; prints the URI.
# Needs root and Debian's packages (the CI machine has both). Idempotent.
set -euo pipefail
if ! command -v pg_lsclusters >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null 2>&1
fi
read -r version cluster port status _ < <(pg_lsclusters -h | head -n 1)
if [ "$status" != "online" ]; then
  pg_ctlcluster "$version" "$cluster" start >/dev/null
fi
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_roles WHERE rolname = 'lakesink'\"" | grep -q 1 \
  || su postgres -c "psql -qc \"CREATE USER lakesink PASSWORD 'lakesink' SUPERUSER\"" >/dev/null
su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname = 'lakesink'\"" | grep -q 1 \
  || su postgres -c "createdb -O lakesink lakesink" >/dev/null
echo "postgresql+psycopg2://lakesink:lakesink@localhost:${port}/lakesink"
