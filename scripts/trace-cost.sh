#!/usr/bin/env bash
# What OpenTelemetry tracing costs in CPU (docs/performance.md), on one durable throwaway
# PostgreSQL in one sitting, two release binaries side by side:
#   (a) BASE_BIN (a build without tracing), its config without [tracing];
#   (b) NEW_BIN, the same config: tracing off (the default);
#   (c) NEW_BIN with [tracing] endpoint = a local OTLP sink, sampling_ratio = 1.0 (every
#       trace recorded, the other settings at their defaults).
# Each run starts `hookgate serve` (Postgres store, a fresh schema, the default
# log.level = "info", its log lines written to a file in the run directory) and drives it
# from outside with the load bench (`--url`, `--target-listen`):
#   * `unique`: first runs a second (deliveries at the bench's target), the bench's p50/p99,
#     CPU of hookgate's process and of Postgres (every backend, the postmaster's reaped
#     children too) per first run, duplicates;
#   * `duplicate`: requests a second, p99, the same CPU per request (duplicate_done).
# CPU is read from /proc 1.5 s after the bench ends (so (c)'s exporter has sent its last
# batch, flush_interval = 1s), for every run alike. The bench's driver and target and the
# sink are not counted (they share the machine's cores, though; the sink's CPU is shown
# apart). CPU is read in clock ticks (10 ms): a per-request figure of a few tenths of a µs
# (Postgres under `duplicate`) is background work at that resolution, not a cost.
# The sink is a separate python3 process: it reads each POST body whole, answers 200 with
# an empty application/x-protobuf body and counts requests and bytes. For (c) the node's
# /metrics is read before it stops: hookgate_trace_spans_total{outcome=exported|dropped|failed}.
# After a short warm-up run (not counted), runs alternate a, b, c within each round (unique
# first, then duplicate), ROUNDS rounds;
# prints a table per scenario, the means, and the ratios b/a and c/b (of the means and per
# round).
# The load bench is the one of the repository this script is in (built here with
# `cargo bench --bench load --no-run`, CARGO_TARGET_DIR honoured), or LOAD_BENCH=path to its
# executable. The binaries are not built here.
# Usage: scripts/trace-cost.sh BASE_BIN NEW_BIN [DURATION=10s] [ROUNDS=3]. Loopback only.
# ONLY=bc (a subset of abc) runs only those variants; SCENARIOS="unique" only that one;
# RATE=N paces the bench at N requests a second (every variant at one throughput: CPU per
# event also falls as a node batches more, so an unpaced run charges a slower variant
# twice).
set -euo pipefail
cd "$(dirname "$0")/.."
base_bin=$(realpath "${1:?usage: scripts/trace-cost.sh BASE_BIN NEW_BIN [DURATION=10s] [ROUNDS=3]}")
new_bin=$(realpath "${2:?usage: scripts/trace-cost.sh BASE_BIN NEW_BIN [DURATION=10s] [ROUNDS=3]}")
duration=${3:-10s}
rounds=${4:-3}
[ -x "$base_bin" ] && [ -x "$new_bin" ] || { echo "BASE_BIN and NEW_BIN must be executables" >&2; exit 1; }

dir=$(mktemp -d /tmp/hookgate-trace-cost.XXXXXX)
chmod 755 "$dir"
cleanup() {
  kill "$(cat "$dir/node.pid" 2>/dev/null)" 2>/dev/null || true
  kill "$(cat "$dir/sink.pid" 2>/dev/null)" 2>/dev/null || true
  scripts/pg-throwaway.sh stop "$dir/pg"
}
trap cleanup EXIT
eval "$(scripts/pg-throwaway.sh start "$dir/pg" durable)"
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
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/psql | head -1)")
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
target_port=$(free_port)
sink_port=$(free_port)

# The OTLP sink: POST anything -> 200, empty protobuf body; GET /stats -> "requests bytes".
cat > "$dir/sink.py" <<'PY'
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock, stats = threading.Lock(), [0, 0]

class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's client reuses connections

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        while len(body) < n:
            chunk = self.rfile.read(n - len(body))
            if not chunk:
                break
            body += chunk
        with lock:
            stats[0] += 1
            stats[1] += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        with lock:
            text = f"{stats[0]} {stats[1]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
