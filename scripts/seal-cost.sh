#!/usr/bin/env bash
# What encryption at rest costs in CPU (docs/performance.md), on one durable throwaway
# PostgreSQL in one sitting, one release binary:
#   off: its config without [store.encryption];
#   on:  the same config with one key (`[store.encryption] keys`, AES-256-GCM).
# For each mode (sync: every first run; queue: every event accepted, then delivered by the
# node's scheduler) and payload size (1 KiB, 64 KiB: the load bench's --payload-bytes), the
# provider keeps every payload (`keep_payload = "always"`), so each event seals and stores
# its payload, its kept headers and the target's answer — the most a first run seals.
# Each run starts `hookgate serve` (a fresh schema, log.level = "info", its log in the run
# directory) and drives it from outside with the load bench's `unique` scenario (`--url`,
# `--target-listen`), paced at RATE events a second (default 1000; RATE_LARGE, default 200,
# for 64 KiB; every variant at one throughput, so CPU per event compares like with like). CPU of hookgate's process and of
# Postgres (every backend) is read before and after, per delivery at the bench's target.
# Off and on alternate within each (mode, size), ROUNDS rounds; prints each run, the means
# and the ratio on/off.
# Usage: scripts/seal-cost.sh BIN [DURATION=10s] [ROUNDS=3]. Loopback only.
# SIZES="1024" and MODES="sync" narrow the runs. LOAD_BENCH=path skips building the bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:?usage: scripts/seal-cost.sh BIN [DURATION=10s] [ROUNDS=3]}")
duration=${2:-10s}
rounds=${3:-3}
[ -x "$bin" ] || { echo "BIN must be an executable" >&2; exit 1; }

dir=$(mktemp -d /tmp/hookgate-seal-cost.XXXXXX)
chmod 755 "$dir"
cleanup() {
  kill "$(cat "$dir/node.pid" 2>/dev/null)" 2>/dev/null || true
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
HOOKGATE_COST_STORE_KEY=$(head -c 32 /dev/urandom | base64)
export HOOKGATE_COST_STORE_KEY

echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), nproc=$(nproc), duration=$duration, rounds=$rounds, rate=${RATE:-1000}/s (64 KiB: ${RATE_LARGE:-200}/s)"
echo "# binary: $bin; load bench: $LOAD_BENCH; run dir (node logs): $dir"

DIR=$dir PGBIN=$pgbin DURATION=$duration ROUNDS=$rounds PORT=$port TARGET_PORT=$target_port \
BIN=$bin LOAD_BENCH=$LOAD_BENCH python3 - <<'PY'
import os, re, statistics, subprocess, time, urllib.request

d, pgbin = os.environ["DIR"], os.environ["PGBIN"]
secs = int(os.environ["DURATION"].rstrip("s"))
rounds = int(os.environ["ROUNDS"])
url = os.environ["HOOKGATE_BENCH_DATABASE_URL"]
port, target_port = os.environ["PORT"], os.environ["TARGET_PORT"]
rates = {False: os.environ.get("RATE", "1000"), True: os.environ.get("RATE_LARGE", "200")}
tick = os.sysconf("SC_CLK_TCK")
as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
SIZES = [int(s) for s in os.environ.get("SIZES", "1024 65536").split()]
MODES = os.environ.get("MODES", "sync queue").split()

