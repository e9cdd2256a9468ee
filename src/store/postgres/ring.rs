//! The slot ring's upkeep (docs/design.md, "Storage over time"): turning the ring, emptying
//! a slot whose rows are past retention (its keepers moved once to the keep slot, a megabyte
//! or so per transaction, then both of its partitions truncated), and the row-by-row
//! retention of the keep slot and of a slot that came from an upgraded table. Every change
//! of the ring's state runs in a short transaction holding the `EXCLUSIVE` lock of the
//! events and their history, so no claim runs across it; each asks for that lock for a
//! moment only and holds it for one bounded step, so no claim waits long behind it.

use std::time::{Duration, Instant};

use deadpool_postgres::Object;

use super::pool::Inner;
use super::rows::{db_error, get, is_lock_timeout};
use super::sql::SWEEP;
use crate::store::retain::{Retained, Retention};
use crate::store::{millis, StoreError};

/// A transaction holding the events' and their history's `EXCLUSIVE` lock, and when it got
/// it; or the lock timeout's error if it could not be had in [`RING_LOCK_TRIES`] asks of
/// [`RING_LOCK_TIMEOUT`] each. Claims wait behind each ask for its timeout at most, and run
/// freely in the pauses between asks. (A macro: a function answering the transaction from
/// inside its loop of tries borrows the client for every try.)
macro_rules! locked {
    ($client:expr) => {{
        let mut tries = 0;
        loop {
            tries += 1;
            match lock_once($client).await {
                Err(e) if is_lock_timeout(&e) && tries < RING_LOCK_TRIES => {
                    tokio::time::sleep(RING_LOCK_PAUSE).await;
                }
                answer => break answer,
            }
        }
    }};
}

/// How many turns of the ring one `retention.done` takes: the current slot is sealed a
/// quarter of it after it opened, so a done row is kept between `retention.done` and
/// `retention.done` plus a quarter (the table's size swings by about ±11 % around its mean).
pub(crate) const TURNS_PER_RETENTION: u32 = 4;

/// How long a ring transaction waits for the table's lock before it gives up and asks
/// again: every claim waits behind the lock request meanwhile, so this bounds the pause
/// the request puts on ingest when a long write (a claim stuck on a row lock) holds the
/// table. The wait plus one step's hold stays well inside 200 ms.
const RING_LOCK_TIMEOUT: Duration = Duration::from_millis(50);

/// How often a ring transaction asks for the lock before the step is left for the next
/// pass, and the pause between two asks (claims run freely meanwhile).
const RING_LOCK_TRIES: u32 = 8;
const RING_LOCK_PAUSE: Duration = Duration::from_millis(25);

/// The most bytes of keepers (payloads, answers, kept headers) one transaction moves to the
/// keep slot: a move copies each value into the keep slot's partition (its TOAST and the
/// WAL) while every claim waits, so a batch is bounded by what it copies, not only by its
/// rows (a thousand dead letters of 1 MiB outlasted the store deadline in one batch, and
/// the ring never turned again). Measured with incompressible payloads on a durable
/// cluster of this 2-core machine: about 100 ms of lock per 4 MiB, so 1 MiB keeps a hold
/// near 25 ms. A single row larger than that moves alone.
const MOVE_BYTES: i64 = 1 << 20;

/// How long the emptying waits to turn autovacuum off for its slot ([`hush`]): a running
/// autovacuum gives way to a waiter after `deadlock_timeout` (a second by default).
/// Claims never queue behind this request (it conflicts with no lock they take).
const HUSH_WAIT: Duration = Duration::from_secs(3);

/// The slot that keeps the rows outliving their slot of the ring (state `keep`): never
/// truncated, its rows deleted one by one when their retention ends.
const KEEP_SLOT: i16 = 6;

/// An exact count of what an emptying removes reads at most this many entries of each
/// index range; past it, the figure is the planner's estimate of the partition's rows
/// (`hookgate_swept_rows` is a rate to watch, not an audit), so no step of a pass reads
/// every row of a slot.
const EXACT_UP_TO: i64 = 100_000;

