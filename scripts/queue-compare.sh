#!/usr/bin/env bash
# hookgate's queue mode beside graphile-worker, in one sitting on one durable throwaway
# PostgreSQL cluster and one target (benches/comparison/main.rs):
#   * burn-down, EVENTS already durable, then the workers start, until the target has them
#     all: hookgate with its defaults; hookgate with 4 shards x 64 workers and a pool of
#     32; graphile-worker 0.17 (scripts/queue-compare/, pinned) with 32 jobs at once,
#     localQueue.size 500 and completeJobBatchDelay 0;
#   * ingest + delivery, hookgate defaults: 64 senders posting new keys for DURATION in
#     queue mode while the deliveries run.
# Prints one markdown table of each, with the ratios hookgate/graphile-worker (medians
# over the rounds). Compare figures within one sitting only: this host is shared.
#
# Usage: scripts/queue-compare.sh [EVENTS=50000] [DURATION=60s] [ROUNDS=1]
#   ROUNDS > 1 runs the three burn-downs alternately that many times.
#   QC_DIAG=1 then restarts the cluster with pg_stat_statements and prints each system's
#   statements per event for one more burn-down of each (a diagnostic: the extension costs
#   CPU, so those runs are not in the table).
# Needs: cargo, Node.js >= 20 with npm, PostgreSQL (pg-throwaway.sh installs it as root).
set -euo pipefail
cd "$(dirname "$0")/.."

events=${1:-50000}
duration=${2:-60s}
rounds=${3:-1}

dir=$(mktemp -d /tmp/hookgate-queue-compare.XXXXXX)
chmod 755 "$dir" # the cluster's owner (postgres, when run as root) must reach $dir/pg
trap 'scripts/pg-throwaway.sh stop "$dir/pg"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir/pg" durable)"
export HOOKGATE_BENCH_DATABASE_URL=$HOOKGATE_TEST_DATABASE_URL

(cd scripts/queue-compare && npm ci --no-audit --no-fund --loglevel=error)
echo "# graphile-worker $(node -p 'require("./scripts/queue-compare/node_modules/graphile-worker/package.json").version'), node $(node --version), $(nproc) cpus" >&2
cargo bench --bench comparison --no-run 2>&1 | tail -1 >&2

results="$dir/results"
bench() {
  cargo bench --quiet --bench comparison -- "$@" >"$dir/last"
  cat "$dir/last" >>"$results"
  cat "$dir/last" >&2
}

for round in $(seq "$rounds"); do
  echo "# round $round" >&2
  bench --scenario burndown --system hookgate --label "hookgate_default_$round" --events "$events"
  bench --scenario burndown --system hookgate --label "hookgate_4x64_pool32_$round" \
    --shards 4 --workers-per-shard 64 --pool-size 32 --events "$events"
  bench --scenario burndown --system graphile --label "graphile_c32_lq500_$round" \
    --concurrency 32 --local-queue 500 --events "$events"
done
bench --scenario ingest --label ingest_default --connections 64 --duration "$duration"
# The same at a fixed offered rate (open loop), below what the closed-loop run delivered:
# does the queue keep up (backlog at the end under a second's worth)?
offered=${QC_RATE:-$(python3 -c "import sys; l=[x for x in open('$results') if 'label=ingest_default' in x][-1]; d=dict(kv.split('=',1) for kv in l.split()[1:]); print(int(float(d['delivered_rate'])*0.8))")}
bench --scenario ingest --label "ingest_rate_$offered" --connections 64 --duration "$duration" --rate "$offered"

python3 - "$results" <<'EOF'
import statistics, sys

runs = []
for line in open(sys.argv[1]):
    if line.startswith("QC "):
        runs.append(dict(kv.split("=", 1) for kv in line.split()[1:]))

def num(run, key):
    return float(run[key])

def config(run):
    return run["label"].rsplit("_", 1)[0]

def pauses(run):
    return f"{run['pauses']} ({num(run, 'paused_s'):.1f} s)"

