#!/usr/bin/env bash
# A throwaway three-member Patroni cluster for failover runs: one etcd member as its
# store, three Patroni members (m1, m2, m3) each running PostgreSQL on a free port of
# 127.0.0.1, `synchronous_mode: true` (with `strict`: `synchronous_mode_strict: true`;
# with `async`: `synchronous_mode: false`, asynchronous replication),
# everything (data, configs, logs, sockets) under DIR. Installs what it uses and is missing
# from Debian's packages (postgresql, patroni, etcd-server, and etcd-client for `etcdctl`;
# the package lists updated first; needs root); as root the members run as the `postgres`
# user. The timings are short so a run is short: ttl 20 s (Patroni's least), loop_wait 1 s,
# retry_timeout 5 s. Every wait is bounded by the clock, and a start that fails stops
# whatever it started and removes DIR.
#
# Usage:
#   eval "$(scripts/pg-patroni.sh start DIR [strict|async])"
#       Starts etcd and the three members, returns once there is a leader and (unless
#       async) a synchronous standby, and both replicas stream; DIR must not exist. On
#       failure it stops what it started, removes DIR and exits non-zero. Prints:
#         export HOOKGATE_PATRONI_URL='postgres://postgres@127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/postgres?target_session_attrs=read-write'
#   scripts/pg-patroni.sh leader DIR            the leader's name (m1, m2 or m3)
#   scripts/pg-patroni.sh sync DIR              the synchronous standby's name
#   scripts/pg-patroni.sh kill DIR MEMBER       SIGKILL of MEMBER's Patroni and its
#       PostgreSQL (a machine lost), waiting until every process of it has exited
#   scripts/pg-patroni.sh kill-leader DIR       kill of the leader, then waits (at most
#       60 s) until another member leads and accepts writes; prints the old leader's name
#   scripts/pg-patroni.sh await-leader DIR OLD  waits (at most 60 s) until a member other
#       than OLD leads and accepts writes
#   scripts/pg-patroni.sh await-sync DIR        waits (at most 60 s) until the leader has a
#       synchronous standby
#   scripts/pg-patroni.sh switchover DIR        a planned `patronictl switchover` to the
#       synchronous standby (once there is one), waiting until it leads
#   scripts/pg-patroni.sh rejoin DIR MEMBER     starts a killed member's Patroni again; it
#       rejoins as a replica (pg_rewind when needed), waiting until it streams
#   scripts/pg-patroni.sh status DIR            `patronictl list`
#   scripts/pg-patroni.sh stop DIR              stops everything (kill -9 what remains) and
#       removes DIR; never fails. It kills only what it started under DIR: a pid file's pid
#       only if the file holds a pid and that process's arguments name its file in DIR
set -euo pipefail