def stat(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return [int(x) for x in fields[11:15]]

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

def get(path):
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()

def config(schema, mode, sealed):
    text = f'''[server]
listen = "127.0.0.1:{port}"
mailbox_capacity = 4096
[store]
url = "{url}"
schema = "{schema}"
'''
    if sealed:
        text += 'encryption = { keys = [{ id = "cost", env = "HOOKGATE_COST_STORE_KEY" }] }\n'
    if mode == "queue":
        text += '[queue]\npoll_interval = "100ms"\n'
    text += f'''[[providers]]
name = "bench"
preset = "none"
mode = "{mode}"
keep_payload = "always"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{target_port}/effects", timeout = "10s" }}
'''
    return text

def run(rnd, mode, size, sealed, secs=secs):
    name = f"{rnd}-{mode}-{size}-{'on' if sealed else 'off'}"
    path = f"{d}/hookgate-{name}.toml"
    open(path, "w").write(config(f"sc{rnd}{mode[0]}{size}{int(sealed)}", mode, sealed))
    subprocess.run(as_pg + [f"{pgbin}/psql", "-q", url, "-c", "CHECKPOINT"], check=True)
    log_path = f"{d}/node-{name}.log"
    log = open(log_path, "w")
    node = subprocess.Popen([os.environ["BIN"], "serve", "--config", path],
                            stdout=log, stderr=subprocess.STDOUT)
    open(f"{d}/node.pid", "w").write(str(node.pid))
    for _ in range(400):
        try:
            get("/readyz")
            break
        except Exception:
            if node.poll() is not None:
                raise SystemExit(f"the node exited; {log_path}:\n" + open(log_path).read()[-3000:])
            time.sleep(0.05)
    before_pg, before_node = postgres_ticks(), sum(stat(node.pid)[:2])
    bench = subprocess.run([os.environ["LOAD_BENCH"], "--scenario", "unique",
                            "--url", f"http://127.0.0.1:{port}/webhooks/bench",
                            "--target-listen", f"127.0.0.1:{target_port}",
                            "--duration", f"{secs}s", "--rate", rates[size > 4096],
                            "--payload-bytes", str(size)],
                           capture_output=True, text=True)
    after_pg, after_node = postgres_ticks(), sum(stat(node.pid)[:2])
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
    deliveries = int(num("deliveries"))
    return dict(round=rnd, mode=mode, size=size, sealed=sealed, rps=num("rps"),
                p99=num("p99"), deliveries=deliveries, duplicates=int(num("duplicates")),
                errors=int(num("errors")),
                node_us=(after_node - before_node) / tick * 1e6 / max(deliveries, 1),
                pg_us=(after_pg - before_pg) / tick * 1e6 / max(deliveries, 1))

def row(r):
    return (f"| {r['round']} | {r['mode']} | {r['size']} | {'on' if r['sealed'] else 'off'} "
            f"| {r['deliveries'] / secs:,.0f} | {r['p99']:.2f} | {r['node_us']:.1f} | {r['pg_us']:.1f} "
            f"| {r['node_us'] + r['pg_us']:.1f} | {r['duplicates']} | {r['errors']} |")

warm = run(0, "sync", 1024, False, min(secs, 5))
print(f"# warm-up (not counted): {warm['deliveries'] / min(secs, 5):,.0f} first runs/s", flush=True)
results = []
for rnd in range(1, rounds + 1):
    for mode in MODES:
        for size in SIZES:
            for sealed in ((False, True) if rnd % 2 else (True, False)):
                r = run(rnd, mode, size, sealed)
                results.append(r)
                print(f"# done {row(r)}", flush=True)

print("\n| round | mode | payload bytes | encryption | deliveries/s | p99 ms | hookgate CPU µs/delivery "
      "| Postgres CPU µs/delivery | total µs/delivery | duplicates | errors |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for r in results:
    print(row(r))
print("\n| mode | payload bytes | hookgate CPU on/off (mean) | per round | total CPU on/off (mean) |")
print("|---|---:|---:|---|---:|")
for mode in MODES:
    for size in SIZES:
        pick = lambda sealed: [r for r in results if r["mode"] == mode and r["size"] == size and r["sealed"] == sealed]
        on, off = pick(True), pick(False)
        node = statistics.mean(r["node_us"] for r in on) / statistics.mean(r["node_us"] for r in off)
        total = (statistics.mean(r["node_us"] + r["pg_us"] for r in on)
                 / statistics.mean(r["node_us"] + r["pg_us"] for r in off))
        per = ", ".join(f"{a['node_us'] / b['node_us']:.3f}" for a, b in zip(on, off))
        print(f"| {mode} | {size} | {node:.3f} | {per} | {total:.3f} |")
PY
