#!/usr/bin/env bash
# What the slot ring costs a claim, at the SQL level (docs/performance-log.md, "What the
# ring costs a claim"): one durable throwaway PostgreSQL, three schemas holding the same ROWS done events —
# `flat`, one table keyed by (provider, event_key) as before the ring; `ring`, six list
# partitions by slot with the rows spread over five sealed slots; `ring4`, four partitions
# (three sealed) — and pgbench (prepared statements, 16 clients) running each variant for
# DURATION seconds, ROUNDS rounds, each round every variant in turn. Prints transactions/s
# and Postgres CPU (every backend) per transaction, then each variant's medians.
#
# Variants (VARIANTS="..." picks some):
#   S-first     a first run: the claim of a new key, then its completion found by key
#   S-firstlit  the same, the completion naming the key's slot as a literal (one partition
#               in the plan: what carrying the slot from the claim, a slot per statement
#               text, would cost)
#   S-firstslot the same, the slot a parameter read back from the claim (pruned when the
#               statement runs; the planner keeps choosing custom plans for it)
#   S-dup       a duplicate answered from its row: the claim changes nothing, then the read
#   ring-dupskip the same, the claim inserting nothing for a key whose row is done (no row
#               lock: hookgate's claims since the duplicate-latency fix)
#   batch variants (issue 56): 32 new keys claimed in one statement, then completed in one,
#   as hookgate's group commit does, with the hot sessions' planner settings (generic
#   plans, no sequential scans, no hash or merge joins) and 4 clients; not in the default:
#   flat-batch  the plain table
#   ring-batch  the ring's batch statements on the partitioned table (before issue 56)
#   ring-batchc the completion named on the current slot's partition
#   ring-batch1 the probe, insert and completion all on the current slot's partition alone:
#               what a claim that probes only the slots that can hold a new key would cost
#   ring-batchf each slot's partition named in the probe, the sealed ones behind a
#               one-time filter on the key's skip bits, every sealed slot skipped (as the
#               filters of the sealed slots' keys skip them for a new key); the completion
#               on the current slot's partition
#   ring-batchfg the same with the claim's guard (the partitioned table's lock first, the
#               ring's state read), as hookgate runs it; ring-batchfs with the ring's state
#               read alone, ring-batchfl with the table's lock alone
# Usage: scripts/ring-claim-cost.sh [ROWS=5000000] [DURATION=20] [ROUNDS=3]. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-5000000}
duration=${2:-20}
rounds=${3:-3}

dir=$(mktemp -d /tmp/hookgate-ring.XXXXXX)
chmod 755 "$dir"
trap 'scripts/pg-throwaway.sh stop "$dir/pg"' EXIT
eval "$(scripts/pg-throwaway.sh start "$dir/pg" durable)"
url=$HOOKGATE_TEST_DATABASE_URL
pgbin=$(dirname "$(ls /usr/lib/postgresql/*/bin/pgbench | head -1)")
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
psql_() { as_pg "$pgbin/psql" -q -v ON_ERROR_STOP=1 "$url" "$@"; }

columns="provider text NOT NULL, event_key text NOT NULL, status text NOT NULL,
         attempts integer NOT NULL DEFAULT 1, last_path text NOT NULL, fingerprint text,
         result_status smallint, locked_until timestamptz,
         created_at timestamptz NOT NULL DEFAULT now(),
         updated_at timestamptz NOT NULL DEFAULT now()"
fill="SELECT 'p', 'k' || g, 'done', 1, 'first_run', md5(g::text), 200,
             NULL::timestamptz, now(), now()"
psql_ <<SQL
CREATE SCHEMA flat;
CREATE TABLE flat.e ($columns, PRIMARY KEY (provider, event_key));
CREATE INDEX ON flat.e (status, updated_at);
INSERT INTO flat.e $fill FROM generate_series(1, $rows) g;
CREATE SCHEMA ring;
CREATE TABLE ring.slots (slot smallint PRIMARY KEY, state text NOT NULL);
INSERT INTO ring.slots VALUES (0, 'sealed'), (1, 'sealed'), (2, 'sealed'), (3, 'sealed'),
                              (4, 'sealed'), (5, 'current');
