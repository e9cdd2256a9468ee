#!/usr/bin/env python3
"""A stand-in for your application: answers every POST with 200 and prints what arrived.

Usage: scripts/demo-target.py [PORT]   (default 9000, the sample config's target)
"""
import http.server
import json
import sys


class Target(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = self.headers.get("Idempotency-Key")
        attempt = self.headers.get("Hookgate-Attempt")
        print(f"delivery {key} attempt {attempt}: {len(body)} bytes", flush=True)
        answer = json.dumps({"received": key}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
http.server.ThreadingHTTPServer(("127.0.0.1", port), Target).serve_forever()
