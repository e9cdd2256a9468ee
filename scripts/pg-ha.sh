#!/usr/bin/env bash
# A throwaway PostgreSQL pair for failover tests: a primary and a synchronous hot standby on
# two free ports of 127.0.0.1, everything (data, logs, sockets) under DIR.
# Installs PostgreSQL from Debian's packages if it is missing (needs root for that); as root
# the servers run as the `postgres` user (PostgreSQL refuses to run as root).
#
# Usage:
#   eval "$(scripts/pg-ha.sh start DIR [durable])"
#       Makes node n1 (primary: wal_level=replica, wal_log_hints=on, max_connections=100,
#       synchronous_standby_names='standby1', synchronous_commit=on) and node n2 (its standby,
#       made by pg_basebackup -R through the replication slot `standby1`, with
#       application_name=standby1), and returns once n2 streams and is `sync`. Prints:
#         export HOOKGATE_HA_PRIMARY_URL=postgres://postgres@127.0.0.1:P1/postgres
#         export HOOKGATE_HA_STANDBY_URL=postgres://postgres@127.0.0.1:P2/postgres
#         export HOOKGATE_HA_URL='postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/postgres?target_session_attrs=read-write'
#       (quoted: eval must not take the `?` for a glob). tokio-postgres 0.7 reads that URL
#       as two hosts, each with its own port, tried in order; with
#       target_session_attrs=read-write it runs `SHOW transaction_read_only` on each
#       connection and moves on to the next host while the answer is `on`. A commit acked
#       under synchronous_commit=on is flushed on the standby, not yet necessarily visible
#       there: a test reading it back on the standby polls.
#       Without "durable" both run with fsync=off (tests only: a process crash, even
#       kill -9, loses nothing with fsync off, only an OS crash would); "durable" keeps it on.
#   scripts/pg-ha.sh promote DIR
#       Simulates a crash of the primary (kill -9 of its postmaster, whose backends then
#       exit too; a primary the test already killed is fine), then `pg_ctl promote`s the
#       standby and waits until it accepts writes.
#       The promoted node keeps the synchronous_standby_names it had as a standby: '' (no
#       synchronous standby) unless a test set it. To simulate "the promoted node still
#       requires a standby that is gone", run `require-ghost` (below).
#   scripts/pg-ha.sh require-ghost DIR
#       On whichever node is primary now: ALTER SYSTEM SET synchronous_standby_names =
#       'ghost'; SELECT pg_reload_conf(); and returns once a commit there really waits (its
#       backend shows wait_event 'SyncRep' in pg_stat_activity) until release-ghost.
#   scripts/pg-ha.sh release-ghost DIR
#       Undoes it (ALTER SYSTEM RESET synchronous_standby_names; reload); the waiting
#       commits then complete (at once if the configured value is '', else when the real
#       standby confirms them).
#   scripts/pg-ha.sh rejoin DIR
#       Brings the node that promote killed back as the standby of the new primary
#       (pg_rewind, then the slot `standby1` on the new primary and application_name=standby1)
#       and makes the new primary require it synchronously ('standby1'), as `start` left the
#       pair with the roles swapped: `promote` can then be run again.
#   scripts/pg-ha.sh status DIR
#       Which node is primary, standby, down or unreachable; the primary's synchronous_standby_names,
#       its pg_stat_replication and its number of commits waiting for a synchronous standby.
#   scripts/pg-ha.sh stop DIR
#       Stops both (fast; kill -9 whatever still runs), removes DIR; never fails.
#
# A commit waiting for a synchronous standby is not undone by anything: a cancel
# (pg_cancel_backend, or the client's cancel request) ends the wait with "WARNING: canceling
# wait for synchronous replication due to user request ... The transaction has already
# committed locally, but might not have been replicated to the standby.", and a terminated
# backend likewise. statement_timeout does not end that wait (it is disarmed before the commit).
# shellcheck disable=SC2317  # the predicates below run indirectly, through wait_for "$@"
set -euo pipefail

