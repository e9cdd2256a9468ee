#!/usr/bin/env bash
# What the slot ring costs the node, end to end (issue 56; docs/design.md "Storage over
# time"), on one durable throwaway PostgreSQL in one sitting, two release binaries
# alternated: BASE_BIN (the build before the ring, 844f552: one plain table) and NEW_BIN
# (today's: six partitions by slot). Each run starts `hookgate serve` (Postgres store,
# log.level = "info", its log in the run directory; retention idle: done and dead kept
# 3650d, a sweep a day, so the ring neither turns nor empties a slot while measured) and
# drives it from outside with the load bench (`--url`, `--target-listen`, 64 connections);
# CPU of hookgate's process and of Postgres (every backend, the postmaster's reaped
# children too) is read from /proc before and after. The bench's driver and target are not
# counted (they share the machine's cores, though). Measures:
#   * unique: sync first runs for DURATION — first runs/s (deliveries at the bench's
#     target), p50/p99, CPU per first run;
#   * duplicate: the bench's `duplicate` (100 keys delivered once, then repeated) with
#     `cache.capacity = 0`, so every answer is read from the key's row — requests/s, p99,
#     CPU per request;
#   * queue: a `mode = "queue"` provider, `unique` for DURATION, then until no row of it is
#     queued, in progress or failed (so the target has had every event and its outcome is
#     written; the target outlives the driver: a second bench process serves it, driving
#     only a closed port once a second) — CPU over the whole per delivered event, with
#     queue.poll_interval = 100ms. QUEUE_RATE=N paces its driver (default: unpaced);
#   * soak (only when named in MEASURES: it runs SOAK_DURATION per binary): a steady ingest
#     of new keys at SOAK_RATE (1500/s) on a fresh schema with retention running —
#     retention.done SOAK_RETENTION (2m), a sweep every SOAK_SWEEP (10s) — for SOAK_DURATION
#     (10m); CPU per delivered event (hookgate_deliveries_total) from SOAK_SETTLE (1.5
#     retention periods and 30 s: rows then go as fast as they come) to the end, vacuum
#     included; at the end the rows, the done rows past retention and the schema's size.
#     A retention of minutes is under the 72-hour floor check-config keeps
#     (src/config/validate.rs's MIN_RETENTION), so both binaries must be built with it
#     lowered, e.g. `sed -i 's/from_secs(72 \* 3600)/from_secs(60)/' src/config/validate.rs`
#     in each build's tree (a scratch change: it changes no per-event work);
#   * pgbench: the bare claim upsert then mark-done update of scripts/cpu-per-event.sh,
#     prepared, 64 clients, DURATION — CPU of Postgres plus pgbench per event, and each
#     binary's first run (unique) as a share of it.
# Every measure runs on empty tables (a fresh schema per run; pgbench's table truncated);
# with PREFILL=N (default 0: short runs) also on tables holding N done rows: one schema per
# binary, prefilled once with SQL after that binary's `migrate` (keys `prefill-<i>`, done
# over the last week; on the ring spread over slots 1-5, 1-4 sealed and 5 current, as a
# ring in its steady state holds them; RING_PREFILL=current puts them all in the current
# slot), vacuumed, analyzed and checkpointed; each run there uses a provider of its own
# (`r<round><measure>`), so its keys are new. pgbench's prefilled table holds N done rows
# too. PREFILL=10000000 takes some minutes and a few GiB of disk per binary.
# A short warm-up run (BASE, unique, not counted), then ROUNDS rounds; in each, per table
# state: pgbench, then each measure on both binaries (BASE first in odd rounds, NEW first
# in even ones). Prints each run, the means, and NEW/BASE of the means and per round.
# The load bench is this repository's (`cargo bench --bench load --no-run`, CARGO_TARGET_DIR
# honoured), or LOAD_BENCH=path. The binaries are not built here.
# Usage: scripts/ring-cost.sh BASE_BIN NEW_BIN [DURATION=15s] [ROUNDS=2]. Loopback only.
# MEASURES="unique duplicate queue pgbench" narrows the runs (add soak to run it); PREFILL=N;
# RING_PREFILL=current; QUEUE_RATE=N; QUEUE_WAIT=600 (longest wait for the queue to drain, seconds);
# STATEMENTS=1 loads pg_stat_statements and writes each run's statements (the costliest by
# execution and planning time, per call: time, rows, shared blocks) to statements-RUN.txt
# in the run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/ring-cost.sh BASE_BIN NEW_BIN [DURATION=15s] [ROUNDS=2]"
base_bin=$(realpath "${1:?$usage}")
new_bin=$(realpath "${2:?$usage}")
duration=${3:-15s}
rounds=${4:-2}
[ -x "$base_bin" ] && [ -x "$new_bin" ] || { echo "BASE_BIN and NEW_BIN must be executables" >&2; exit 1; }