/// The advisory lock a node's ring upkeep holds for its pass, with the schema's name (two
/// deployments in two schemas of one database have a ring each): one node turns and
/// empties at a time, so two nodes never make each other's truncation wait (the other's
/// moves hold the lock it asks for). A node that does not get it leaves the upkeep to the
/// one that did; its dead-letter sweep and its backlog go on.
const UPKEEP_LOCK: i32 = 8_347_285;
/// The first statement of every ring transaction: claims, completions and history writes
/// wait until it commits, and it waits for the ones running (a statement takes its
/// snapshot after its locks, so whatever runs after sees the ring as this left it). It
/// locks the two parents `ONLY`: every statement of the store names them, so that
/// excludes every writer, and it never waits for what works on one partition alone —
/// autovacuum or `ANALYZE` of a slot, which give way to a waiter only after
/// `deadlock_timeout`, past [`RING_LOCK_TIMEOUT`], while every claim waited behind it.
const LOCK: &str = "LOCK TABLE ONLY webhook_events, ONLY webhook_attempts IN EXCLUSIVE MODE";

/// Seals the current slot if it opened `$1` ms ago or earlier and an empty slot can take
/// its place; answers the sealed slot.
const SEAL: &str = "
UPDATE hookgate_slots SET state = 'sealed', sealed_at = now()
WHERE state = 'current' AND opened_at <= now() - $1::bigint * interval '1 millisecond'
  AND EXISTS (SELECT 1 FROM hookgate_slots WHERE state = 'empty')
RETURNING slot";

/// Opens the empty slot that follows `$1` round the ring as the current one.
const OPEN: &str = "
UPDATE hookgate_slots SET state = 'current', opened_at = now(), sealed_at = NULL
WHERE slot = (SELECT slot FROM hookgate_slots WHERE state = 'empty'
              ORDER BY slot <= $1, slot LIMIT 1)";

/// The sealed slots whose time is up, oldest first: a slot is emptied `$1` ms
/// (retention.done) after it should have been sealed — a turn (`$2` ms) after it opened, or
/// when it was sealed if that was sooner. A slot sealed late (no pass ran for a while) is
/// emptied as if sealed on time: whatever it holds that is still inside retention moves
/// out with the keepers.
const DUE: &str = "
SELECT slot FROM hookgate_slots
WHERE state = 'sealed'
  AND LEAST(sealed_at, opened_at + $2::bigint * interval '1 millisecond')
      <= now() - $1::bigint * interval '1 millisecond'
ORDER BY sealed_at";

/// Whether slot `$1` is still sealed and due ([`DUE`]'s rule, `$2` retention.done, `$3` a
/// turn), asked under the lock: another node's pass may have emptied it, and then turned
/// the ring to it, since this pass read the due slots.
const STILL_DUE: &str = "
SELECT EXISTS (
    SELECT 1 FROM hookgate_slots
    WHERE slot = $1 AND state = 'sealed'
      AND LEAST(sealed_at, opened_at + $3::bigint * interval '1 millisecond')
          <= now() - $2::bigint * interval '1 millisecond') AS due";

/// Moves rows slot `$1` must keep to the keep slot `$6`, with their history: every row not
/// yet final, a done row done within `$2` ms, a dead letter dead within `$3` ms. It looks
/// at `$4` of them at most and moves those whose bytes before them add up to less than
/// `$5` (the first one always). Each part is a range of the slot's (status, updated_at)
/// index, so finding them costs what they are, not what the slot holds; a value's length
/// is read from its header, not its bytes. Answers how many it looked at and how many
/// moved: the slot has no keepers left when both are equal and fewer than `$4`.
const MOVE_KEEPERS: &str = "
WITH candidates AS (
    (SELECT provider, event_key, payload, result_body, request_headers FROM webhook_events
     WHERE slot = $1 AND status IN ('queued', 'in_progress', 'failed'))
    UNION ALL
    (SELECT provider, event_key, payload, result_body, request_headers FROM webhook_events
     WHERE slot = $1 AND status = 'done'
       AND updated_at > now() - $2::bigint * interval '1 millisecond')
    UNION ALL
    (SELECT provider, event_key, payload, result_body, request_headers FROM webhook_events
     WHERE slot = $1 AND status = 'dead'
       AND updated_at > now() - $3::bigint * interval '1 millisecond')
    LIMIT $4),
sized AS (
    SELECT provider, event_key,
           sum(COALESCE(octet_length(payload), 0) + COALESCE(octet_length(result_body), 0)
               + COALESCE(octet_length(request_headers), 0) + 256) OVER w AS upto,
           row_number() OVER w AS n
    FROM candidates
    WINDOW w AS (ROWS UNBOUNDED PRECEDING)),
