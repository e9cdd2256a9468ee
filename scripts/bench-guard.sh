#!/usr/bin/env bash
# CI's guard against double deliveries under load: the load bench's `hot_fail` scenario
# (all connections on a few fresh keys, the target failing 20 % of deliveries) for a few
# seconds on each store. The bench exits non-zero if the target saw any duplicate.
# Usage: scripts/bench-guard.sh [DURATION]   (default 3s). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-3s}

dir=$(mktemp -d /tmp/hookgate-guard.XXXXXX)
trap 'scripts/pg-throwaway.sh stop "$dir"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir")"
export HOOKGATE_BENCH_DATABASE_URL="$HOOKGATE_TEST_DATABASE_URL"
unset HOOKGATE_TEST_DATABASE_URL
for store in sqlite postgres; do
  cargo bench -q --bench load -- --scenario hot_fail --store "$store" --duration "$duration"
done