CREATE TABLE ring.e ($columns, slot smallint NOT NULL) PARTITION BY LIST (slot);
DO \$\$ BEGIN FOR s IN 0..5 LOOP
  EXECUTE format('CREATE TABLE ring.e_s%s PARTITION OF ring.e FOR VALUES IN (%s)', s, s);
END LOOP; END \$\$;
CREATE UNIQUE INDEX ON ring.e (provider, event_key, slot);
CREATE INDEX ON ring.e (status, updated_at);
INSERT INTO ring.e $fill, (g % 5)::smallint FROM generate_series(1, $rows) g;
CREATE SCHEMA ring4;
CREATE TABLE ring4.slots (slot smallint PRIMARY KEY, state text NOT NULL);
INSERT INTO ring4.slots VALUES (0, 'sealed'), (1, 'sealed'), (2, 'sealed'), (3, 'current');
CREATE TABLE ring4.e ($columns, slot smallint NOT NULL) PARTITION BY LIST (slot);
DO \$\$ BEGIN FOR s IN 0..3 LOOP
  EXECUTE format('CREATE TABLE ring4.e_s%s PARTITION OF ring4.e FOR VALUES IN (%s)', s, s);
END LOOP; END \$\$;
CREATE UNIQUE INDEX ON ring4.e (provider, event_key, slot);
CREATE INDEX ON ring4.e (status, updated_at);
INSERT INTO ring4.e $fill, (g % 3)::smallint FROM generate_series(1, $rows) g;
VACUUM ANALYZE;
SQL

# A first run: the claim of a new key, then its completion, as hookgate's statements do.
cat > "$dir/flat-first.sql" <<'SQL'
\set k random(1, 9000000000000000000)
INSERT INTO flat.e AS e (provider, event_key, status, attempts, last_path, locked_until)
VALUES ('p', 'n' || :k, 'in_progress', 1, 'first_run', now() + interval '30 seconds')
ON CONFLICT (provider, event_key) DO UPDATE SET attempts = e.attempts + 1
WHERE e.status = 'failed' RETURNING attempts;
UPDATE flat.e SET status = 'done', result_status = 200, locked_until = NULL, updated_at = now()
WHERE provider = 'p' AND event_key = 'n' || :k AND attempts = 1 AND status = 'in_progress';
SQL
cat > "$dir/ring-first.sql" <<'SQL'
\set k random(1, 9000000000000000000)
INSERT INTO ring.e AS e (provider, event_key, slot, status, attempts, last_path, locked_until)
VALUES ('p', 'n' || :k,
        COALESCE((SELECT w.slot FROM ring.e w WHERE w.provider = 'p' AND w.event_key = 'n' || :k
                  LIMIT 1),
                 (SELECT c.slot FROM ring.slots c WHERE c.state = 'current')),
        'in_progress', 1, 'first_run', now() + interval '30 seconds')
ON CONFLICT (provider, event_key, slot) DO UPDATE SET attempts = e.attempts + 1
WHERE e.status = 'failed' RETURNING attempts;
UPDATE ring.e SET status = 'done', result_status = 200, locked_until = NULL, updated_at = now()
WHERE provider = 'p' AND event_key = 'n' || :k AND attempts = 1 AND status = 'in_progress';
SQL
# A duplicate whose answer is read from its row: the claim changes nothing, then the read.
cat > "$dir/flat-dup.sql" <<SQL
\set k random(1, $rows)
INSERT INTO flat.e AS e (provider, event_key, status, attempts, last_path, locked_until)
VALUES ('p', 'k' || :k, 'in_progress', 1, 'first_run', now() + interval '30 seconds')
ON CONFLICT (provider, event_key) DO UPDATE SET attempts = e.attempts + 1
WHERE e.status = 'failed' RETURNING attempts;
SELECT status, attempts, result_status FROM flat.e WHERE provider = 'p' AND event_key = 'k' || :k;
SQL
cat > "$dir/ring-dup.sql" <<SQL
\set k random(1, $rows)
INSERT INTO ring.e AS e (provider, event_key, slot, status, attempts, last_path, locked_until)
VALUES ('p', 'k' || :k,
        COALESCE((SELECT w.slot FROM ring.e w WHERE w.provider = 'p' AND w.event_key = 'k' || :k
                  LIMIT 1),
                 (SELECT c.slot FROM ring.slots c WHERE c.state = 'current')),
        'in_progress', 1, 'first_run', now() + interval '30 seconds')
