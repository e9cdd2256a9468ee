#!/usr/bin/env python3
"""Measures queue mode's first-attempt latency: from the sender's 202 to the moment the
target receives the event, on an idle node. Starts the release binary (target/release/
hookgate; build it first) on a fresh SQLite file with one queue-mode provider, and a small
target here that records arrival times; sends N events one at a time; prints p50/p99/max.
Usage: scripts/queue-latency.py [N]   (default 200). Loopback only."""
import http.client, http.server, json, os, socket, subprocess, sys, tempfile, threading, time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
arrived = {}

class Target(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        arrived[self.headers["Idempotency-Key"]] = time.monotonic()
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Target)
threading.Thread(target=target.serve_forever, daemon=True).start()
port = free_port()
work = tempfile.mkdtemp(prefix="hookgate-qlat-")
config = os.path.join(work, "hookgate.toml")
with open(config, "w") as f:
    f.write(f"""
[server]
listen = "127.0.0.1:{port}"
[store]
url = "sqlite://{work}/q.db"
[log]
level = "warning"
[[providers]]
name = "q"
preset = "none"
mode = "queue"
key = [{{ header = "X-Idempotency-Key" }}]
target = {{ url = "http://127.0.0.1:{target.server_address[1]}/effects", timeout = "5s" }}
""")
binary = os.path.join(os.path.dirname(__file__), "..", "target", "release", "hookgate")
node = subprocess.Popen([binary, "serve", "--config", config], stdout=subprocess.DEVNULL)
try:
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    conn = http.client.HTTPConnection("127.0.0.1", port)
    latencies = []
    for i in range(n):
        key = f"lat-{i}"
        conn.request("POST", "/webhooks/q", body=json.dumps({"i": i}),
                     headers={"X-Idempotency-Key": key, "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        answered = time.monotonic()
        assert response.status == 202, response.status
        deadline = answered + 5
        key = f"q:{key}"  # the target sees <provider>:<key>
        while key not in arrived and time.monotonic() < deadline:
            time.sleep(0.0002)
        # Negative when the target had the event before the 202 reached the sender.
        latencies.append((arrived[key] - answered) * 1000)
    latencies.sort()
    pick = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))]
    print(f"queue first attempt after the 202, {n} events: p50 {pick(0.5):.2f} ms, "
          f"p99 {pick(0.99):.2f} ms, max {latencies[-1]:.2f} ms")
finally:
    node.terminate()
    node.wait()
