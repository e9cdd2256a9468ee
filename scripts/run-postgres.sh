#!/usr/bin/env bash
# Runs hookgate on a throwaway local PostgreSQL (installed from Debian's packages if
# missing), with config/hookgate.toml. Extra arguments go to `hookgate serve`.
# The cluster is stopped and removed when hookgate exits.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=$(mktemp -d /tmp/hookgate-run.XXXXXX)
trap 'scripts/pg-throwaway.sh stop "$dir"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir")"
export HOOKGATE_STORE__URL="$HOOKGATE_TEST_DATABASE_URL"
unset HOOKGATE_TEST_DATABASE_URL
cargo run --release -- serve "$@"
