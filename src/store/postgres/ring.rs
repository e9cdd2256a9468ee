//! The slot ring's upkeep (docs/design.md, "Storage over time"): turning the ring, emptying
//! a slot whose rows are past retention (its keepers moved to the current slot, then both
//! of its partitions truncated), and the row-by-row retention of a slot that came from an
//! upgraded table. Every change of the ring's state runs in a short transaction holding
//! the `EXCLUSIVE` lock of the events and their history, so no claim runs across it.

use std::time::{Duration, Instant};

use deadpool_postgres::Object;

use super::pool::Inner;
use super::rows::{db_error, get, is_lock_timeout};
use super::sql::SWEEP;
use crate::store::retain::{Retained, Retention};
use crate::store::{millis, StoreError};

/// How many turns of the ring one `retention.done` takes: the current slot is sealed a
/// quarter of it after it opened, so a done row is kept between `retention.done` and
/// `retention.done` plus a quarter (the table's size swings by about ±11 % around its mean).
pub(crate) const TURNS_PER_RETENTION: u32 = 4;

/// How long a ring transaction waits for the table's lock before it gives up until the
/// next pass: every claim waits behind the lock request meanwhile, so this bounds the
/// pause a turn can put on ingest when a long write (a claim stuck on a row lock) holds
/// the table.
const RING_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

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

/// Moves at most `$4` of the rows slot `$1` must keep to the current slot, with their
/// history: every row not yet final, a done row done within `$2` ms, a dead letter dead
/// within `$3` ms. Each part is a range of the slot's (status, updated_at) index, so
/// finding them costs what they are, not what the slot holds. Answers how many moved.
const MOVE_KEEPERS: &str = "
WITH current AS (SELECT slot FROM hookgate_slots WHERE state = 'current'),
keep AS (
    (SELECT provider, event_key FROM webhook_events
     WHERE slot = $1 AND status IN ('queued', 'in_progress', 'failed'))
    UNION ALL
    (SELECT provider, event_key FROM webhook_events
     WHERE slot = $1 AND status = 'done'
       AND updated_at > now() - $2::bigint * interval '1 millisecond')
    UNION ALL
    (SELECT provider, event_key FROM webhook_events
     WHERE slot = $1 AND status = 'dead'
       AND updated_at > now() - $3::bigint * interval '1 millisecond')
    LIMIT $4),
moved AS (
    UPDATE webhook_events e SET slot = (SELECT slot FROM current)
    FROM keep k
    WHERE e.slot = $1 AND e.provider = k.provider AND e.event_key = k.event_key
    RETURNING e.provider, e.event_key),
history AS (
    UPDATE webhook_attempts a SET slot = (SELECT slot FROM current)
    FROM moved m
    WHERE a.slot = $1 AND a.provider = m.provider AND a.event_key = m.event_key)
SELECT count(*)::bigint AS moved FROM moved";

/// What emptying slot `slot` will remove, counted before its lock is taken (a sealed slot
/// gains no rows, so the count holds unless a row changes meanwhile): its done rows done
/// `$1` ms ago or earlier and its dead letters dead `$2` ms ago or earlier. Two ranges of
/// the slot's partition's `(status, updated_at)` index, read while claims go on; nothing
/// per row is written. Asked of the partition by name: the same count asked of the
/// partitioned table (`slot = $1`, one `FILTER` per status) took four times as long at
/// 45 000 rows (some 40 against 10 ms), the largest part of an emptying's CPU.
fn expired(slot: i16) -> String {
    format!(
        "SELECT (SELECT count(*) FROM webhook_events_s{slot}
                 WHERE status = 'done'
                   AND updated_at <= now() - $1::bigint * interval '1 millisecond') AS done,
                (SELECT count(*) FROM webhook_events_s{slot}
                 WHERE status = 'dead'
                   AND updated_at <= now() - $2::bigint * interval '1 millisecond') AS dead"
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
    /// row-by-row slots lose their expired rows for as long as the budget lasts. A ring
    /// transaction that cannot have the table's lock in time is left for the next pass
    /// (the backlog says so). Answers the rows removed and how late retention is.
    pub(crate) async fn retain_ring(&self, policy: &Retention) -> Result<Retained, StoreError> {
        let started = Instant::now();
        let mut client = self.client().await?;
        let mut retained = Retained::default();
        let quarter = policy.done / TURNS_PER_RETENTION;
        // Emptying first frees a slot for the turn; a slot the turn sealed late may be due
        // at once.
        empty_due(&mut client, policy, started, &mut retained).await?;
        // Passes come every `policy.interval`: the ring turns at the pass nearest a turn's
        // age, not at the first one past it, which would come most of an interval late at
        // nearly every turn (a slot opens during a pass and is asked about a turn's age
        // later, before that pass's work). Sealing early is safe: a slot is emptied
        // `retention.done` after it was sealed, or after a turn if that is sooner.
        let seal_at = quarter.saturating_sub(policy.interval / 2);
        match turn(&mut client, seal_at).await {
            Err(e) if !is_lock_timeout(&e) => return Err(e),
            _ => {}
        }
        empty_due(&mut client, policy, started, &mut retained).await?;
        // The done rows of a slot from an upgraded table go one by one until it is
        // emptied; dead letters, the exception, go one by one wherever they are, when
        // their own retention ends rather than with their slot.
        let row_by_row = slots(&client, ROW_BY_ROW, &[]).await?;
        for &slot in &row_by_row {
            let done = ("done", policy.done);
            sweep_rows(
                &client,
                Some(slot),
                done,
                policy,
                started,
                &mut retained.done,
            )
            .await?;
        }
        let dead = ("dead", policy.dead);
        sweep_rows(&client, None, dead, policy, started, &mut retained.dead).await?;
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
        Ok(retained)
    }
}