python3 "$dir/sink.py" "$sink_port" 2> "$dir/sink.log" &
echo $! > "$dir/sink.pid"

cat > "$dir/hookgate.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
mailbox_capacity = 4096
[store]
url = "$HOOKGATE_BENCH_DATABASE_URL"
schema = "SCHEMA"
[[providers]]
name = "bench"
preset = "none"
key = [{ header = "X-Idempotency-Key" }]
target = { url = "http://127.0.0.1:$target_port/effects", timeout = "10s" }
TOML
cat > "$dir/tracing.toml" <<TOML
[tracing]
endpoint = "http://127.0.0.1:$sink_port/v1/traces"
sampling_ratio = 1.0
TOML

echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), nproc=$(nproc), duration=$duration, rounds=$rounds"
echo "# a: $base_bin (tracing off); b: $new_bin (tracing off); c: $new_bin (tracing on, 100 %)"
echo "# load bench: $LOAD_BENCH; run dir (node logs): $dir"

DIR=$dir PGBIN=$pgbin DURATION=$duration ROUNDS=$rounds PORT=$port TARGET_PORT=$target_port \
SINK_PORT=$sink_port BASE_BIN=$base_bin NEW_BIN=$new_bin LOAD_BENCH=$LOAD_BENCH \
python3 - <<'PY'
import os, re, statistics, subprocess, time, urllib.request

d, pgbin = os.environ["DIR"], os.environ["PGBIN"]
secs = int(os.environ["DURATION"].rstrip("s"))
rounds = int(os.environ["ROUNDS"])
url = os.environ["HOOKGATE_BENCH_DATABASE_URL"]
port, sink_port = os.environ["PORT"], os.environ["SINK_PORT"]
tick = os.sysconf("SC_CLK_TCK")
SINK_PID = int(open(f"{d}/sink.pid").read())
as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
VARIANTS = [v for v in [("a", "base, off", os.environ["BASE_BIN"], False),
                         ("b", "new, off", os.environ["NEW_BIN"], False),
                         ("c", "new, on", os.environ["NEW_BIN"], True)]
            if v[0] in os.environ.get("ONLY", "abc")]
SCENARIOS = os.environ.get("SCENARIOS", "unique duplicate").split()

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

def checkpoint():
    subprocess.run(as_pg + [f"{pgbin}/psql", "-q", url, "-c", "CHECKPOINT"], check=True)

def get(path, p=port):
    return urllib.request.urlopen(f"http://127.0.0.1:{p}{path}", timeout=5).read().decode()

def sink_stats():
    requests, nbytes = get("/stats", sink_port).split()
    return int(requests), int(nbytes)

def wait_ready(node, log_path):
    for _ in range(400):
        if node.poll() is not None:
            break
        try:
            get("/readyz")
            return
        except Exception:
            time.sleep(0.05)
    node.kill()
    raise SystemExit(f"the node did not get ready; {log_path}:\n" + open(log_path).read()[-3000:])

