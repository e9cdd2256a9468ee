#!/usr/bin/env bash
# What a first run costs in CPU, against what the two bare statements (claim, then mark
# done) cost in pgbench, on one durable throwaway PostgreSQL in one sitting (docs/performance.md):
#   * pgbench: the claim upsert then the mark-done update, prepared, 64 clients; CPU of the
#     pgbench process plus every Postgres backend (the postmaster's reaped children too),
#     per event;
#   * hookgate: the release binary (`hookgate serve`, Postgres store, the default
#     log.level = "info", its log lines written to a file), driven from outside by the load
#     bench's `unique` scenario (`--url`); CPU of hookgate's process plus Postgres's, per
#     delivered first run (the bench's driver and target are not counted).
# Prints each run and the ratio hookgate / pgbench, for ROUNDS alternated pairs.
# Usage: scripts/cpu-per-event.sh [DURATION=10s] [ROUNDS=3]. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
rounds=${2:-3}

dir=$(mktemp -d /tmp/hookgate-cpu.XXXXXX)
chmod 755 "$dir"
trap 'kill "$(cat "$dir/node.pid" 2>/dev/null)" 2>/dev/null || true; scripts/pg-throwaway.sh stop "$dir/pg"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir/pg" durable)"
export HOOKGATE_BENCH_DATABASE_URL=$HOOKGATE_TEST_DATABASE_URL
cargo build -q --release --bin hookgate
cargo bench -q --bench load --no-run 2>/dev/null
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pgbench | head -1)")
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
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
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
target_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$dir/hookgate.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
mailbox_capacity = 4096
[store]
url = "$HOOKGATE_BENCH_DATABASE_URL"
schema = "cpu"
[[providers]]
name = "bench"
preset = "none"
key = [{ header = "X-Idempotency-Key" }]
target = { url = "http://127.0.0.1:$target_port/effects", timeout = "10s" }
TOML

DIR=$dir PGBIN=$pgbin DURATION=$duration ROUNDS=$rounds PORT=$port TARGET_PORT=$target_port \
python3 - <<'PY'
import os, re, resource, subprocess, time, urllib.request

d, pgbin = os.environ["DIR"], os.environ["PGBIN"]
secs = int(os.environ["DURATION"].rstrip("s"))
url = os.environ["HOOKGATE_BENCH_DATABASE_URL"]
tick = os.sysconf("SC_CLK_TCK")
as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []

def stat(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return [int(x) for x in fields[11:15]]  # utime stime cutime cstime

def postgres_ticks():
    pm = int(open(f"{d}/pg/data/postmaster.pid").readline())
    own = stat(pm)
    total = sum(own)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pm:
                total += int(fields[11]) + int(fields[12])
    return total

def checkpoint():
    subprocess.run(as_pg + [f"{pgbin}/psql", "-q", url, "-c", "CHECKPOINT"], check=True)

def pgbench():
    checkpoint()
    before_pg, before_self = postgres_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(as_pg + [f"{pgbin}/pgbench", "-n", "-M", "prepared", "-c", "64",
                          "-j", "2", "-T", str(secs), "-f", f"{d}/claim.sql", url],
                         capture_output=True, text=True, check=True).stdout
    after_self = resource.getrusage(resource.RUSAGE_CHILDREN)
    pg_us = (postgres_ticks() - before_pg) / tick * 1e6
    client_us = ((after_self.ru_utime - before_self.ru_utime)
                 + (after_self.ru_stime - before_self.ru_stime)) * 1e6
    events = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    return events, pg_us / events, client_us / events

def hookgate(pair):
    # A fresh schema each run: the bench's keys repeat from run to run.
    config = open(f"{d}/hookgate.toml").read().replace('schema = "cpu"', f'schema = "cpu{pair}"')
    open(f"{d}/hookgate-{pair}.toml", "w").write(config)
    checkpoint()
    log = open(f"{d}/node.log", "w")
    node = subprocess.Popen(["target/release/hookgate", "serve", "--config", f"{d}/hookgate-{pair}.toml"],
                            stdout=log, stderr=subprocess.STDOUT)
    open(f"{d}/node.pid", "w").write(str(node.pid))
    port = os.environ["PORT"]
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            break
        except Exception:
            time.sleep(0.05)
    before_pg, before_node = postgres_ticks(), sum(stat(node.pid)[:2])
    out = subprocess.run(["cargo", "bench", "-q", "--bench", "load", "--", "--scenario", "unique",
                          "--url", f"http://127.0.0.1:{port}/webhooks/bench",
                          "--target-listen", f"127.0.0.1:{os.environ['TARGET_PORT']}",
                          "--duration", f"{secs}s"], capture_output=True, text=True).stdout
    after_pg, after_node = postgres_ticks(), sum(stat(node.pid)[:2])
    node.terminate()
    node.wait()
    events = int(re.search(r"deliveries=(\d+)", out).group(1))
    duplicates = int(re.search(r"duplicates=(\d+)", out).group(1))
    pg_us = (after_pg - before_pg) / tick * 1e6 / events
    node_us = (after_node - before_node) / tick * 1e6 / events
    return events, pg_us, node_us, duplicates

print("| pair | pgbench events/s | pgbench CPU µs/event (Postgres + client) "
      "| hookgate first runs/s | hookgate CPU µs/first run (Postgres + hookgate) | ratio | duplicates |")
print("|---|---:|---:|---:|---:|---:|---:|")
for pair in range(1, int(os.environ["ROUNDS"]) + 1):
    events, pg, client = pgbench()
    h_events, h_pg, h_node, dup = hookgate(pair)
    print(f"| {pair} | {events / secs:,.0f} | {pg + client:.0f} ({pg:.0f} + {client:.0f}) "
          f"| {h_events / secs:,.0f} | {h_pg + h_node:.0f} ({h_pg:.0f} + {h_node:.0f}) "
          f"| {(h_pg + h_node) / (pg + client):.2f}× | {dup} |", flush=True)
PY