cmd=${1:?start|promote|require-ghost|release-ghost|rejoin|status|stop}
dir=${2:?directory}
mode=${3:-}
[ -z "$mode" ] || [ "$mode" = durable ] || { echo "pg-ha: unknown option $mode (only: durable)" >&2; exit 2; }
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
dir=${dir%/}
cd /  # as root the servers run as postgres, who may not be able to enter the caller's cwd

# The caller's PG* variables (PGSSLMODE, PGOPTIONS, PGTARGETSESSIONATTRS...) must not reach
# our own psql, pg_basebackup and pg_rewind connections.
for v in $(compgen -e); do case "$v" in PG*) unset "$v" ;; esac; done
export PGCONNECT_TIMEOUT=3

nodes="n1 n2"

find_bin() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
  done
  command -v pg_ctl >/dev/null 2>&1 && dirname "$(command -v pg_ctl)"
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# Writes stdin to a file inside DIR as the servers' user (pg_rewind must be able to
# overwrite it later).
put() { as_pg tee "$1" >/dev/null; }

# refuse: a wrong request; die: a failure, shown with the ends of the servers' logs.
refuse() {
  echo "pg-ha: $*" >&2
  exit 1
}

die() {
  echo "pg-ha: $*" >&2
  local log
  for log in "$dir"/*.log; do
    [ -f "$log" ] || continue
    echo "--- last lines of $log" >&2
    tail -n 15 "$log" >&2
  done
  exit 1
}

port_of() { cat "$dir/$1.port" 2>/dev/null || true; }

# sql NODE psql-args...: unaligned, tuples only, over TCP like the application.
sql() {
  local node=$1
  shift
  "$bin/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port_of "$node")" \
    -U postgres -d postgres "$@"
}

# A live process (a zombie left unreaped by a container's init counts as gone).
alive() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# The postmaster's pid of NODE if it is running, else nothing.
postmaster_pid() {
  local pid
  pid=$(head -n 1 "$dir/$1/postmaster.pid" 2>/dev/null) || return 0
  case "$pid" in '' | *[!0-9]*) return 0 ;; esac
  alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] && echo "$pid"
  return 0
}

# The live processes working in data directory $1 (every PostgreSQL process chdirs there).
procs_in() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/cwd" 2>/dev/null)" = "$1" ] && alive "${p#/proc/}" && echo "${p#/proc/}"
  done
  return 0
}

# kill -9 NODE's postmaster (a crash), wait until its backends have noticed and exited, and
# remove its postmaster.pid and its socket's lock file: a killed postmaster stays a zombie
# until an init reaps it (seconds on some machines, never in a container whose init does
# not reap), and a zombie answers kill -0, so PostgreSQL (and pg_rewind, which starts it)
# would take either file for a sign that the server still runs.
crash() {
  local pid left i
  [ -d "$dir/$1" ] || return 0
  pid=$(postmaster_pid "$1")
  [ -z "$pid" ] || kill -9 "$pid" 2>/dev/null || true
  for ((i = 0; i < 200; i++)); do
    left=$(procs_in "$dir/$1")
    [ -z "$left" ] && break
    sleep 0.05
  done
  if [ -n "$left" ]; then
    echo "pg-ha: $1's processes $(echo "$left" | tr '\n' ' ')still run 10s after its postmaster's; kill -9" >&2
    for pid in $left; do kill -9 "$pid" 2>/dev/null || true; done
    sleep 0.2
  fi
  rm -f "$dir/$1/postmaster.pid" "$dir/.s.PGSQL.$(port_of "$1")" "$dir/.s.PGSQL.$(port_of "$1").lock"
}

# primary, standby, down, or unreachable (running, but our superuser connection failed:
# say, a test holds every connection slot).
role_of() {
  [ -n "$(postmaster_pid "$1")" ] || { echo down; return; }
  case "$(sql "$1" -c "SELECT pg_is_in_recovery()" 2>/dev/null)" in
    f) echo primary ;;
    t) echo standby ;;
    *) echo unreachable ;;
  esac
}

# The one node that has ROLE, or nothing (none, or both).
node_with_role() {
  local n found=""
  for n in $nodes; do
    if [ "$(role_of "$n")" = "$1" ]; then
      [ -z "$found" ] || return 0
      found=$n
    fi
  done
  echo "$found"
}

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 50 ms.
wait_for() {
  local secs=$1 what=$2 i
  shift 2
  for ((i = 0; i < secs * 20; i++)); do
    "$@" && return 0
    sleep 0.05
  done
  die "gave up after ${secs}s waiting for $what"
}

is_sync_standby_of() {  # PRIMARY: its standby1 streams and is sync
  [ "$(sql "$1" -c "SELECT state || ' ' || sync_state FROM pg_stat_replication
                    WHERE application_name = 'standby1'" 2>/dev/null)" = "streaming sync" ]
}

streams_to() {  # PRIMARY: standby1 streams (sync or not)
  [ "$(sql "$1" -c "SELECT state FROM pg_stat_replication
                    WHERE application_name = 'standby1'" 2>/dev/null)" = streaming ]
}

accepts_writes() {
  [ "$(sql "$1" -c "SELECT NOT pg_is_in_recovery()
                      AND current_setting('transaction_read_only') = 'off'" 2>/dev/null)" = t ]
}

sync_waiters() {
  sql "$1" -c "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
}

# The reload that require-ghost asks for is asynchronous (the checkpointer tells the
# backends that a synchronous standby is now required): commit_waits NODE commits a
# transaction that wrote WAL (a transactional logical message: no table needed; an xid
# alone, as txid_current(), would commit without waiting) and, if it waits for a
# synchronous standby, ends it (it commits locally) and succeeds; if it completes, fails.
commit_waits() {
  local pid i waiting
  PGAPPNAME=pg-ha-probe sql "$1" -c "SELECT pg_logical_emit_message(true, 'pg-ha-probe', '')" >/dev/null 2>&1 &
  pid=$!
  for ((i = 0; i < 40; i++)); do
    waiting=$(sql "$1" -c "SELECT count(*) FROM pg_stat_activity
               WHERE application_name = 'pg-ha-probe' AND wait_event = 'SyncRep'" 2>/dev/null) || waiting=0
    if [ "${waiting:-0}" -gt 0 ]; then
      sql "$1" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                   WHERE application_name = 'pg-ha-probe'" >/dev/null
      wait "$pid" || true
      wait_for 10 "the probe's backend to exit" probe_gone "$1"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { wait "$pid" || true; return 1; }  # committed: not yet
    sleep 0.05
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" || true
  return 1
}

probe_gone() {
  [ "$(sql "$1" -c "SELECT count(*) FROM pg_stat_activity
                    WHERE application_name = 'pg-ha-probe'")" = 0 ]
}

no_sync_waiters() { [ "$(sync_waiters "$1")" = 0 ]; }

# node.conf, included at the end of postgresql.conf: what differs between the nodes.
write_node_conf() {  # NODE SYNCHRONOUS_STANDBY_NAMES
  printf "# written by scripts/pg-ha.sh\nport = %s\nsynchronous_standby_names = '%s'\n" \
    "$(port_of "$1")" "$2" | put "$dir/$1/node.conf"
}

pg_start() {
  as_pg "$bin/pg_ctl" -D "$dir/$1" -l "$dir/$1.log" -w -t 60 start >/dev/null \
    || die "$1 did not start"
}

free_ports() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])'
    return
  fi
  # No python3: random ports on which nothing listens.
  local p ports=""
  while [ "$(echo "$ports" | wc -w)" -lt 2 ]; do
    p=$((20000 + RANDOM % 30000))
    case " $ports " in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then ports="$ports $p"; fi
  done
  echo "$ports"
}

bin=$(find_bin || true)

case "$cmd" in
stop)
  for n in $nodes; do  # both at once
    if [ -n "$bin" ] && [ -n "$(postmaster_pid "$n")" ]; then
      as_pg "$bin/pg_ctl" -D "$dir/$n" -m fast -w -t 30 stop >/dev/null 2>&1 &
    fi
  done
  wait || true
  for n in $nodes; do crash "$n" 2>/dev/null || true; done  # whatever did not stop
  rm -rf "$dir" || true
  exit 0
  ;;
start | promote | require-ghost | release-ghost | rejoin | status) ;;
*) echo "pg-ha: unknown command $cmd" >&2; exit 2 ;;
esac

[ "$cmd" = start ] || [ -d "$dir/n1" ] || refuse "no pair under $dir (start one with: $0 start $dir)"

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

case "$cmd" in
start)
  [ ! -e "$dir/n1" ] || refuse "$dir/n1 exists: stop it first"
  nosync=--no-sync fsync=off
  [ "$mode" = durable ] && nosync="" fsync=on
  read -r p1 p2 <<<"$(free_ports)"
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
  chmod 700 "$dir"
  echo "$p1" | put "$dir/n1.port"
  echo "$p2" | put "$dir/n2.port"
  # shellcheck disable=SC2086  # $nosync is one flag or none
  as_pg "$bin/initdb" -D "$dir/n1" -U postgres --auth=trust --locale=C.UTF-8 $nosync >/dev/null \
    || die "initdb failed"
  # Shared by both nodes (pg_basebackup and pg_rewind copy it); node.conf comes last.
  sockdir=${dir//\'/\'\'}
  as_pg tee -a "$dir/n1/postgresql.conf" >/dev/null <<EOF

# scripts/pg-ha.sh
listen_addresses = '127.0.0.1'
unix_socket_directories = '$sockdir'
max_connections = 100
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
wal_log_hints = on
full_page_writes = on
hot_standby = on
synchronous_commit = on
wal_receiver_status_interval = 1s
fsync = $fsync
include 'node.conf'
EOF
  put "$dir/n1/pg_hba.conf" <<EOF
# scripts/pg-ha.sh: trust, on the socket and 127.0.0.1 only
local all all trust
host all all 127.0.0.1/32 trust
local replication all trust
host replication all 127.0.0.1/32 trust
EOF
  write_node_conf n1 standby1
  pg_start n1
  # -C -S: the slot standby1 on n1, made before the copy, so no WAL the standby needs is
  # removed; -R: standby.signal and primary_conninfo (with application_name=standby1).
  # shellcheck disable=SC2086
  as_pg "$bin/pg_basebackup" -D "$dir/n2" -X stream -c fast -C -S standby1 -R $nosync \
    -d "host=127.0.0.1 port=$p1 user=postgres application_name=standby1" \
    2>"$dir/basebackup.log" || die "pg_basebackup failed: $(cat "$dir/basebackup.log")"
  write_node_conf n2 ""
  pg_start n2
  wait_for 30 "the standby to stream and be sync" is_sync_standby_of n1
  echo "export HOOKGATE_HA_PRIMARY_URL=postgres://postgres@127.0.0.1:$p1/postgres"
  echo "export HOOKGATE_HA_STANDBY_URL=postgres://postgres@127.0.0.1:$p2/postgres"
  echo "export HOOKGATE_HA_URL='postgres://postgres@127.0.0.1:$p1,127.0.0.1:$p2/postgres?target_session_attrs=read-write'"
  ;;

promote)
  standby=$(node_with_role standby)
  [ -n "$standby" ] || refuse "no node is a running standby (see: $0 status $dir)"
  for n in $nodes; do [ "$n" = "$standby" ] || old=$n; done
  crash "$old"
  as_pg "$bin/pg_ctl" -D "$dir/$standby" -w -t 60 promote >/dev/null || die "pg_ctl promote failed"
  wait_for 30 "$standby to accept writes" accepts_writes "$standby"
  echo "pg-ha: $old (port $(port_of "$old")) killed; $standby (port $(port_of "$standby")) is the primary" >&2
  ;;

require-ghost)
  primary=$(node_with_role primary)
  [ -n "$primary" ] || refuse "no node is primary (see: $0 status $dir)"
  sql "$primary" -c "ALTER SYSTEM SET synchronous_standby_names = 'ghost'" -c "SELECT pg_reload_conf()" >/dev/null
  wait_for 10 "a commit on $primary to wait for the ghost standby" commit_waits "$primary"
  echo "pg-ha: $primary (port $(port_of "$primary")) now requires the standby 'ghost'" >&2
  ;;

release-ghost)
  primary=$(node_with_role primary)
  [ -n "$primary" ] || refuse "no node is primary (see: $0 status $dir)"
  sql "$primary" -c "ALTER SYSTEM RESET synchronous_standby_names" -c "SELECT pg_reload_conf()" >/dev/null
  for ((i = 0; i < 200; i++)); do no_sync_waiters "$primary" && break; sleep 0.05; done
  names=$(sql "$primary" -c "SHOW synchronous_standby_names")
  no_sync_waiters "$primary" \
    || echo "pg-ha: $(sync_waiters "$primary") commits on $primary still wait for '$names'" >&2
  echo "pg-ha: $primary (port $(port_of "$primary")): synchronous_standby_names = '$names'" >&2
  ;;

rejoin)
  primary=$(node_with_role primary)
  [ -n "$primary" ] || refuse "no node is primary (see: $0 status $dir)"
  for n in $nodes; do [ "$n" = "$primary" ] || old=$n; done
  [ -z "$(postmaster_pid "$old")" ] || refuse "$old is running: rejoin brings back a node that promote killed"
  crash "$old"  # none of its processes may still hold its data directory
  pp=$(port_of "$primary")
  # CHECKPOINT: a node promoted moments ago has not finished the checkpoint that writes its
  # new timeline into pg_control, from which pg_rewind reads it (pg_rewind's documentation
  # asks for this); without it pg_rewind looks for the divergence on the wrong timeline.
  sql "$primary" -c "CHECKPOINT" \
                 -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                     WHERE slot_name = 'standby1' AND NOT active" \
                 -c "SELECT pg_create_physical_replication_slot('standby1', true)" >/dev/null
  nosync=--no-sync
  if [ "$(sql "$primary" -c "SHOW fsync")" = on ]; then nosync=""; fi
  # pg_rewind first recovers the crashed data directory in single-user mode, then copies
  # from the new primary what changed since the timelines diverged (and all its
  # configuration files, so node.conf and postgresql.auto.conf are written anew after).
  # shellcheck disable=SC2086
  as_pg "$bin/pg_rewind" -D "$dir/$old" --source-server="host=127.0.0.1 port=$pp user=postgres dbname=postgres" \
    $nosync >"$dir/rewind.log" 2>&1 || die "pg_rewind failed: $(cat "$dir/rewind.log")"
  write_node_conf "$old" ""
  put "$dir/$old/postgresql.auto.conf" <<EOF
# Do not edit this file manually!
# It will be overwritten by the ALTER SYSTEM command.
primary_conninfo = 'host=127.0.0.1 port=$pp user=postgres application_name=standby1'
primary_slot_name = 'standby1'
EOF
  put "$dir/$old/standby.signal" </dev/null
  pg_start "$old"
  wait_for 30 "$old to stream from $primary" streams_to "$primary"
  write_node_conf "$primary" standby1
  sql "$primary" -c "SELECT pg_reload_conf()" >/dev/null
  wait_for 30 "$old to be $primary's sync standby" is_sync_standby_of "$primary"
  echo "pg-ha: $old (port $(port_of "$old")) is the sync standby of $primary (port $pp)" >&2
  ;;

status)
  primary=""
  for n in $nodes; do
    role=$(role_of "$n")
    [ "$role" = primary ] && primary="$primary $n"
    echo "$n: $role, port $(port_of "$n"), data $dir/$n"
  done
  for p in $primary; do
    echo
    echo "$p: synchronous_standby_names = '$(sql "$p" -c "SHOW synchronous_standby_names")'," \
      "commits waiting for a synchronous standby: $(sync_waiters "$p")"
    "$bin/psql" -X -P pager=off -h 127.0.0.1 -p "$(port_of "$p")" -U postgres -d postgres -c \
      "SELECT application_name, client_addr, state, sync_state, sent_lsn, flush_lsn, replay_lsn
       FROM pg_stat_replication ORDER BY application_name"
  done
  [ -n "$primary" ] || echo "no primary"
  ;;
esac
exit 0