ON CONFLICT (provider, event_key, slot) DO UPDATE SET attempts = e.attempts + 1
WHERE e.status = 'failed' RETURNING attempts;
SELECT status, attempts, result_status FROM ring.e WHERE provider = 'p' AND event_key = 'k' || :k;
SQL
# The same duplicate, its claim inserting nothing for a key whose row is done (a claim
# never changes a done row): ON CONFLICT DO UPDATE locks the row it conflicts with even
# when its WHERE leaves the row alone, which writes the lock into the row's heap page.
cat > "$dir/ring-dupskip.sql" <<SQL
\set k random(1, $rows)
INSERT INTO ring.e AS e (provider, event_key, slot, status, attempts, last_path, locked_until)
SELECT 'p', 'k' || :k, COALESCE(s.slot, (SELECT c.slot FROM ring.slots c WHERE c.state = 'current')),
       'in_progress', 1, 'first_run', now() + interval '30 seconds'
FROM (SELECT 1) one
LEFT JOIN LATERAL (SELECT w.slot, w.status FROM ring.e w
                   WHERE w.provider = 'p' AND w.event_key = 'k' || :k LIMIT 1) s ON true
WHERE s.status IS NULL OR s.status NOT IN ('done', 'dead')
ON CONFLICT (provider, event_key, slot) DO UPDATE SET attempts = e.attempts + 1
WHERE e.status = 'failed' RETURNING attempts;
SELECT status, attempts, result_status FROM ring.e WHERE provider = 'p' AND event_key = 'k' || :k;
SQL
for s in ring ring4; do
cat > "$dir/$s-firstslot.sql" <<SQL
\set k random(1, 9000000000000000000)
INSERT INTO $s.e AS e (provider, event_key, slot, status, attempts, last_path, locked_until)
VALUES ('p', 'n' || :k,
        COALESCE((SELECT w.slot FROM $s.e w WHERE w.provider = 'p' AND w.event_key = 'n' || :k
                  LIMIT 1),
                 (SELECT c.slot FROM $s.slots c WHERE c.state = 'current')),
        'in_progress', 1, 'first_run', now() + interval '30 seconds')