/// Empties every sealed slot whose time is up ([`DUE`]), oldest first, and adds what went
/// with them to `retained`. A slot whose locks could not be had in time (the tables'
/// within [`RING_LOCK_TIMEOUT`], its partitions' at once), or whose keepers outlast the
/// pass's budget, is left for the next pass with those after it.
async fn empty_due(
    client: &mut Object,
    policy: &Retention,
    started: Instant,
    retained: &mut Retained,
) -> Result<(), StoreError> {
    let quarter = millis(policy.done / TURNS_PER_RETENTION);
    for slot in slots(client, DUE, &[&millis(policy.done), &quarter]).await? {
        match empty(client, slot, policy, started).await {
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
/// the current slot keeps taking keys, and the backlog says why.
async fn turn(client: &mut Object, age: Duration) -> Result<(), StoreError> {
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
    let tx = locked(client).await?;
    let Some(sealed) = tx.query_opt(SEAL, &[&age]).await.map_err(db_error)? else {
        return tx.rollback().await.map_err(db_error);
    };
    let sealed: i16 = get(&sealed, "slot")?;
    tx.execute(OPEN, &[&sealed]).await.map_err(db_error)?;
    tx.commit().await.map_err(db_error)
}

/// Empties sealed slot `slot`: its keepers move to the current slot a batch per
/// transaction; the transaction that finds fewer keepers than a batch moves them and
/// truncates the slot's two partitions, so nothing a keeper needs is ever truncated (no
/// row enters a sealed slot, no row changes while the lock is held, and the statements
/// take their snapshot after it). Answers the done rows and dead letters that went with
/// the slot, as counted before ([`expired`]), or `None` if the pass's budget ran out
/// while keepers were still moving (the next pass goes on).
async fn empty(
    client: &mut Object,
    slot: i16,
    policy: &Retention,
    started: Instant,
) -> Result<Option<(u64, u64)>, StoreError> {
    let (done_ms, dead_ms) = (millis(policy.done), millis(policy.dead));
    let batch = i64::from(policy.batch.max(1));
    let counted = {
        // One read of the slot's partition: no statement deadline, any plan.
        let tx = client.transaction().await.map_err(db_error)?;
        tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL enable_seqscan = on")
            .await
            .map_err(db_error)?;
        let row = tx
            .query_one(&expired(slot), &[&done_ms, &dead_ms])
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        let count = |column| get::<i64>(&row, column).map(|n| u64::try_from(n).unwrap_or(0));
        (count("done")?, count("dead")?)
    };
    let quarter = millis(policy.done / TURNS_PER_RETENTION);
    loop {
        let tx = locked(client).await?;
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
        let moved: i64 = get(
            &tx.query_one(MOVE_KEEPERS, &[&slot, &done_ms, &dead_ms, &batch])
                .await
                .map_err(db_error)?,
            "moved",
        )?;
        if moved < batch {
            // Every keeper is out (the lock is held): the rest goes with the partitions.
            // Their lock is asked for without waiting: a reader of the slot (a report, a
            // dump) or its autovacuum holds one the truncation must wait for, and every
            // claim would wait behind this transaction meanwhile. The lock error leaves
            // the slot for the next pass, which the backlog shows.
            tx.batch_execute(&format!(
                "LOCK TABLE webhook_events_s{slot}, webhook_attempts_s{slot}
                     IN ACCESS EXCLUSIVE MODE NOWAIT;
                 TRUNCATE webhook_events_s{slot}, webhook_attempts_s{slot}"
            ))
            .await
            .map_err(db_error)?;
            tx.execute(EMPTIED, &[&slot]).await.map_err(db_error)?;
            tx.commit().await.map_err(db_error)?;
            return Ok(Some(counted));
        }
        tx.commit().await.map_err(db_error)?;
        if started.elapsed() >= policy.budget {
            return Ok(None);
        }
    }
}

/// A transaction holding the events' and their history's `EXCLUSIVE` lock, or the lock
/// timeout's error if it could not be had within [`RING_LOCK_TIMEOUT`].
async fn locked(client: &mut Object) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    let tx = client.transaction().await.map_err(db_error)?;
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {}; {LOCK}",
        millis(RING_LOCK_TIMEOUT)
    ))
    .await
    .map_err(db_error)?;
    Ok(tx)
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
