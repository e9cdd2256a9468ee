#!/usr/bin/env bash
# The test command: starts a throwaway PostgreSQL (installing it if missing), runs the
# whole suite against it, and stops it again, whatever the outcome. As root it also installs
# Debian's chromium and chromium-driver when missing, for the console's browser test (which
# starts its own chromedriver; nothing global is started here).
# Extra arguments go to `cargo test` (e.g. scripts/test.sh concurrent).
set -euo pipefail
cd "$(dirname "$0")/.."

if { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; } && [ "$(id -u)" = 0 ]; then
  echo "installing chromium and chromium-driver from Debian's packages..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq chromium chromium-driver >&2 \
    || { apt-get update -qq >&2 && apt-get install -y -qq chromium chromium-driver >&2; }
fi

dir=$(mktemp -d /tmp/hookgate-pg.XXXXXX)
# The failover tests start a primary + standby pair each (scripts/pg-ha.sh) under this
# directory; whatever an interrupted run left there is stopped on exit. The servers run as
# `postgres` when root runs this, so the directory must be open to them.
ha=$(mktemp -d /tmp/hookgate-ha.XXXXXX)
chmod 755 "$ha"
export HOOKGATE_HA_DIR=$ha
trap 'for d in "$ha"/*/; do [ ! -d "$d" ] || scripts/pg-ha.sh stop "$d"; done; rm -rf "$ha"
      scripts/pg-throwaway.sh stop "$dir"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir")"
echo "test database: $HOOKGATE_TEST_DATABASE_URL" >&2
cargo test "$@"