dir=$(mktemp -d /tmp/hookgate-ring-cost.XXXXXX)
chmod 755 "$dir"
cleanup() {
  for f in node.pid host.pid; do kill "$(cat "$dir/$f" 2>/dev/null)" 2>/dev/null || true; done
  scripts/pg-throwaway.sh stop "$dir/pg"
}
trap cleanup EXIT
[ "${STATEMENTS:-}" = 1 ] && export HOOKGATE_PG_STATEMENTS=1
eval "$(scripts/pg-throwaway.sh start "$dir/pg" durable)"
[ "${STATEMENTS:-}" = 1 ] && runuser -u postgres -- psql -qAtX "$HOOKGATE_TEST_DATABASE_URL" \
  -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
export HOOKGATE_BENCH_DATABASE_URL=$HOOKGATE_TEST_DATABASE_URL
if [ -z "${LOAD_BENCH:-}" ]; then
  LOAD_BENCH=$(cargo bench -q --bench load --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "load" and m.get("executable"):
        print(m["executable"])')
fi
[ -x "$LOAD_BENCH" ] || { echo "no load bench executable ($LOAD_BENCH)" >&2; exit 1; }
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pgbench | head -1)")

echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), nproc=$(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg), duration=$duration, rounds=$rounds, prefill=${PREFILL:-0} (ring: ${RING_PREFILL:-spread}), queue rate=${QUEUE_RATE:-unpaced}"
echo "# base: $base_bin ($("$base_bin" --version), modified $(date -u -r "$base_bin" '+%Y-%m-%d %H:%M'))"
echo "# new:  $new_bin ($("$new_bin" --version), modified $(date -u -r "$new_bin" '+%Y-%m-%d %H:%M'))"
echo "# load bench: $LOAD_BENCH; $("$pgbin/postgres" --version); run dir (node logs): $dir"

DIR=$dir PGBIN=$pgbin DURATION=$duration ROUNDS=$rounds BASE_BIN=$base_bin NEW_BIN=$new_bin \
LOAD_BENCH=$LOAD_BENCH python3 - <<'PY'
import os, re, resource, socket, statistics, subprocess, time, urllib.request

d, pgbin = os.environ["DIR"], os.environ["PGBIN"]
secs = int(os.environ["DURATION"].rstrip("s"))
rounds = int(os.environ["ROUNDS"])
url = os.environ["HOOKGATE_BENCH_DATABASE_URL"]
bench_bin = os.environ["LOAD_BENCH"]
prefill = int(os.environ.get("PREFILL", "0"))
ring_prefill = os.environ.get("RING_PREFILL", "spread")
queue_rate = os.environ.get("QUEUE_RATE")
queue_wait = int(os.environ.get("QUEUE_WAIT", "600"))
soak_rate = int(os.environ.get("SOAK_RATE", "1500"))
soak_retention = os.environ.get("SOAK_RETENTION", "2m")
soak_sweep = os.environ.get("SOAK_SWEEP", "10s")
MEASURES = os.environ.get("MEASURES", "unique duplicate queue pgbench").split()
BINS = [("base", os.environ["BASE_BIN"]), ("new", os.environ["NEW_BIN"])]
STATES = ["empty"] + (["prefilled"] if prefill else [])
tick = os.sysconf("SC_CLK_TCK")
as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

PORT, TARGET_PORT = free_port(), free_port()

