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
trap 'scripts/pg-throwaway.sh stop "$dir"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir")"
echo "test database: $HOOKGATE_TEST_DATABASE_URL" >&2
cargo test "$@"
