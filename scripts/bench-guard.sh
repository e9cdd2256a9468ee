#!/usr/bin/env bash
# CI's guard against double deliveries under load and against rot in the soak: on each
# store, the load bench's `hot_fail` scenario (all connections on a few fresh keys, the
# target failing 20 % of deliveries) for a few seconds, then a few seconds of its `soak`
# scenario with a tiny prefill (2 000 done rows over a week, 1 714 of them past a 1-day
# retention: the sweeper must remove exactly those); then, on Postgres, its `keepers`
# scenario with 300 dead letters of 256 KiB moved as keepers by the slot ring over nine
# 4-second windows of a turn of aging each (about 40 s). The bench exits non-zero if the
# target saw any duplicate, the soak's retention checks fail, or the ring stops turning or
# holds claims behind its lock (the keepers' checks).
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
  cargo bench -q --bench load -- --scenario soak --store "$store" --duration "$duration" \
    --prefill 2000 --retention 1d --window 1s --rate 200
done
cargo bench -q --bench load -- --scenario keepers --store postgres --dead 300 \
  --dead-bytes 256KiB --window 4s --duration 36s