def stat(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return [int(x) for x in fields[11:15]]  # utime stime cutime cstime

def postgres_ticks():
    pm = int(open(f"{d}/pg/data/postmaster.pid").readline())
    total = sum(stat(pm))
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pm:
                total += int(fields[11]) + int(fields[12])
    return total

def psql(sql, *flags):
    out = subprocess.run(as_pg + [f"{pgbin}/psql", "-qAtX", "-v", "ON_ERROR_STOP=1", *flags, url],
                         input=sql, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"psql failed: {out.stderr}\n{sql[:2000]}")
    return out.stdout.strip()

def checkpoint():
    psql("CHECKPOINT")
    if os.environ.get("STATEMENTS") == "1":
        psql("SELECT pg_stat_statements_reset()")

def statements(name):
    """With STATEMENTS=1: the run's statements, costliest first, to statements-NAME.txt."""
    if os.environ.get("STATEMENTS") != "1":
        return
    text = psql("""SELECT calls, round((total_exec_time + total_plan_time)::numeric, 1) AS total_ms,
       round((total_exec_time / calls * 1000)::numeric, 1) AS exec_us,
       round((total_plan_time / calls * 1000)::numeric, 1) AS plan_us, plans,
       round(rows::numeric / calls, 1) AS rows,
       round((shared_blks_hit + shared_blks_read)::numeric / calls, 1) AS blocks,
       regexp_replace(left(query, 160), '\\s+', ' ', 'g') AS query
FROM pg_stat_statements WHERE calls > 0
ORDER BY total_exec_time + total_plan_time DESC LIMIT 15""", "-F", " | ")
    open(f"{d}/statements-{name}.txt", "w").write(
        "calls | total ms | exec µs/call | plan µs/call | plans | rows/call | blocks/call | query\n"
        + text + "\n")

def get(path):
    return urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=5).read().decode()

def config(name, schema, provider, mode="sync", cache_off=False, retention=("3650d", "1d")):
    # Keys both binaries read alike (the config format only grew since 844f552).
    text = f'''[server]
listen = "127.0.0.1:{PORT}"
mailbox_capacity = 4096
[store]
url = "{url}"
schema = "{schema}"
[queue]
poll_interval = "100ms"
[retention]
done = "{retention[0]}"
dead = "3650d"
sweep_interval = "{retention[1]}"
'''
    if cache_off:
        text += "[cache]\ncapacity = 0\n"
    text += f'''[[providers]]
name = "{provider}"
preset = "none"
mode = "{mode}"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{TARGET_PORT}/effects", timeout = "10s" }}
'''
    path = f"{d}/hookgate-{name}.toml"
    open(path, "w").write(text)
    return path

def start_node(binary, path, name):
    log_path = f"{d}/node-{name}.log"
    log = open(log_path, "w")
    node = subprocess.Popen([binary, "serve", "--config", path], stdout=log, stderr=subprocess.STDOUT)
    open(f"{d}/node.pid", "w").write(str(node.pid))
    for _ in range(1200):
        if node.poll() is not None:
            break
        try:
            get("/readyz")
            # Start-up settles before it is measured: the sweeper's first pass (which, from
            # the build with filters of the sealed slots' keys on, reads those keys: the
            # steady state a node reaches once per slot's life) has ended once the tables'
            # sizes it reads last are published.
            for _ in range(6000):
                if "hookgate_table_bytes{" in get("/metrics"):
                    break
                time.sleep(0.1)
            time.sleep(1)
            return node, log
        except Exception:
            time.sleep(0.05)
    node.kill()
    raise SystemExit(f"the node did not get ready; {log_path}:\n" + open(log_path).read()[-3000:])

def stop_node(node, log):
    """Stops the node; answers how many of its log lines were above info."""
    node.terminate()
    try:
        node.wait(timeout=30)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()
    log.close()
    levels = re.findall(r'"level":"(\w+)"', open(log.name).read())
    return sum(1 for level in levels if level not in ("INFO", "DEBG", "TRCE"))

def bench(name, scenario, provider, target_port, run_secs, extra=()):
    out = subprocess.run([bench_bin, "--scenario", scenario, "--connections", "64",
                          "--url", f"http://127.0.0.1:{PORT}/webhooks/{provider}",
                          "--target-listen", f"127.0.0.1:{target_port}",
                          "--duration", f"{run_secs}s", *extra], capture_output=True, text=True)
    open(f"{d}/bench-{name}.out", "w").write(out.stdout + out.stderr)
    line = next((l for l in out.stdout.splitlines() if l.startswith("scenario=")), None)
    if line is None:
        raise SystemExit(f"the bench printed no result ({name}):\n{out.stdout}{out.stderr}")
    num = lambda k: float(re.search(rf"\b{k}=\s*([\d.]+)", line).group(1))
    return dict(rps=num("rps"), p50=num("p50"), p99=num("p99"), requests=int(num("requests")),
                errors=int(num("errors")), deliveries=int(num("deliveries")),
                duplicates=int(num("duplicates")), rc=out.returncode,
                status=re.search(r"status=(\{[^}]*\})", line).group(1))