def run(rnd, scenario, variant, secs=secs):
    key, _, binary, tracing = variant
    name = f"{rnd}-{key}-{scenario}"
    config = open(f"{d}/hookgate.toml").read().replace('"SCHEMA"', f'"tc{rnd}{key}{scenario[0]}"')
    if tracing:
        config += open(f"{d}/tracing.toml").read()
    open(f"{d}/hookgate-{name}.toml", "w").write(config)
    checkpoint()
    log_path = f"{d}/node-{name}.log"
    log = open(log_path, "w")
    node = subprocess.Popen([binary, "serve", "--config", f"{d}/hookgate-{name}.toml"],
                            stdout=log, stderr=subprocess.STDOUT)
    open(f"{d}/node.pid", "w").write(str(node.pid))
    wait_ready(node, log_path)
    sink_before = sink_stats()
    before_pg, before_node = postgres_ticks(), sum(stat(node.pid)[:2])
    before_sink = sum(stat(SINK_PID)[:2])
    bench = subprocess.run([os.environ["LOAD_BENCH"], "--scenario", scenario,
                            "--url", f"http://127.0.0.1:{port}/webhooks/bench",
                            "--target-listen", f"127.0.0.1:{os.environ['TARGET_PORT']}",
                            "--duration", f"{secs}s"]
                           + (["--rate", os.environ["RATE"]] if os.environ.get("RATE") else []),
                           capture_output=True, text=True)
    time.sleep(1.5)  # (c): the exporter's last batch (flush_interval = 1s); all runs alike
    after_pg, after_node = postgres_ticks(), sum(stat(node.pid)[:2])
    after_sink = sum(stat(SINK_PID)[:2])
    spans = {}
    if tracing:
        for line in get("/metrics").splitlines():
            m = re.match(r'hookgate_trace_spans_total\{outcome="(\w+)"\} (\d+)', line)
            if m:
                spans[m.group(1)] = int(m.group(2))
    sink_after = sink_stats()
    node.terminate()
    try:
        node.wait(timeout=30)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()
    log.close()
    open(f"{d}/bench-{name}.out", "w").write(bench.stdout + bench.stderr)
    line = next((l for l in bench.stdout.splitlines() if l.startswith("scenario=")), None)
    if line is None:
        raise SystemExit(f"the bench printed no result ({name}):\n{bench.stdout}{bench.stderr}")
    num = lambda k: float(re.search(rf"\b{k}=\s*([\d.]+)", line).group(1))
    levels = {}
    for l in open(log_path):
        m = re.search(r'"level":"(\w+)"', l)
        if m:
            levels[m.group(1)] = levels.get(m.group(1), 0) + 1
    r = dict(round=rnd, variant=key, scenario=scenario, rps=num("rps"), p50=num("p50"),
             p99=num("p99"), requests=int(num("requests")), errors=int(num("errors")),
             deliveries=int(num("deliveries")), duplicates=int(num("duplicates")),
             status=re.search(r"status=(\{[^}]*\})", line).group(1),
             node_s=(after_node - before_node) / tick, pg_s=(after_pg - before_pg) / tick,
             sink_s=(after_sink - before_sink) / tick,
             spans=spans, sink=(sink_after[0] - sink_before[0], sink_after[1] - sink_before[1]),
             levels=levels, rc=bench.returncode)
    # The unit: a first run (a delivery at the target) for unique, a request for duplicate.
    r["units"] = r["deliveries"] if scenario == "unique" else r["requests"]
    r["node_us"] = r["node_s"] * 1e6 / r["units"]
    r["pg_us"] = r["pg_s"] * 1e6 / r["units"]
    r["sink_us"] = r["sink_s"] * 1e6 / r["units"]
    r["per_s"] = r["units"] / secs
    return r

def row(r):
    spans = r["spans"]
    span_text = (f"{spans.get('exported', 0)}/{spans.get('dropped', 0)}/{spans.get('failed', 0)}"
                 if r["variant"] == "c" else "-")
    sink = (f"{r['sink'][0]} / {r['sink'][1] / 1e6:.1f} MB / {r['sink_us']:.1f} µs"
            if r["variant"] == "c" else "-")
    warn = sum(n for lvl, n in r["levels"].items() if lvl not in ("INFO", "DEBG", "TRCE"))
    return (f"| {r['round']} | {r['variant']} | {r['per_s']:,.0f} | {r['rps']:,.0f} | {r['p50']:.2f} "
            f"| {r['p99']:.2f} | {r['node_us']:.1f} | {r['pg_us']:.1f} | {r['node_us'] + r['pg_us']:.1f} "
            f"| {r['duplicates']} | {r['errors']} | {span_text} | {sink} | {warn} |")

HEAD = {"unique": "first runs/s", "duplicate": "requests/s (answered)"}
UNIT = {"unique": "first run", "duplicate": "request"}
results = {s: [] for s in SCENARIOS}
for _ in range(100):  # the sink is up
    try:
        sink_stats()
        break
    except Exception:
        time.sleep(0.05)