cmd=${1:?start|leader|sync|kill|kill-leader|switchover|rejoin|status|stop}
dir=${2:?directory}
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
dir=${dir%/}
cd /
for v in $(compgen -e); do case "$v" in PG*) unset "$v" ;; esac; done
export PGCONNECT_TIMEOUT=3
members="m1 m2 m3"

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
die() {
  echo "pg-patroni: $*" >&2
  for log in "$dir"/*.log; do
    [ -f "$log" ] && { echo "--- last lines of $log" >&2; tail -n 20 "$log" >&2; }
  done
  exit 1
}
find_bin() {
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}
# Tries COMMAND every 0.1 s until it succeeds, for SECONDS by the clock (however long each
# try takes); its output is dropped, and the last try's errors shown when it gives up.
wait_for() {  # SECONDS WHAT COMMAND...
  local secs=$1 what=$2 deadline errors
  shift 2
  deadline=$((SECONDS + secs))
  while :; do
    errors=$("$@" 2>&1 >/dev/null) && return 0
    ((SECONDS < deadline)) || break
    sleep 0.1
  done
  [ -z "$errors" ] || printf '%s\n' "$errors" | tail -n 5 >&2
  die "gave up after ${secs}s waiting for $what"
}
# Installs from Debian's packages whatever of the commands this script runs is missing:
# PostgreSQL's server binaries, patroni and patronictl, etcd and etcdctl (etcd-client). The
# package lists are updated first (a fresh machine's are empty, or old); PostgreSQL's
# package is kept from creating and starting a cluster of its own.
install_missing() {
  local missing=()
  [ -n "$(find_bin)" ] || missing+=(postgresql)
  { command -v patroni && command -v patronictl; } >/dev/null || missing+=(patroni)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v etcdctl >/dev/null || missing+=(etcd-client)
  [ "${#missing[@]}" -gt 0 ] || return 0
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}: install them (Debian's packages) or run as root"
  echo "pg-patroni: installing ${missing[*]} from Debian's packages" >&2
  if [ "${missing[0]}" = postgresql ]; then
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/00-hookgate.conf
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || die "apt-get update failed"
  apt-get install -y -qq "${missing[@]}" >&2 || die "could not install ${missing[*]}"
}
# Whether process $1 was started with the argument $2 (exactly).
has_arg() {
  local a
  while IFS= read -r -d '' a; do [ "$a" != "$2" ] || return 0; done 2>/dev/null <"/proc/$1/cmdline"
  return 1
}
# kill -9 of what this script started with the argument $2 (Patroni's config file, etcd's
# data directory, both in DIR), and its pid file $1 removed. The pid in the file is killed
# only if the file holds nothing but digits and that process has the argument, so a stale
# file (its process gone, the pid reused by another) kills nothing; a process whose file is
# lost or damaged is found by its argument all the same.
kill_started() {
  local pid p
  pid=$(cat "$1" 2>/dev/null || true)
  rm -f "$1"
  case "$pid" in
  '' | *[!0-9]*) ;;
  *) ! has_arg "$pid" "$2" || kill -9 "$pid" 2>/dev/null || true ;;
  esac
  for p in /proc/[0-9]*; do
    ! has_arg "${p#/proc/}" "$2" || kill -9 "${p#/proc/}" 2>/dev/null || true
  done
}
ctl() { patronictl -c "$dir/m1.yml" "$@"; }
# The member holding ROLE (Leader, "Sync Standby", Replica) in `patronictl list`.
member_with() {
  ctl list -f json 2>/dev/null | python3 -c '
import json, sys
role = sys.argv[1]
for m in json.load(sys.stdin):
    if m.get("Role") == role and m.get("State") in ("running", "streaming"):
        print(m["Member"]); break' "$1"
}
port_of() { cat "$dir/$1.port"; }
writable() {
  [ "$("$(find_bin)/psql" -X -At -h 127.0.0.1 -p "$(port_of "$1")" -U postgres -d postgres \
        -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]
}
leads() { [ "$(member_with Leader)" = "$1" ] && writable "$1"; }
new_leader_other_than() { local l; l=$(member_with Leader); [ -n "$l" ] && [ "$l" != "$1" ] && writable "$l"; }
has_sync() { [ -n "$(member_with "Sync Standby")" ]; }
streams() { ctl list -f json 2>/dev/null | python3 -c '
import json, sys
ok = any(m["Member"] == sys.argv[1] and m.get("Role") != "Leader" and m.get("State") in ("running", "streaming") for m in json.load(sys.stdin))
sys.exit(0 if ok else 1)' "$1"; }

start_member() {
  local m=$1
  as_pg bash -c "nohup patroni '$dir/$m.yml' >> '$dir/$m.log' 2>&1 & echo \$! > '$dir/$m.pid'"
}

kill_member() {
  local m=$1 pid data p left i
  data="$dir/$m/data"
  kill_started "$dir/$m.pid" "$dir/$m.yml"
  # The postmaster, if it is still the one of this data directory (it works in it).
  pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
  case "$pid" in
  '' | *[!0-9]*) ;;
  *) [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" != "$data" ] || kill -9 "$pid" 2>/dev/null || true ;;
  esac
  for ((i = 0; i < 200; i++)); do
    left=""
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/cwd" 2>/dev/null)" = "$data" ] && alive "${p#/proc/}" && left="$left ${p#/proc/}"
    done
    [ -z "$left" ] && break
    sleep 0.05
  done
  for p in $left; do kill -9 "$p" 2>/dev/null || true; done
  rm -f "$data/postmaster.pid"
}

# Everything under DIR stopped, and DIR removed.
stop_all() {
  [ -d "$dir" ] || return 0
  for m in $members; do kill_member "$m" 2>/dev/null || true; done
  kill_started "$dir/etcd.pid" "$dir/etcd"
  rm -rf "$dir"
}

case "$cmd" in
start)
  strict=false
  synchronous=true
  case "${3:-}" in
  '') ;;
  strict) strict=true ;;
  async) synchronous=false ;;
  *) die "unknown option ${3} (strict or async)" ;;
  esac
  [ -e "$dir" ] && die "$dir exists"
  install_missing
  bin=$(find_bin)
  mkdir -p "$dir"
  # From here a start that does not finish (a wait given up, a command failed, a signal)
  # leaves nothing running: the benches build their cluster's guard only from a start that
  # succeeded.
  trap 'stop_all' EXIT
  trap 'exit 1' INT TERM HUP
  chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  client=$(free_port)
  peer=$(free_port)
  as_pg bash -c "nohup etcd --name e1 --data-dir '$dir/etcd' \
    --listen-client-urls http://127.0.0.1:$client --advertise-client-urls http://127.0.0.1:$client \
    --listen-peer-urls http://127.0.0.1:$peer --initial-advertise-peer-urls http://127.0.0.1:$peer \
    --initial-cluster e1=http://127.0.0.1:$peer --initial-cluster-state new \
    > '$dir/etcd.log' 2>&1 & echo \$! > '$dir/etcd.pid'"
  wait_for 30 "etcd" etcdctl --endpoints "http://127.0.0.1:$client" endpoint health
  for m in $members; do
    port=$(free_port)
    rest=$(free_port)
    echo "$port" | as_pg tee "$dir/$m.port" >/dev/null
    as_pg mkdir -p "$dir/$m"
    as_pg chmod 700 "$dir/$m"
    as_pg tee "$dir/$m.yml" >/dev/null <<YAML
scope: hookgate
namespace: /hookgate/
name: $m
restapi:
  listen: 127.0.0.1:$rest
  connect_address: 127.0.0.1:$rest
etcd3:
  host: 127.0.0.1:$client
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 1048576
    synchronous_mode: $synchronous
    synchronous_mode_strict: $strict
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 100
        synchronous_commit: "on"
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$port
  connect_address: 127.0.0.1:$port
  data_dir: $dir/$m/data
  bin_dir: $bin
  pgpass: $dir/$m/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: postgres
      password: postgres
    rewind:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: $dir/$m
YAML
  done
  start_member m1
  wait_for 60 "m1 to lead" leads m1
  start_member m2
  start_member m3
  [ "$synchronous" = false ] || wait_for 90 "a synchronous standby" has_sync
  wait_for 60 "m2 to stream" streams m2
  wait_for 60 "m3 to stream" streams m3
  hosts=$(for m in $members; do printf '127.0.0.1:%s,' "$(port_of "$m")"; done)
  trap - EXIT INT TERM HUP
  echo "export HOOKGATE_PATRONI_URL='postgres://postgres@${hosts%,}/postgres?target_session_attrs=read-write'"
  ;;
leader) member_with Leader ;;
sync) member_with "Sync Standby" ;;
kill) kill_member "${3:?member}" ;;
kill-leader)
  old=$(member_with Leader)
  [ -n "$old" ] || die "no leader to kill"
  kill_member "$old"
  wait_for 60 "a new leader" new_leader_other_than "$old"
  echo "$old"
  ;;
await-leader) wait_for 60 "a leader other than ${3:?old leader}" new_leader_other_than "$3" ;;
await-sync) wait_for 60 "a synchronous standby" has_sync ;;
switchover)
  wait_for 60 "a synchronous standby" has_sync
  old=$(member_with Leader)
  to=$(member_with "Sync Standby")
  [ -n "$old" ] && [ -n "$to" ] || die "no leader or no synchronous standby"
  ctl switchover --leader "$old" --candidate "$to" --force >/dev/null || die "switchover refused"
  wait_for 60 "$to to lead" leads "$to"
  echo "$to"
  ;;
rejoin)
  m=${3:?member}
  start_member "$m"
  wait_for 90 "$m to stream" streams "$m"
  ;;
status) ctl list ;;
stop) stop_all ;;
*) die "unknown command $cmd" ;;
esac