keep AS (
    SELECT provider, event_key FROM sized
    WHERE n = 1 OR upto <= $5),
moved AS (
    UPDATE webhook_events e SET slot = $6
    FROM keep k
    WHERE e.slot = $1 AND e.provider = k.provider AND e.event_key = k.event_key
    RETURNING e.provider, e.event_key),
history AS (
    UPDATE webhook_attempts a SET slot = $6
    FROM moved m
    WHERE a.slot = $1 AND a.provider = m.provider AND a.event_key = m.event_key)
SELECT (SELECT count(*) FROM sized)::bigint AS looked, count(*)::bigint AS moved
FROM moved";

/// What emptying slot `slot` will remove, counted before its lock is taken (a sealed slot
/// gains no rows, so the count holds unless a row changes meanwhile): its done rows done
/// `$1` ms ago or earlier and its dead letters dead `$2` ms ago or earlier, each counted up
/// to `$3` entries of a range of the slot's partition's `(status, updated_at)` index, and
/// the planner's estimate of the partition's rows (`reltuples`, -1 if never analyzed) for
/// a count that reached `$3`. Read while claims go on; nothing per row is written. Asked
/// of the partition by name: asked of the partitioned table (`slot = $1`) the same count
/// took four times as long.
fn expired(slot: i16) -> String {
    format!(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM webhook_events_s{slot}
                 WHERE status = 'done'
                   AND updated_at <= now() - $1::bigint * interval '1 millisecond'
                 LIMIT $3) d) AS done,
                (SELECT count(*) FROM (SELECT 1 FROM webhook_events_s{slot}
                 WHERE status = 'dead'
                   AND updated_at <= now() - $2::bigint * interval '1 millisecond'
                 LIMIT $3) d) AS dead,
                (SELECT reltuples::bigint FROM pg_class
                 WHERE oid = 'webhook_events_s{slot}'::regclass) AS estimate"
    )
}

/// Marks slot `$1` empty once its partitions are truncated.
const EMPTIED: &str = "
UPDATE hookgate_slots SET state = 'empty', opened_at = NULL, sealed_at = NULL,
       row_by_row = false
WHERE slot = $1";

/// The slots whose expired done rows are deleted one by one until they are emptied (a
/// table of an earlier version, attached as slot 0).
const ROW_BY_ROW: &str = "SELECT slot FROM hookgate_slots WHERE row_by_row";

/// Deletes at most `$4` rows of status `$2` in slot `$1` older than `$3` ms, with their
/// history; the row-by-row retention of a slot from an upgraded table, until it is emptied. Locks as
/// [`SWEEP`](super::sql::SWEEP) does.
const SWEEP_SLOT: &str = "
WITH gone AS (
    DELETE FROM webhook_events
    WHERE (provider, event_key, slot) IN (
        SELECT provider, event_key, slot FROM webhook_events
        WHERE slot = $1 AND status = $2
          AND updated_at < now() - $3::bigint * interval '1 millisecond'
        ORDER BY updated_at
        LIMIT $4
        FOR UPDATE SKIP LOCKED)
    RETURNING provider, event_key, slot),
history AS (
    DELETE FROM webhook_attempts a USING gone g
    WHERE a.provider = g.provider AND a.event_key = g.event_key AND a.slot = g.slot)
SELECT count(*)::bigint AS deleted FROM gone";

/// How late retention is, in ms: how long the most overdue sealed slot has waited past
/// its time to be emptied ([`DUE`]: `$1` retention.done, `$2` a turn), how long the current
/// slot has stayed current past two turns (the ring cannot turn), and how far past `$3`
/// (retention.dead) the oldest dead letter is. Zero while retention keeps up. Reads the
/// ring's state and one entry of each partition's status index.
const BACKLOG: &str = "
SELECT GREATEST(0,
    COALESCE((SELECT max(extract(epoch FROM now() - LEAST(sealed_at,
                         opened_at + $2::float8 * interval '1 millisecond')))
                     ::float8 * 1000 - $1::float8
              FROM hookgate_slots WHERE state = 'sealed'), 0),
    COALESCE((SELECT extract(epoch FROM now() - opened_at)::float8 * 1000 - 2 * $2::float8
              FROM hookgate_slots WHERE state = 'current'), 0),
    COALESCE((SELECT extract(epoch FROM now() - min(updated_at))::float8 * 1000 - $3::float8
              FROM webhook_events WHERE status = 'dead'), 0))::bigint
    AS backlog_ms";

