#!/usr/bin/env bash
# The test command: starts a throwaway PostgreSQL (installing it if missing), runs the
# whole suite against it, and stops it again, whatever the outcome.
# Extra arguments go to `cargo test` (e.g. scripts/test.sh concurrent).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=$(mktemp -d /tmp/hookgate-pg.XXXXXX)
trap 'scripts/pg-throwaway.sh stop "$dir"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir")"
echo "test database: $HOOKGATE_TEST_DATABASE_URL" >&2
cargo test "$@"