def where(state, key, rnd, measure):
    """The schema and provider of a run: a fresh schema on empty tables, the binary's
    prefilled schema and a provider of the run's own otherwise."""
    provider = f"r{rnd}{measure[0]}"
    return (f"e{rnd}{key}{measure[0]}" if state == "empty" else f"pf{key}"), provider

def sync_run(rnd, state, key, binary, scenario, run_secs=None):
    name = f"{rnd}-{state}-{key}-{scenario}"
    schema, provider = where(state, key, rnd, scenario)
    path = config(name, schema, provider, cache_off=scenario == "duplicate")
    checkpoint()
    node, log = start_node(binary, path, name)
    before_pg, before_node = postgres_ticks(), sum(stat(node.pid)[:2])
    b = bench(name, scenario, provider, TARGET_PORT, run_secs or secs)
    time.sleep(0.5)  # outcome writes still in flight when the driver stopped
    after_pg, after_node = postgres_ticks(), sum(stat(node.pid)[:2])
    hits = re.search(r"^hookgate_cache_hits_total (\d+)", get("/metrics"), re.M)
    warnings = stop_node(node, log)
    statements(name)
    units = b["deliveries"] if scenario == "unique" else b["requests"]
    r = dict(b, round=rnd, state=state, bin=key, measure=scenario, units=units,
             cache_hits=int(hits.group(1)) if hits else -1, warnings=warnings,
             per_s=units / (run_secs or secs),
             node_us=(after_node - before_node) / tick * 1e6 / max(units, 1),
             pg_us=(after_pg - before_pg) / tick * 1e6 / max(units, 1))
    r["total_us"] = r["node_us"] + r["pg_us"]
    return r

def queue_run(rnd, state, key, binary):
    name = f"{rnd}-{state}-{key}-queue"
    schema, provider = where(state, key, rnd, "queue")
    path = config(name, schema, provider, mode="queue")
    checkpoint()
    # The target's host: a bench process that outlives the driver, driving only a closed
    # port once a second (its requests fail at connect, cheaply).
    host_log = open(f"{d}/host-{name}.out", "w")
    host = subprocess.Popen([bench_bin, "--scenario", "unique", "--connections", "1", "--rate", "1",
                             "--url", f"http://127.0.0.1:{free_port()}/",
                             "--target-listen", f"127.0.0.1:{TARGET_PORT}",
                             "--duration", f"{secs + queue_wait + 60}s"],
                            stdout=host_log, stderr=subprocess.STDOUT)
    open(f"{d}/host.pid", "w").write(str(host.pid))
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", TARGET_PORT), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    node, log = start_node(binary, path, name)
    poller = subprocess.Popen(as_pg + [f"{pgbin}/psql", "-qAtX", url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, bufsize=1)
    def ask(sql):
        poller.stdin.write(sql + ";\n")
        poller.stdin.flush()
        return poller.stdout.readline().strip()
    open_rows = (f"SELECT count(*) FROM {schema}.webhook_events WHERE provider = '{provider}' "
                 "AND mode = 'queue' AND status IN ('queued', 'in_progress', 'failed')")
    ask("SELECT 1")
    before_pg, before_node = postgres_ticks(), sum(stat(node.pid)[:2])
    started = time.monotonic()
    b = bench(name, "unique", provider, free_port(), secs, ("--rate", queue_rate) if queue_rate else ())
    ingest_s = time.monotonic() - started
    left = int(ask(open_rows))
    while left and time.monotonic() - started < secs + queue_wait:
        time.sleep(0.2)
        left = int(ask(open_rows))
    drained_s = time.monotonic() - started
    after_pg, after_node = postgres_ticks(), sum(stat(node.pid)[:2])
    delivered = int(ask(f"SELECT count(*) FROM {schema}.webhook_events WHERE provider = '{provider}' "
                        "AND status = 'done'"))
    retried = int(ask(f"SELECT count(*) FROM {schema}.webhook_events WHERE provider = '{provider}' "
                      "AND attempts > 1"))
    poller.stdin.close()
    poller.wait()
    warnings = stop_node(node, log)
    statements(name)
    host.terminate()
    host.wait()
    host_log.close()
    r = dict(b, round=rnd, state=state, bin=key, measure="queue", units=delivered,
             accepted=sum(int(n) for s, n in re.findall(r"(\d+):(\d+)", b["status"]) if s == "202"),
             per_s=delivered / drained_s, ingest_s=ingest_s, drained_s=drained_s, left=left,
             retried=retried, warnings=warnings,
             node_us=(after_node - before_node) / tick * 1e6 / max(delivered, 1),
             pg_us=(after_pg - before_pg) / tick * 1e6 / max(delivered, 1))
    r["total_us"] = r["node_us"] + r["pg_us"]
    return r

def seconds(text):
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]