/// How far past `$2` (retention.done) the oldest done row of row-by-row slot `$1` is, in
/// ms (zero or less: none). The slot is a parameter, so only its partition is read — one
/// entry of its status index. Asked with the row-by-row slots in the query itself
/// (`slot IN (SELECT …)`), nothing told the planner which partitions to leave out: it read
/// every done row of every slot, a sequential scan of the whole table each pass, which at
/// 50 million rows outlasted the statement deadline, so no pass ever ended.
const ROW_BY_ROW_BACKLOG: &str = "
SELECT COALESCE(extract(epoch FROM now() - min(updated_at))::float8 * 1000 - $2::float8, 0)
       ::bigint AS backlog_ms
FROM webhook_events WHERE slot = $1 AND status = 'done'";

/// Whether the ring is due to turn: its current slot opened `$1` ms ago or earlier and an
/// empty slot can take its place. Read without a lock; [`SEAL`] asks again under it.
const TURN_DUE: &str = "
SELECT EXISTS (SELECT 1 FROM hookgate_slots
               WHERE state = 'current'
                 AND opened_at <= now() - $1::bigint * interval '1 millisecond')
   AND EXISTS (SELECT 1 FROM hookgate_slots WHERE state = 'empty') AS due";

impl Inner {
    /// One retention pass on the ring: the sealed slots whose time is up are emptied, the
    /// ring turns if its current slot is a quarter of `retention.done` old, and the
    /// row-by-row slots (the keep slot, a slot from an upgraded table) and the dead letters
    /// lose their expired rows for as long as the budget lasts. A step that fails is
    /// recorded in [`Retained::failed`] and the pass goes on: a slot that cannot be emptied
    /// never keeps the ring from turning, the dead letters from going or the backlog from
    /// being read. A ring transaction that cannot have the table's lock in time is left for
    /// the next pass (the backlog says so). Only the node holding [`UPKEEP_LOCK`] turns
    /// and empties. Answers the rows removed and how late retention is.
    pub(crate) async fn retain_ring(&self, policy: &Retention) -> Result<Retained, StoreError> {
        let started = Instant::now();
        let mut client = self.client().await?;
        // The node's view of the ring is read at every pass, whatever the pass then meets,
        // so its slotted statements never name a slot older than a pass: the current slot
        // they run on first is not one whose keepers move (a move would take the rows from
        // under them) unless a pass turned and emptied it since, and then the statement's
        // error forgets the view.
        self.ring.refresh(&client).await;
        let mut retained = Retained::default();
        let quarter = policy.done / TURNS_PER_RETENTION;
        let upkeep: bool = get(
            &client
                .query_one(
                    "SELECT pg_try_advisory_lock($1, hashtext(current_schema())) AS got",
                    &[&UPKEEP_LOCK],
                )
                .await
                .map_err(db_error)?,
            "got",
        )?;
        if upkeep {
            let upkept = upkeep_ring(&mut client, policy, started, &mut retained).await;
            // The lock is the session's: it goes back with the connection to the pool,
            // so it is let go whatever the upkeep answered (a broken connection lets it go
            // with the session).
            let unlocked = client
                .execute(
                    "SELECT pg_advisory_unlock($1, hashtext(current_schema()))",
                    &[&UPKEEP_LOCK],
                )
                .await
                .map_err(db_error);
            if let Err(e) = upkept.and(unlocked.map(drop)) {
                failed(&mut retained, "the ring's upkeep", &e);
            }
        }
        // The done rows of the keep slot and of a slot from an upgraded table go one by
        // one; dead letters, the exception, go one by one wherever they are, when their own
        // retention ends rather than with their slot. Row locks only (`SKIP LOCKED`), so
        // every node does this part.
        let row_by_row = slots(&client, ROW_BY_ROW, &[]).await?;
        // Their budget starts here: the upkeep's moves may have taken an interval.
        let started = Instant::now();
        for &slot in &row_by_row {
            let done = ("done", policy.done);
            let swept = sweep_rows(
                &client,
                Some(slot),
                done,
                policy,
                started,
                &mut retained.done,
            )
            .await;
            if let Err(e) = swept {
                failed(&mut retained, &format!("slot {slot}'s expired rows"), &e);
            }
        }
        let dead = ("dead", policy.dead);
        let swept = sweep_rows(&client, None, dead, policy, started, &mut retained.dead).await;
        if let Err(e) = swept {
            failed(&mut retained, "the expired dead letters", &e);
        }
        let millis_f = |d: Duration| millis(d) as f64;
        let row = client
            .query_one(
                BACKLOG,
                &[
                    &millis_f(policy.done),
                    &millis_f(quarter),
                    &millis_f(policy.dead),
                ],
            )
            .await
            .map_err(db_error)?;
        let mut backlog_ms: i64 = get(&row, "backlog_ms")?;
        for slot in row_by_row {
            let row = client
                .query_one(ROW_BY_ROW_BACKLOG, &[&slot, &millis_f(policy.done)])
                .await
                .map_err(db_error)?;
            backlog_ms = backlog_ms.max(get(&row, "backlog_ms")?);
        }
        retained.backlog = Duration::from_millis(u64::try_from(backlog_ms).unwrap_or(0));
        // Last, and on every node: a filter of each sealed slot's keys not read yet, for
        // this node's claims. A slot due within a turn is left alone (it goes soon, and a
        // reader of its partition would only stand in its truncation's way).
        self.ring.refresh(&client).await;
        match self
            .ring
            .build(&client, policy.done.saturating_sub(quarter))
            .await
        {
            Ok(built) => retained.filters = built,
            Err(e) => failed(&mut retained, "reading the sealed slots' keys", &e),
        }
        retained.filter_bytes = self.ring.filter_bytes();
        Ok(retained)
    }
}

