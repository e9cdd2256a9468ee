#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster on a free port and prints its URL on stdout.
# Installs PostgreSQL from Debian's packages if it is missing (needs root for that).
# Usage: eval "$(scripts/pg-throwaway.sh start DIR [durable])"  ...  scripts/pg-throwaway.sh stop DIR
# Without "durable" the cluster runs with fsync off (tests only) and with TLS on, its
# certificate signed by a throwaway CA (HOOKGATE_TEST_DATABASE_CA) for the TLS tests;
# benchmarks pass "durable" (fsync on, no TLS, as docs/performance.md's figures were measured;
# HOOKGATE_PG_STATEMENTS=1 loads pg_stat_statements there too).
# As root the server runs as the `postgres` user (it refuses to run as root).
set -euo pipefail

cmd=${1:?start|stop}
dir=${2:?data directory}

find_bin() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
  done
  command -v pg_ctl >/dev/null 2>&1 && dirname "$(command -v pg_ctl)"
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

bin=$(find_bin || true)
if [ "$cmd" = stop ]; then
  [ -n "$bin" ] && [ -d "$dir/data" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  exit 0
fi

if [ -z "$bin" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "PostgreSQL is not installed; run as root or: sudo apt-get install postgresql" >&2
    exit 1
  fi
  echo "installing PostgreSQL from Debian's packages..." >&2
  mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/00-hookgate.conf
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  bin=$(find_bin)
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; chmod 700 "$dir"; fi
as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --locale=C.UTF-8 >/dev/null
# fsync off for tests: a throwaway cluster, never one whose durability a benchmark claims.
# pg_stat_statements counts plans against executions (tests/api/store/plans.rs).
settings="-c fsync=off -c synchronous_commit=off -c full_page_writes=off \
  -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_planning=on"
tls_env=""
if [ "${3:-}" = durable ]; then
  settings=""
  # HOOKGATE_PG_STATEMENTS=1: pg_stat_statements for a benchmark that reads it (the same
  # small cost for every binary it compares).
  if [ "${HOOKGATE_PG_STATEMENTS:-}" = 1 ]; then
    settings="-c shared_preload_libraries=pg_stat_statements"
  fi
else
  if ! command -v openssl >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "installing openssl (for the test cluster's certificate)..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2 \
      || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2; }
  fi
fi
if [ "${3:-}" != durable ] && command -v openssl >/dev/null 2>&1; then
  # A CA and a server certificate for 127.0.0.1 / localhost, valid two days.
  (
    cd "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj "/CN=hookgate test CA" -keyout ca.key -out ca.crt \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
    printf "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n" > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -extfile server.ext -out server.crt 2>/dev/null
    chmod 600 server.key
    chmod 644 ca.crt server.crt
    if [ "$(id -u)" = 0 ]; then chown postgres server.key server.crt; fi
  )
  settings="$settings -c ssl=on -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key"
  tls_env="export HOOKGATE_TEST_DATABASE_CA=$dir/ca.crt"
fi
as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=400 $settings" \
  start >/dev/null
echo "export HOOKGATE_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:$port/postgres"
[ -n "$tls_env" ] && echo "$tls_env"
exit 0