def deliveries_total():
    return sum(int(float(n)) for n in
               re.findall(r"^hookgate_deliveries_total(?:\{[^}]*\})? (\S+)", get("/metrics"), re.M))

def soak_run(rnd, key, binary):
    """A steady ingest at SOAK_RATE with retention running (retention.done SOAK_RETENTION,
    a sweep every SOAK_SWEEP) for SOAK_DURATION on a fresh schema; CPU per delivered event
    over the part after SOAK_SETTLE (by then rows go as fast as they come: row by row
    before the ring, a slot's truncation with it), autovacuum included."""
    name = f"{rnd}-soak-{key}"
    schema, provider = f"s{rnd}{key}", f"r{rnd}s"
    path = config(name, schema, provider, retention=(soak_retention, soak_sweep))
    checkpoint()
    node, log = start_node(binary, path, name)
    driver = subprocess.Popen([bench_bin, "--scenario", "unique", "--connections", "64",
                               "--rate", str(soak_rate),
                               "--url", f"http://127.0.0.1:{PORT}/webhooks/{provider}",
                               "--target-listen", f"127.0.0.1:{TARGET_PORT}",
                               "--duration", f"{soak_secs}s"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.monotonic()
    time.sleep(soak_settle)
    before = postgres_ticks(), sum(stat(node.pid)[:2]), deliveries_total(), time.monotonic()
    time.sleep(max(1, soak_secs - (time.monotonic() - started) - 2))
    after = postgres_ticks(), sum(stat(node.pid)[:2]), deliveries_total(), time.monotonic()
    out = driver.communicate()[0]
    open(f"{d}/bench-{name}.out", "w").write(out)
    line = next((l for l in out.splitlines() if l.startswith("scenario=")), "")
    num = lambda k: float((re.search(rf"\b{k}=\s*([\d.]+)", line) or [0, "nan"])[1])
    rows, past = psql(f"SELECT count(*), count(*) FILTER (WHERE status = 'done' AND updated_at "
                      f"< now() - interval '{seconds(soak_retention)} seconds') "
                      f"FROM {schema}.webhook_events").split("|")
    mib = float(psql(f"SELECT sum(pg_total_relation_size(c.oid)) / 1048576.0 FROM pg_class c "
                     f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' "
                     f"AND c.relkind = 'r'"))
    warnings = stop_node(node, log)
    statements(name)
    events = after[2] - before[2]
    r = dict(round=rnd, state="empty", bin=key, measure="soak", units=events,
             per_s=events / (after[3] - before[3]), p99=num("p99"), duplicates=int(num("duplicates")),
             errors=int(num("errors")), rc=driver.returncode, rows=int(rows), past=int(past),
             mib=mib, warnings=warnings,
             node_us=(after[1] - before[1]) / tick * 1e6 / max(events, 1),
             pg_us=(after[0] - before[0]) / tick * 1e6 / max(events, 1))
    r["total_us"] = r["node_us"] + r["pg_us"]
    return r

soak_secs = seconds(os.environ.get("SOAK_DURATION", "10m"))
soak_settle = seconds(os.environ.get("SOAK_SETTLE", f"{seconds(soak_retention) * 3 // 2 + 30}s"))

YARD = {"empty": "yard.bare", "prefilled": "yard.full"}

def pgbench_run(rnd, state):
    table = YARD[state]
    if state == "empty":
        psql(f"TRUNCATE {table}")
    checkpoint()
    before_pg, before_self = postgres_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(as_pg + [f"{pgbin}/pgbench", "-n", "-M", "prepared", "-c", "64",
                                  "-j", "2", "-T", str(secs), "-f", f"{d}/claim-{state}.sql", url],
                         capture_output=True, text=True)
    after_self = resource.getrusage(resource.RUSAGE_CHILDREN)
    after_pg = postgres_ticks()
    if out.returncode:
        raise SystemExit(f"pgbench failed:\n{out.stdout}{out.stderr}")
    events = int(re.search(r"number of transactions actually processed: (\d+)", out.stdout).group(1))
    client_us = ((after_self.ru_utime - before_self.ru_utime)
                 + (after_self.ru_stime - before_self.ru_stime)) * 1e6 / events
    pg_us = (after_pg - before_pg) / tick * 1e6 / events
    return dict(round=rnd, state=state, bin="pgbench", measure="pgbench", units=events,
                per_s=events / secs, pg_us=pg_us, node_us=client_us, total_us=pg_us + client_us)

# pgbench's tables and statements (scripts/cpu-per-event.sh's), one table per state.
columns = """provider text NOT NULL, event_key text NOT NULL, status text NOT NULL,
  attempts int NOT NULL DEFAULT 1, locked_until timestamptz, PRIMARY KEY (provider, event_key)"""
psql(f"CREATE SCHEMA yard; CREATE TABLE yard.bare ({columns}); CREATE TABLE yard.full ({columns});")
for state, table in YARD.items():
    open(f"{d}/claim-{state}.sql", "w").write(f"""\\set k random(1, 2000000000)
INSERT INTO {table} (provider, event_key, status, attempts, locked_until)
VALUES ('p', :k, 'in_progress', 1, now() + interval '30 seconds')
ON CONFLICT (provider, event_key) DO UPDATE
SET status = 'in_progress', attempts = {table}.attempts + 1,
    locked_until = now() + interval '30 seconds'
WHERE {table}.status = 'failed'
   OR ({table}.status = 'in_progress' AND {table}.locked_until < now())
RETURNING attempts;
UPDATE {table} SET status = 'done', locked_until = NULL
WHERE provider = 'p' AND event_key = :k::text AND attempts = 1 AND status = 'in_progress';
""")
    os.chmod(f"{d}/claim-{state}.sql", 0o644)

for key, binary in BINS:
    out = subprocess.run([binary, "--config", config(f"check-{key}", f"check{key}", "bench"),
                          "check-config"], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{key}: check-config refused the config:\n{out.stdout}{out.stderr}")
print("# check-config: both binaries accept the config", flush=True)

if prefill:
    started = time.monotonic()
    week = 7 * 86400
    for key, binary in BINS:
        schema = f"pf{key}"
        out = subprocess.run([binary, "--config", config(f"migrate-{key}", schema, "prefill"), "migrate"],
                             capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{key}: migrate failed:\n{out.stdout}{out.stderr}")
        ring = psql(f"SELECT to_regclass('{schema}.hookgate_slots') IS NOT NULL") == "t"
        spread = ring and ring_prefill == "spread"
        # Row g (1..N) was done (N - g) / N of a week ago: the oldest fifth in slot 1, the
        # newest in slot 5 (spread), each slot sealed when its fifth of the week ended.
        age = f"(({prefill} - g) * {week}.0 / {prefill}) * interval '1 second'"
        slot_col, slot_val = ("slot, ", f"(1 + (g - 1) * 5 / {prefill})::smallint, ") if spread else ("", "")
        sql = f"""INSERT INTO {schema}.webhook_events (provider, event_key, {slot_col}status, attempts,
    last_path, mode, result_status, result_body, created_at, updated_at)
SELECT 'prefill', 'prefill-' || g, {slot_val}'done', 1, 'first_run', 'sync', 200, '\\x'::bytea,
       now() - {age} - interval '50 milliseconds', now() - {age}
FROM generate_series(1, {prefill}) AS g;
"""
        if spread:
            fifth = f"interval '{week // 5} seconds'"
            sql += f"""UPDATE {schema}.hookgate_slots SET state = 'sealed',
    opened_at = now() - interval '{week} seconds' + (slot - 1) * {fifth},
    sealed_at = now() - interval '{week} seconds' + slot * {fifth}
WHERE slot BETWEEN 1 AND 4;
UPDATE {schema}.hookgate_slots SET state = 'current', sealed_at = NULL,
    opened_at = now() - interval '{week} seconds' + 4 * {fifth}
WHERE slot = 5;
"""
        psql(sql)
        psql(f"VACUUM ANALYZE {schema}.webhook_events")
        slots = psql(f"SELECT string_agg(slot || ':' || n, ' ' ORDER BY slot) FROM "
                     f"(SELECT slot, count(*) n FROM {schema}.webhook_events GROUP BY slot) s") if ring else "-"
        size = psql(f"SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid))) FROM pg_class c "
                    f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' "
                    f"AND c.relkind = 'r'")
        print(f"# prefilled {schema}: {prefill} done rows, {size} (rows by slot: {slots})", flush=True)
    psql(f"""INSERT INTO yard.full (provider, event_key, status, attempts)
SELECT 'p', 'prefill-' || g, 'done', 1 FROM generate_series(1, {prefill}) AS g;
VACUUM ANALYZE yard.full;""")
    checkpoint()
    print(f"# prefill took {time.monotonic() - started:.0f} s", flush=True)

def row(r):
    common = f"| {r['round']} | {r['state']} | {r['bin']} | {r['per_s']:,.0f} |"
    cpu = f" {r['node_us']:.1f} | {r['pg_us']:.1f} | {r['total_us']:.1f} |"
    if r["measure"] == "unique":
        return (common + f" {r['p50']:.2f} | {r['p99']:.2f} |" + cpu
                + f" {r['duplicates']} | {r['errors']} | {r['status']} |")
    if r["measure"] == "duplicate":
        return (common + f" {r['p50']:.2f} | {r['p99']:.2f} |" + cpu
                + f" {r['deliveries']} | {r['cache_hits']} | {r['errors']} | {r['status']} |")
    if r["measure"] == "soak":
        return (common + f" {r['p99']:.2f} |" + cpu + f" {r['rows']} | {r['past']} | {r['mib']:.0f} "
                f"| {r['duplicates']} | {r['errors']} |")
    if r["measure"] == "queue":
        return (common + f" {r['rps']:,.0f} | {r['p99']:.2f} | {r['accepted']} | {r['units']} "
                f"| {r['ingest_s']:.1f} | {r['drained_s']:.1f} | {r['left']} | {r['retried']} |" + cpu)
    return common + cpu

HEAD = {
    "unique": ("first runs/s | p50 ms | p99 ms | hookgate µs | Postgres µs | total µs "
               "| duplicates | errors | statuses", "---:|---:|---:|---:|---:|---:|---:|---:|---"),
    "duplicate": ("requests/s | p50 ms | p99 ms | hookgate µs | Postgres µs | total µs "
                  "| deliveries | cache hits | errors | statuses",
                  "---:|---:|---:|---:|---:|---:|---:|---:|---:|---"),
    "queue": ("delivered/s (to drained) | accepted/s | accept p99 ms | accepted | delivered "
              "| ingest s | drained s | left | retried | hookgate µs | Postgres µs | total µs",
              "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"),
    "soak": ("delivered/s (after settling) | p99 ms (whole run) | hookgate µs | Postgres µs "
             "| total µs | rows at the end | done rows past retention | MiB | duplicates | errors",
             "---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"),
    "pgbench": ("events/s | pgbench client µs | Postgres µs | total µs", "---:|---:|---:|---:"),
}
UNIT = {"unique": "first run", "duplicate": "request", "queue": "delivered event",
        "soak": "delivered event, retention running",
        "pgbench": "event"}
RATIO_FIELDS = {"unique": ["per_s", "p50", "p99", "node_us", "pg_us", "total_us"],
                "duplicate": ["per_s", "p99", "node_us", "pg_us", "total_us"],
                "queue": ["per_s", "node_us", "pg_us", "total_us"],
                "soak": ["per_s", "p99", "node_us", "pg_us", "total_us"]}
LABEL = {"per_s": "rate", "p50": "p50", "p99": "p99", "node_us": "hookgate CPU",
         "pg_us": "Postgres CPU", "total_us": "total CPU"}

results = []
warm = sync_run(0, "empty", "base", BINS[0][1], "unique", min(secs, 5))
print(f"# warm-up (not counted): {warm['per_s']:,.0f} first runs/s", flush=True)
for rnd in range(1, rounds + 1):
    order = BINS if rnd % 2 else BINS[::-1]
    for state in STATES:
        if "pgbench" in MEASURES:
            r = pgbench_run(rnd, state)
            results.append(r)
            print(f"# done pgbench {row(r)}", flush=True)
        for measure in [m for m in ("unique", "duplicate", "queue", "soak") if m in MEASURES]:
            if measure == "soak" and state != "empty":
                continue
            for key, binary in order:
                r = (queue_run(rnd, state, key, binary) if measure == "queue"
                     else soak_run(rnd, key, binary) if measure == "soak"
                     else sync_run(rnd, state, key, binary, measure))
                results.append(r)
                print(f"# done {measure} {row(r)} bench rc={r['rc']}, node log lines above "
                      f"info: {r['warnings']}", flush=True)

def pick(measure, state, key, rnd=None):
    return [r for r in results if r["measure"] == measure and r["state"] == state
            and r["bin"] == key and (rnd is None or r["round"] == rnd)]

def mean(rs, field):
    return statistics.mean(r[field] for r in rs)

def average(rs):
    """The mean run: counts rounded, text left out."""
    out = dict(rs[0], round="mean", status="")
    for field, value in rs[0].items():
        if isinstance(value, (int, float)) and field != "round":
            m = mean(rs, field)
            out[field] = round(m) if isinstance(value, int) else m
    return out

for measure in [m for m in ("unique", "duplicate", "queue", "soak", "pgbench") if m in MEASURES]:
    head, align = HEAD[measure]
    print(f"\n## {measure} (CPU per {UNIT[measure]})\n")
    print(f"| round | tables | binary | {head} |")
    print(f"|---|---|---|{align}|")
    for r in results:
        if r["measure"] == measure:
            print(row(r))
    states = ["empty"] if measure == "soak" else STATES
    for state in states:
        for key in (["pgbench"] if measure == "pgbench" else [k for k, _ in BINS]):
            print(row(average(pick(measure, state, key))))
    if measure == "pgbench":
        continue
    fields = RATIO_FIELDS[measure]
    print(f"\nNEW/BASE ({measure}): of the means, then per round")
    print("| tables | round | " + " | ".join(LABEL[f] for f in fields) + " |")
    print("|---|---|" + "---:|" * len(fields))
    for state in states:
        m = [mean(pick(measure, state, "new"), f) / mean(pick(measure, state, "base"), f) for f in fields]
        print(f"| {state} | mean | " + " | ".join(f"{v:.3f}" for v in m) + " |")
        per_round = []
        for rnd in range(1, rounds + 1):
            n, b = pick(measure, state, "new", rnd)[0], pick(measure, state, "base", rnd)[0]
            vals = [n[f] / b[f] if b[f] else float("nan") for f in fields]
            per_round.append(vals)
            print(f"| {state} | {rnd} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        for i, f in enumerate(fields):
            col = [v[i] for v in per_round]
            if len(col) > 1 and (max(col) - min(col)) / statistics.mean(col) > 0.20:
                print(f"# erratic: {measure} {state} {LABEL[f]} ratio swings "
                      f"{min(col):.3f}..{max(col):.3f} between rounds (> 20 % of its mean)")

if "pgbench" in MEASURES and "unique" in MEASURES:
    print("\n## first runs against pgbench's bare claim + mark done (same round, same tables)\n")
    print("| tables | round | pgbench total µs/event | pgbench Postgres µs/event "
          "| base total / pgbench total | new total / pgbench total "
          "| base Postgres / pgbench Postgres | new Postgres / pgbench Postgres |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for state in STATES:
        for rnd in list(range(1, rounds + 1)) + ["mean"]:
            sel = None if rnd == "mean" else rnd
            p = pick("pgbench", state, "pgbench", sel)
            b, n = pick("unique", state, "base", sel), pick("unique", state, "new", sel)
            pt, pp = mean(p, "total_us"), mean(p, "pg_us")
            print(f"| {state} | {rnd} | {pt:.1f} | {pp:.1f} | {mean(b, 'total_us') / pt:.2f}× "
                  f"| {mean(n, 'total_us') / pt:.2f}× | {mean(b, 'pg_us') / pp:.2f}× "
                  f"| {mean(n, 'pg_us') / pp:.2f}× |")
PY