/// Records the first step of a pass that failed (the pass goes on).
fn failed(retained: &mut Retained, step: &str, e: &StoreError) {
    retained
        .failed
        .get_or_insert_with(|| format!("{step}: {e}"));
}

/// The upkeep of the ring, by the node holding [`UPKEEP_LOCK`]: the due slots emptied, the
/// ring turned, then the due slots again (a slot the turn sealed late may be due at once).
/// An emptying that fails is recorded and the turn still comes: the ring turns as long as
/// an empty slot is left.
async fn upkeep_ring(
    client: &mut Object,
    policy: &Retention,
    started: Instant,
    retained: &mut Retained,
) -> Result<(), StoreError> {
    let quarter = policy.done / TURNS_PER_RETENTION;
    if let Err(e) = empty_due(client, policy, started, retained).await {
        failed(retained, "emptying a due slot", &e);
    }
    // Passes come every `policy.interval`: the ring turns at the pass nearest a turn's
    // age, not at the first one past it, which would come most of an interval late at
    // nearly every turn (a slot opens during a pass and is asked about a turn's age
    // later, before that pass's work). Sealing early is safe: a slot is emptied
    // `retention.done` after it was sealed, or after a turn if that is sooner.
    let seal_at = quarter.saturating_sub(policy.interval / 2);
    match turn(client, seal_at, &mut retained.longest_lock).await {
        Err(e) if !is_lock_timeout(&e) => failed(retained, "turning the ring", &e),
        _ => {}
    }
    empty_due(client, policy, started, retained).await
}

