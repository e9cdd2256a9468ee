#!/usr/bin/env bash
# Checks the deploy files with the tools their ecosystems provide: the Prometheus alerting
# rules with `promtool check rules`, then their unit tests (alerts_test.yml: when the
# retention alerts fire and when they must not) with `promtool test rules` (promtool is
# from Debian's `prometheus` package, installed if missing and we are root; skipped with a
# note otherwise). The unit file, the Dockerfile
# and the dashboard are checked by the test suite (tests/api/config/edges.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing promtool (Debian's prometheus package)..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends prometheus >&2 \
      || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends prometheus >&2; }
  else
    echo "promtool not installed and not root: skipping the alert rules check" >&2
    exit 0
  fi
fi
promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts_test.yml