burn = [r for r in runs if r["scenario"] == "burndown"]
print("\n| burn-down | events | s | first delivery s | pauses > 0.25 s | deliveries/s "
      "| Postgres CPU µs/event | worker CPU µs/event | commits/event | answer → outcome written p99 ms "
      "| duplicates | unfinished |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in burn:
    print(f"| {r['label']} | {int(num(r, 'events')):,} | {num(r, 'seconds'):.1f} "
          f"| {num(r, 'first_s'):.2f} | {pauses(r)} "
          f"| {num(r, 'rate'):,.0f} | {num(r, 'pg_us'):.0f} | {num(r, 'worker_us'):.0f} "
          f"| {num(r, 'commits'):.3f} | {r.get('write_p99_ms', '-')} | {r['duplicates']} | {r['unfinished']} |")

medians = {}
for r in burn:
    medians.setdefault(config(r), []).append(r)
median = {c: {k: statistics.median(num(r, k) for r in rs) for k in ("rate", "pg_us", "worker_us", "commits")}
          for c, rs in medians.items()}
graphile = [c for c in median if c.startswith("graphile")]
if graphile:
    g = median[graphile[0]]
    print(f"\n| hookgate / {graphile[0]} (medians) | deliveries/s | Postgres CPU/event "
          "| worker CPU/event | commits/event |")
    print("|---|---:|---:|---:|---:|")
    for c, m in median.items():
        if c.startswith("hookgate"):
            print(f"| {c} | {m['rate'] / g['rate']:.2f}× | {m['pg_us'] / g['pg_us']:.2f}× "
                  f"| {m['worker_us'] / g['worker_us']:.2f}× | {m['commits'] / g['commits']:.1f}× |")

print("\n| ingest + delivery (hookgate) | accepted/s | delivered/s | backlog at end "
      "| drained after s | pauses > 0.25 s | 202→target p50 ms | p99 ms "
      "| Postgres CPU µs/event | hookgate CPU µs/event | commits/event | refused | duplicates |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in (r for r in runs if r["scenario"] == "ingest"):
    print(f"| {r['label']} | {num(r, 'accepted_rate'):,.0f} | {num(r, 'delivered_rate'):,.0f} "
          f"| {int(num(r, 'backlog')):,} | {num(r, 'drained_s'):.1f} | {pauses(r)} "
          f"| {num(r, 'p50_ms'):,.1f} "
          f"| {num(r, 'p99_ms'):,.1f} | {num(r, 'pg_us'):.0f} | {num(r, 'worker_us'):.0f} "
          f"| {num(r, 'commits'):.3f} | {r['refused']} | {r['duplicates']} |")
EOF

if [ "${QC_DIAG:-}" = 1 ]; then
  data="$dir/pg/data"
  pg_ctl=$(ls /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | head -1)
  pg_ctl=${pg_ctl:-$(command -v pg_ctl)}
  as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
  psql_admin() { psql "$HOOKGATE_BENCH_DATABASE_URL" -X -q -v ON_ERROR_STOP=1 "$@"; }
  psql_admin -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
  as_pg "$pg_ctl" -D "$data" -w restart -m fast >/dev/null
  psql_admin -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
  # Statements of one run's database per event, costliest first (exec time is wall time
  # inside the executor: on two busy cores it includes waiting for a CPU).
  statements() {
    echo
    echo "statements of $1, per event ($2 events), costliest first:"
    psql_admin -P pager=off -c "
      SELECT round(calls::numeric / $2, 3) AS calls_per_event,
             round((total_exec_time * 1000 / $2)::numeric, 1) AS exec_us_per_event,
             round(rows::numeric / greatest(calls, 1), 1) AS rows_per_call,
             round(wal_bytes / $2) AS wal_bytes_per_event,
             left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS statement
      FROM pg_stat_statements
      WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'qc_$1')
      ORDER BY total_exec_time DESC LIMIT 12"
  }
  for sys in hookgate graphile; do
    bench --scenario burndown --system "$sys" --label "diag_$sys" --events "$events"
    statements "diag_$sys" "$events"
  done
  bench --scenario ingest --label diag_ingest --connections 64 --duration 20s
  statements diag_ingest "$(sed -n 's/^QC scenario=ingest label=diag_ingest .* accepted=\([0-9]*\) .*/\1/p' "$dir/last")"
fi