/// Empties every sealed slot whose time is up ([`DUE`]), oldest first, and adds what went
/// with them to `retained`. A slot whose locks could not be had in time (the tables'
/// within [`RING_LOCK_TIMEOUT`], its partitions' at once), or whose keepers take longer than an
/// interval to move, is left for the next pass with those after it.
async fn empty_due(
    client: &mut Object,
    policy: &Retention,
    started: Instant,
    retained: &mut Retained,
) -> Result<(), StoreError> {
    let quarter = millis(policy.done / TURNS_PER_RETENTION);
    for slot in slots(client, DUE, &[&millis(policy.done), &quarter]).await? {
        match empty(client, slot, policy, started, &mut retained.longest_lock).await {
            Ok(Some((done, dead))) => {
                retained.done += done;
                retained.dead += dead;
            }
            Ok(None) => break,
            Err(e) if is_lock_timeout(&e) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The slots a statement answers (its `slot` column).
async fn slots(
    client: &Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<i16>, StoreError> {
    client
        .query(sql, params)
        .await
        .map_err(db_error)?
        .iter()
        .map(|row| get(row, "slot"))
        .collect()
}

/// Seals the current slot and opens the next empty one, if the current slot opened
/// `age` ago or earlier. A ring with no empty slot (emptying is behind) does not turn:
/// the current slot keeps taking keys, and the backlog says why. The lock's hold is added
/// to `longest`.
async fn turn(
    client: &mut Object,
    age: Duration,
    longest: &mut Duration,
) -> Result<(), StoreError> {
    let age = millis(age);
    let due: bool = get(
        &client
            .query_one(TURN_DUE, &[&age])
            .await
            .map_err(db_error)?,
        "due",
    )?;
    if !due {
        return Ok(());
    }
    let (tx, since) = locked!(client)?;
    let Some(sealed) = tx.query_opt(SEAL, &[&age]).await.map_err(db_error)? else {
        return tx.rollback().await.map_err(db_error);
    };
    let sealed: i16 = get(&sealed, "slot")?;
    tx.execute(OPEN, &[&sealed]).await.map_err(db_error)?;
    tx.commit().await.map_err(db_error)?;
    *longest = (*longest).max(since.elapsed());
    Ok(())
}

/// Empties sealed slot `slot`: its keepers move to the keep slot, a megabyte or so per
/// transaction ([`MOVE_BYTES`]), with a pause of half each hold after it; the transaction that finds no keeper left truncates the
/// slot's two partitions, so nothing a keeper needs is ever truncated (no row enters a
/// sealed slot, no row changes while the lock is held, and the statements take their
/// snapshot after it). Answers the done rows and dead letters that went with the slot, as
/// counted before ([`expired`]), or `None` if an interval went by while keepers were
/// still moving (the next pass goes on). Each transaction's hold of the lock is added to
/// `longest`.
async fn empty(
    client: &mut Object,
    slot: i16,
    policy: &Retention,
    started: Instant,
    longest: &mut Duration,
) -> Result<Option<(u64, u64)>, StoreError> {
    let (done_ms, dead_ms) = (millis(policy.done), millis(policy.dead));
    let batch = i64::from(policy.batch.max(1));
    let (done, dead, estimate) = {
        // At most EXACT_UP_TO entries of each range: no statement deadline needed.
        let row = client
            .query_one(&expired(slot), &[&done_ms, &dead_ms, &EXACT_UP_TO])
            .await
            .map_err(db_error)?;
        let count = |column| get::<i64>(&row, column).map(|n| u64::try_from(n).unwrap_or(0));
        (count("done")?, count("dead")?, count("estimate")?)
    };
    if let Err(e) = hush(client, slot).await {
        // Best effort: the truncation tries all the same.
        if !is_lock_timeout(&e) {
            return Err(e);
        }
    }
    let mut moved_all = 0_u64;
    let quarter = millis(policy.done / TURNS_PER_RETENTION);
    loop {
        let (tx, since) = locked!(client)?;
        let due: bool = get(
            &tx.query_one(STILL_DUE, &[&slot, &done_ms, &quarter])
                .await
                .map_err(db_error)?,
            "due",
        )?;
        if !due {
            // Emptied by another node's pass (perhaps current again): nothing of it is ours.
            tx.rollback().await.map_err(db_error)?;
            return Ok(Some((0, 0)));
        }
        let row = tx
            .query_one(
                MOVE_KEEPERS,
                &[&slot, &done_ms, &dead_ms, &batch, &MOVE_BYTES, &KEEP_SLOT],
            )
            .await
            .map_err(db_error)?;
        let (looked, moved): (i64, i64) = (get(&row, "looked")?, get(&row, "moved")?);
        moved_all += u64::try_from(moved).unwrap_or(0);
        if looked < batch && moved == looked {
            // Every keeper is out (the lock is held): the rest goes with the partitions.
            // Their lock is asked for without waiting: a reader of the slot (a report, a
            // dump) or its autovacuum holds one the truncation must wait for, and every
            // claim would wait behind this transaction meanwhile. The lock error leaves
            // the slot for the next pass, which the backlog shows.
            tx.batch_execute(&format!(
                "LOCK TABLE webhook_events_s{slot}, webhook_attempts_s{slot}
                     IN ACCESS EXCLUSIVE MODE NOWAIT;
                 TRUNCATE webhook_events_s{slot}, webhook_attempts_s{slot};
                 ALTER TABLE webhook_events_s{slot}
                     RESET (autovacuum_enabled, toast.autovacuum_enabled);
                 ALTER TABLE webhook_attempts_s{slot}
                     RESET (autovacuum_enabled, toast.autovacuum_enabled)"
            ))
            .await
            .map_err(db_error)?;
            tx.execute(EMPTIED, &[&slot]).await.map_err(db_error)?;
            tx.commit().await.map_err(db_error)?;
            *longest = (*longest).max(since.elapsed());
            // A count that reached its cap is the planner's estimate of the slot's rows,
            // less the keepers that left it.
            let cap = u64::try_from(EXACT_UP_TO).unwrap_or(u64::MAX);
            let done = if done >= cap {
                done.max(estimate.saturating_sub(moved_all + dead))
            } else {
                done
            };
            return Ok(Some((done, dead)));
        }
        tx.commit().await.map_err(db_error)?;
        let held = since.elapsed();
        *longest = (*longest).max(held);
        // The moves pace themselves (below), so they may go on for a whole interval, not
        // only the budget the row-by-row deletes have.
        if started.elapsed() >= policy.interval {
            return Ok(None);
        }
        // Claims run freely for half as long as the move held them: a slot with thousands
        // of big keepers holds ingest two thirds of the time at most while it empties, and
        // no claim waits longer than one move.
        tokio::time::sleep(held / 2).await;
    }
}

/// Turns autovacuum off for due slot `slot`'s partitions and their TOAST until it is
/// emptied (the truncation turns it back on): the moves leave dead tuples that start an
/// autovacuum of the slot, and a vacuum of its TOAST (gigabytes after an outage of big
/// dead letters) held a lock the truncation cannot take without waiting, so the slot stayed
/// sealed and the ring could not turn for as long. Nothing is worth vacuuming in a slot
/// about to be truncated. A running autovacuum gives way to this request after
/// `deadlock_timeout`; the request waits at most [`HUSH_WAIT`], and claims never wait
/// behind it.
async fn hush(client: &mut Object, slot: i16) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(db_error)?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {};
         ALTER TABLE webhook_events_s{slot}
             SET (autovacuum_enabled = false, toast.autovacuum_enabled = false);
         ALTER TABLE webhook_attempts_s{slot}
             SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)",
        millis(HUSH_WAIT)
    ))
    .await
    .map_err(db_error)?;
    tx.commit().await.map_err(db_error)
}

