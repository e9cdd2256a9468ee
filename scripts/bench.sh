#!/usr/bin/env bash
# Reproduces the performance figures of docs/performance.md on this machine:
#   1. pgbench running the two bare statements (claim, then mark done) as prepared
#      statements, as hookgate runs its own, on a durable throwaway PostgreSQL (fsync
#      on), 64 clients: the reference for first_run;
#   2. the load bench's `bare` scenario (a fixed-body actix-web handler): the reference
#      for duplicate_done;
#   3. every load-bench scenario on PostgreSQL, then on SQLite;
#   4. three more pairs of pgbench and Postgres `unique`, alternated, and their ratios:
#      this machine is noisy enough that one pair says little;
#   5. CPU per first run against pgbench's CPU per event, three alternated pairs
#      (scripts/cpu-per-event.sh: the release binary driven from outside, hookgate's
#      process plus Postgres's backends against pgbench's client plus backends).
# Usage: scripts/bench.sh [DURATION]   (default 10s per run). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
secs=${duration%s}

dir=$(mktemp -d /tmp/hookgate-bench.XXXXXX)
trap 'scripts/pg-throwaway.sh stop "$dir"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir" durable)"
export HOOKGATE_BENCH_DATABASE_URL="$HOOKGATE_TEST_DATABASE_URL"
unset HOOKGATE_TEST_DATABASE_URL
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pgbench | head -1)")
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

echo "## machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "## pgbench: claim + mark done, two autocommit prepared statements per event, 64 clients"
as_pg "$pgbin/psql" -q "$HOOKGATE_BENCH_DATABASE_URL" <<'SQL'
CREATE TABLE pgbench_events (
  provider text NOT NULL, event_key text NOT NULL, status text NOT NULL,
  attempts int NOT NULL DEFAULT 1, locked_until timestamptz,
  PRIMARY KEY (provider, event_key));
SQL
cat > "$dir/claim.sql" <<'SQL'
\set k random(1, 2000000000)
INSERT INTO pgbench_events (provider, event_key, status, attempts, locked_until)
VALUES ('p', :k, 'in_progress', 1, now() + interval '30 seconds')
ON CONFLICT (provider, event_key) DO UPDATE
SET status = 'in_progress', attempts = pgbench_events.attempts + 1,
    locked_until = now() + interval '30 seconds'
WHERE pgbench_events.status = 'failed'
   OR (pgbench_events.status = 'in_progress' AND pgbench_events.locked_until < now())
RETURNING attempts;
UPDATE pgbench_events SET status = 'done', locked_until = NULL
WHERE provider = 'p' AND event_key = :k::text AND attempts = 1 AND status = 'in_progress';
SQL
chmod 644 "$dir/claim.sql"
# Each run starts with the previous run's dirty pages written out, so no run pays for
# another's checkpoint.
checkpoint() { as_pg "$pgbin/psql" -q "$HOOKGATE_BENCH_DATABASE_URL" -c CHECKPOINT; }
run_pgbench() {
  checkpoint
  as_pg "$pgbin/pgbench" -n -M prepared -c 64 -j 2 -T "$secs" -f "$dir/claim.sql" \
    "$HOOKGATE_BENCH_DATABASE_URL"
}
run_pgbench | grep -E "^(tps|latency)"

cargo bench -q --bench load -- --scenario bare --duration "$duration"
checkpoint
cargo bench -q --bench load -- --store postgres --duration "$duration"
cargo bench -q --bench load -- --store sqlite --duration "$duration"

echo "## pairs: pgbench, then Postgres unique, alternated"
for pair in 1 2 3; do
  tps=$(run_pgbench | awk '/^tps/ {printf "%.0f", $3}')
  checkpoint
  rps=$(cargo bench -q --bench load -- --scenario unique --store postgres --duration "$duration" \
    | sed -n 's/.*rps= *\([0-9]*\).*/\1/p')
  echo "pair $pair: pgbench $tps events/s, unique $rps req/s, ratio $(awk "BEGIN {printf \"%.2f\", $rps / $tps}")"
done

echo "## CPU per first run against pgbench's CPU per event"
# Its own cluster: this one is stopped first, so its autovacuum adds nothing to the counts.
scripts/pg-throwaway.sh stop "$dir"
scripts/cpu-per-event.sh "$duration" 3