ON CONFLICT (provider, event_key, slot) DO UPDATE SET attempts = e.attempts + 1
WHERE e.status = 'failed' RETURNING attempts, slot AS s \gset
UPDATE $s.e SET status = 'done', result_status = 200, locked_until = NULL, updated_at = now()
WHERE provider = 'p' AND event_key = 'n' || :k AND slot = :s AND attempts = 1 AND status = 'in_progress';
SQL
sed "s/slot = :s/slot = $([ $s = ring ] && echo 5 || echo 3)/" "$dir/$s-firstslot.sql" > "$dir/$s-firstlit.sql"
sed "s/ring\./$s./g" "$dir/ring-first.sql" > "$dir/$s-first.sql.tmp" && mv "$dir/$s-first.sql.tmp" "$dir/$s-first.sql"
sed "s/ring\./$s./g" "$dir/ring-dup.sql" > "$dir/$s-dup.sql.tmp" && mv "$dir/$s-dup.sql.tmp" "$dir/$s-dup.sql"
done
# Batches of 32 new keys: the claim (probe every key's row, insert the new ones, report)
# and the completion, in the shape of hookgate's CLAIM_BATCH and COMPLETE_BATCH_PLAIN.
# $1 name, $2 the probe's relation, $3 the insert's, $4 the completion's, $5 the conflict's
# columns, $6 the schema whose slots say which is current.
# $7 (optional) the probe's FROM and WHERE in place of $2's; $8 (optional) more of the
# claim's CTEs, before its probe, and $9 a condition of its insert.
batch() {
local probe=${7:-"FROM $2 w WHERE w.provider = i.provider AND w.event_key = i.event_key"}
cat > "$dir/$1.sql" <<SQL
\set k random(1, 9000000000000000000)
\set skip 31
WITH input AS (SELECT 'p'::text AS provider, 'n' || :k || '-' || g AS event_key, :skip::int4 AS skip
               FROM generate_series(1, 32) g),${8:-}
found AS (SELECT i.*, s.status, s.attempts FROM input i
  LEFT JOIN LATERAL (SELECT w.status, w.attempts $probe LIMIT 1) s ON true),
claimed AS (INSERT INTO $3 AS e (provider, event_key, slot, status, attempts, last_path, locked_until)
  SELECT f.provider, f.event_key, (SELECT c.slot FROM $6.slots c WHERE c.state = 'current'),
         'in_progress', 1, 'first_run', now() + interval '30 seconds'
  FROM found f WHERE (f.status IS NULL OR f.status NOT IN ('done', 'dead'))${9:-}
  ORDER BY f.provider, f.event_key
  ON CONFLICT ($5) DO UPDATE SET attempts = e.attempts + 1 WHERE e.status = 'failed'
  RETURNING e.provider, e.event_key, true AS won, e.status, e.attempts)
SELECT * FROM claimed UNION ALL
SELECT f.provider, f.event_key, false, f.status, f.attempts FROM found f
WHERE f.status IS NOT NULL AND (f.provider, f.event_key) NOT IN (SELECT provider, event_key FROM claimed);
UPDATE $4 AS e SET status = 'done', result_status = 200, locked_until = NULL, updated_at = now()
FROM (SELECT * FROM unnest(array_fill('p'::text, ARRAY[32]),
                           (SELECT array_agg('n' || :k || '-' || g) FROM generate_series(1, 32) g),
                           array_fill(1, ARRAY[32])) AS u(provider, event_key, attempts)
      ORDER BY provider, event_key) AS u
WHERE e.provider = u.provider AND e.event_key = u.event_key AND e.attempts = u.attempts
  AND e.status IS NOT DISTINCT FROM 'in_progress'
RETURNING e.provider, e.event_key;
SQL
}
psql_ -c "CREATE TABLE flat.slots AS SELECT 0::smallint AS slot, 'current'::text AS state;
          ALTER TABLE flat.e ADD COLUMN slot smallint NOT NULL DEFAULT 0"
batch flat-batch flat.e flat.e flat.e "provider, event_key" flat
batch ring-batch ring.e ring.e ring.e "provider, event_key, slot" ring
batch ring-batchc ring.e ring.e ring.e_s5 "provider, event_key, slot" ring
batch ring-batch1 ring.e_s5 ring.e_s5 ring.e_s5 "provider, event_key, slot" ring
named="FROM ("
for slot in 5 0 1 2 3 4; do
  [ "$slot" = 5 ] || named="$named UNION ALL "
  named="$named SELECT x.status, x.attempts FROM ring.e_s$slot x
    WHERE x.provider = i.provider AND x.event_key = i.event_key AND (i.skip & $((1 << slot))) = 0"
done
named="$named) w"
batch ring-batchf - ring.e ring.e_s5 "provider, event_key, slot" ring "$named"
guard="
current AS (SELECT slot FROM ring.slots WHERE state = 'current'
  AND NOT EXISTS (SELECT FROM ONLY ring.e p WHERE false FOR KEY SHARE)
  AND NOT EXISTS (SELECT FROM ring.slots o WHERE o.state <> 'empty' AND o.slot NOT IN (0, 1, 2, 3, 4, 5))),"
batch ring-batchfg - ring.e ring.e_s5 "provider, event_key, slot" ring "$named" "$guard" \
  " AND EXISTS (SELECT FROM current)"