/// One ask of [`locked!`].
async fn lock_once(
    client: &mut Object,
) -> Result<(deadpool_postgres::Transaction<'_>, Instant), StoreError> {
    let tx = client.transaction().await.map_err(db_error)?;
    // Its commit does not wait for the WAL's flush, which every claim would wait out behind
    // the lock: a move's megabyte on a disk busy writing back the outage that left the
    // keepers took hundreds of ms, up to a second. A crash may then lose the step, never
    // half of it: the ring is as it was before the step, and whatever a later transaction
    // did on top of the step was flushed with it, the WAL being one sequence. (A
    // truncation's commit is flushed all the same: Postgres does so for any transaction
    // that removes files.)
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}; SET LOCAL synchronous_commit = off; {LOCK}",
        millis(RING_LOCK_TIMEOUT)
    ))
    .await
    .map_err(db_error)?;
    Ok((tx, Instant::now()))
}

/// Deletes batches of `status` rows older than `age` — in slot `slot`, or in any slot —
/// until a batch comes back short or the pass's budget is spent; adds them to `count`.
async fn sweep_rows(
    client: &Object,
    slot: Option<i16>,
    (status, age): (&str, Duration),
    policy: &Retention,
    started: Instant,
    count: &mut u64,
) -> Result<(), StoreError> {
    let (batch, age) = (i64::from(policy.batch.max(1)), millis(age));
    loop {
        let row = match &slot {
            Some(slot) => {
                client
                    .query_one(SWEEP_SLOT, &[slot, &status, &age, &batch])
                    .await
            }
            None => client.query_one(SWEEP, &[&status, &age, &batch]).await,
        }
        .map_err(db_error)?;
        let deleted: i64 = get(&row, "deleted")?;
        *count += u64::try_from(deleted).unwrap_or(0);
        if deleted < batch || started.elapsed() >= policy.budget {
            return Ok(());
        }
    }
}