# A short warm-up run (a, unique), not counted: the sitting's first run would otherwise be
# the only one on a cold Postgres.
warm = run(0, "unique", VARIANTS[0], min(secs, 5))
print(f"# warm-up (not counted): {warm['per_s']:,.0f} first runs/s", flush=True)
for rnd in range(1, rounds + 1):
    for scenario in SCENARIOS:
        for variant in VARIANTS:
            r = run(rnd, scenario, variant)
            results[scenario].append(r)
            print(f"# done {rnd}-{r['variant']}-{scenario}: {row(r)} status={r['status']} "
                  f"bench rc={r['rc']} log levels={r['levels']}", flush=True)

def mean(scenario, key, field):
    return statistics.mean(r[field] for r in results[scenario] if r["variant"] == key)

for scenario in SCENARIOS:
    u = UNIT[scenario]
    print(f"\n## {scenario}\n")
    print(f"| round | run | {HEAD[scenario]} | bench rps | p50 ms | p99 ms | hookgate CPU µs/{u} "
          f"| Postgres CPU µs/{u} | total µs/{u} | duplicates | errors "
          f"| spans exported/dropped/failed | sink requests / bytes / CPU µs per {u} (not counted) "
          f"| node log lines above info |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for r in results[scenario]:
        print(row(r))
    for key, label, _, _ in VARIANTS:
        print(f"| mean | {key} ({label}) | {mean(scenario, key, 'per_s'):,.0f} "
              f"| {mean(scenario, key, 'rps'):,.0f} | {mean(scenario, key, 'p50'):.2f} "
              f"| {mean(scenario, key, 'p99'):.2f} | {mean(scenario, key, 'node_us'):.1f} "
              f"| {mean(scenario, key, 'pg_us'):.1f} "
              f"| {mean(scenario, key, 'node_us') + mean(scenario, key, 'pg_us'):.1f} "
              f"| | | | | |")
    print(f"\nratios ({scenario}): of the means, then per round")
    print(f"| ratio | round | {HEAD[scenario]} | p99 | hookgate CPU/{u} | Postgres CPU/{u} | total CPU/{u} |")
    print("|---|---|---:|---:|---:|---:|---:|")
    fields = ["per_s", "p99", "node_us", "pg_us"]
    keys = [v[0] for v in VARIANTS]
    for num_key, den_key in [(n, d) for n, d in (("b", "a"), ("c", "b")) if n in keys and d in keys]:
        def ratios(get):
            n, dn = get(num_key), get(den_key)
            vals = [n[f] / dn[f] for f in fields]
            vals.append((n["node_us"] + n["pg_us"]) / (dn["node_us"] + dn["pg_us"]))
            return vals
        m = ratios(lambda k: {f: mean(scenario, k, f) for f in fields})
        print(f"| {num_key}/{den_key} | mean | " + " | ".join(f"{v:.3f}" for v in m) + " |")
        per_round = []
        for rnd in range(1, rounds + 1):
            pick = lambda k: next(r for r in results[scenario] if r["variant"] == k and r["round"] == rnd)
            vals = ratios(pick)
            per_round.append(vals)
            print(f"| {num_key}/{den_key} | {rnd} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
        for i, f in enumerate(["rate", "p99", "hookgate CPU", "Postgres CPU", "total CPU"]):
            col = [v[i] for v in per_round]
            if (max(col) - min(col)) / statistics.mean(col) > 0.20:
                print(f"# erratic: {scenario} {num_key}/{den_key} {f} ratio swings "
                      f"{min(col):.3f}..{max(col):.3f} between rounds (> 20 % of its mean)")

spans = [r for s in SCENARIOS for r in results[s] if r["variant"] == "c"]
total = {o: sum(r["spans"].get(o, 0) for r in spans) for o in ("exported", "dropped", "failed")}
sink = get("/stats", sink_port).split()
print(f"\nspans (c runs, all scenarios): exported={total['exported']} dropped={total['dropped']} "
      f"failed={total['failed']}" + ("" if total["dropped"] == 0 else "  <-- DROPPED SPANS"))
unique_c = [r for r in results.get("unique", []) if r["variant"] == "c"]
print("spans per first run (unique, c): " + ", ".join(
    f"{sum(r['spans'].values()) / r['deliveries']:.2f}" for r in unique_c))
print(f"sink: requests={sink[0]} bytes={sink[1]}")
PY