# The guard's two parts apart: the ring's state alone, and the table's lock alone.
state="
current AS (SELECT slot FROM ring.slots WHERE state = 'current'
  AND NOT EXISTS (SELECT FROM ring.slots o WHERE o.state <> 'empty' AND o.slot NOT IN (0, 1, 2, 3, 4, 5))),"
batch ring-batchfs - ring.e ring.e_s5 "provider, event_key, slot" ring "$named" "$state" \
  " AND EXISTS (SELECT FROM current)"
lock="
current AS (SELECT slot FROM ring.slots WHERE state = 'current'
  AND NOT EXISTS (SELECT FROM ONLY ring.e p WHERE false FOR KEY SHARE)),"
batch ring-batchfl - ring.e ring.e_s5 "provider, event_key, slot" ring "$named" "$lock" \
  " AND EXISTS (SELECT FROM current)"
chmod 644 "$dir"/*.sql

DIR=$dir PGBIN=$pgbin URL=$url DURATION=$duration ROUNDS=$rounds python3 - <<'PY'
import os, re, subprocess

d, pgbin, url = os.environ["DIR"], os.environ["PGBIN"], os.environ["URL"]
secs, rounds = os.environ["DURATION"], int(os.environ["ROUNDS"])
tick = os.sysconf("SC_CLK_TCK")
as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []

def postgres_ticks():
    pm = int(open(f"{d}/pg/data/postmaster.pid").readline())
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(entry) == pm or int(fields[1]) == pm:
                total += sum(int(x) for x in fields[11:15])
    return total

def wal_bytes():
    out = subprocess.run(as_pg + [f"{pgbin}/psql", "-qAt", url, "-c",
                          "SELECT pg_current_wal_lsn() - '0/0'"],
                         capture_output=True, text=True, check=True)
    return int(float(out.stdout.strip()))

def run(script):
    subprocess.run(as_pg + [f"{pgbin}/psql", "-q", url, "-c", "CHECKPOINT"], check=True)
    before = postgres_ticks()
    wal_before = wal_bytes()
    # Batches run as hookgate's hot sessions plan them (src/store/postgres/pools.rs).
    env = dict(os.environ)
    clients = "16"
    if "batch" in script:
        env["PGOPTIONS"] = ("-c enable_seqscan=off -c enable_hashjoin=off "
                            "-c enable_mergejoin=off -c jit=off "
                            "-c plan_cache_mode=force_generic_plan")
        clients = "4"
    out = subprocess.run(as_pg + [f"{pgbin}/pgbench", "-n", "-M", "prepared", "-c", clients,
                          "-j", "2", "-T", secs, "-f", f"{d}/{script}.sql", url],
                         capture_output=True, text=True, env=env)
    if out.returncode:
        print(out.stderr[-2000:])
        raise SystemExit(1)
    out = out.stdout
    n = int(re.search(r"number of transactions actually processed: (\d+)", out).group(1))
    us = (postgres_ticks() - before) / tick * 1e6 / n
    return n / float(secs), us, (wal_bytes() - wal_before) / n

variants = os.environ.get("VARIANTS", "flat-first ring-first ring-firstlit ring-firstslot "
                          "ring4-first ring4-firstlit flat-dup ring-dup ring4-dup").split()
res = {v: [] for v in variants}
for r in range(rounds):
    for v in variants:
        tps, us, wal = run(v)
        res[v].append((tps, us, wal))
        print(f"round {r + 1} {v}: {tps:.0f} tx/s {us:.0f} us CPU/tx {wal:.0f} B WAL/tx",
              flush=True)
def median(xs):
    return sorted(xs)[len(xs) // 2]
for v in variants:
    tps, us = median([x[0] for x in res[v]]), median([x[1] for x in res[v]])
    wal = median([x[2] for x in res[v]])
    print(f"{v}: median {tps:.0f} tx/s {us:.0f} us CPU/tx {wal:.0f} B WAL/tx")
PY
