//! The keepers scenario's own view of the Postgres store, on a connection of its own beside
//! the node's: the ring's state (`hookgate_slots`), where the dead letters are, the done rows
//! past retention, and the clock moved forward a turn at a time, as the tests' `advance_clock`
//! does. It writes nothing but the clock's instants; it never takes the tables' lock.

use std::time::Duration;

/// A direct connection to the run's schema.
pub struct RingDb {
    client: tokio_postgres::Client,
    schema: String,
}

/// The ring's slots by state, in slot order; `row_by_row` slots (a table of an earlier
/// version) are marked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ring {
    pub current: Option<i16>,
    pub sealed: Vec<i16>,
    pub empty: Vec<i16>,
    /// Slots in any other state, as `slot:state` (none while the schema's check holds).
    pub other: Vec<String>,
    pub row_by_row: Vec<i16>,
}

impl Ring {
    /// `current=2 sealed=0r,1 empty=3,4,5` (`r`: emptied row by row).
    pub fn line(&self) -> String {
        let list = |slots: &[i16]| -> String {
            let each: Vec<String> = slots
                .iter()
                .map(|s| match self.row_by_row.contains(s) {
                    true => format!("{s}r"),
                    false => s.to_string(),
                })
                .collect();
            match each.is_empty() {
                true => "-".into(),
                false => each.join(","),
            }
        };
        let current = self.current.map_or("-".into(), |s| s.to_string());
        let other = match self.other.is_empty() {
            true => String::new(),
            false => format!(" other={}", self.other.join(",")),
        };
        format!(
            "current={current} sealed={} empty={}{other}",
            list(&self.sealed),
            list(&self.empty)
        )
    }
}

/// What one look at the store found.
#[derive(Debug, Clone, Default)]
pub struct Look {
    pub ring: Ring,
    /// Dead letters by slot, in slot order.
    pub dead: Vec<(i16, u64)>,
    /// Done rows done longer than retention.done ago, still there.
    pub past_retention: u64,
}

impl Look {
    /// Every dead letter, wherever it is.
    pub fn dead_letters(&self) -> u64 {
        self.dead.iter().map(|(_, n)| n).sum()
    }

    /// Whether the dead letters are moving: some in the keep slot, some still elsewhere.
    pub fn moving(&self) -> bool {
        let kept = |slot: i16| slot == KEEP_SLOT;
        self.dead.iter().any(|(s, _)| kept(*s)) && self.dead.iter().any(|(s, _)| !kept(*s))
    }

    /// `1:300` (slot:dead letters), or `-`.
    pub fn dead_line(&self) -> String {
        let each: Vec<String> = self.dead.iter().map(|(s, n)| format!("{s}:{n}")).collect();
        match each.is_empty() {
            true => "-".into(),
            false => each.join(","),
        }
    }
}

/// The keep slot: where the emptying moves the rows a slot must keep.
const KEEP_SLOT: i16 = 6;

/// The ring, read without a lock (a plain read sees the state the last ring transaction
/// committed).
const RING: &str = "SELECT slot, state, row_by_row FROM hookgate_slots ORDER BY slot";

/// Dead letters by slot: a range of the `(status, updated_at)` index of each partition.
const DEAD: &str = "
SELECT slot, count(*) FROM webhook_events WHERE status = 'dead' GROUP BY slot ORDER BY slot";

/// Done rows past `$1` ms (retention.done): a range of the same index. A plain read: it
/// takes each partition's `ACCESS SHARE` lock for a moment, which an emptying's truncation
/// (asked `NOWAIT`) may meet, and then leaves that slot for the node's next pass.
const PAST_RETENTION: &str = "
SELECT count(*) FROM webhook_events
WHERE status = 'done' AND updated_at < now() - $1::bigint * interval '1 millisecond'";

/// Moves the store's clock forward by `$1` ms for the final rows still inside their
/// retention (`$2` ms for done rows, `$3` for dead letters) — a row past it stays past it,
/// and a row not yet final is seconds old and changes under the node — then for the ring's
/// slots (`age_ring`'s statement). The events first: a ring transaction locks them and
/// then writes `hookgate_slots`, so taking them in the other order could deadlock with it.
/// The events' update takes their `ROW EXCLUSIVE` lock (it waits while a ring transaction
/// holds theirs, and a ring transaction waits for it) and row locks on rows the node no
/// longer writes; it lasts the few milliseconds a retention's worth of small rows takes.
const AGE: &str = "
UPDATE webhook_events SET
    created_at = created_at - $1::bigint * interval '1 millisecond',
    updated_at = updated_at - $1::bigint * interval '1 millisecond'
WHERE (status = 'done' AND updated_at > now() - $2::bigint * interval '1 millisecond')
   OR (status = 'dead' AND updated_at > now() - $3::bigint * interval '1 millisecond')";
const AGE_RING: &str = "
UPDATE hookgate_slots SET
    opened_at = opened_at - $1::bigint * interval '1 millisecond',
    sealed_at = sealed_at - $1::bigint * interval '1 millisecond'";

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).expect("a duration of sane size")
}

impl RingDb {
    /// Connects to the schema the node uses (after its migration).
    pub async fn connect(url: &str, schema: &str) -> Self {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to Postgres directly");
        actix_rt::spawn(connection);
        client
            .batch_execute(&format!("SET search_path TO {schema}"))
            .await
            .expect("the run's schema");
        Self {
            client,
            schema: schema.to_owned(),
        }
    }

    /// The ring, the dead letters and the done rows past `done`.
    pub async fn look(&self, done: Duration) -> Look {
        let mut ring = Ring::default();
        for row in self.client.query(RING, &[]).await.expect("hookgate_slots") {
            let (slot, state, row_by_row): (i16, String, bool) =
                (row.get(0), row.get(1), row.get(2));
            match state.as_str() {
                "current" => ring.current = Some(slot),
                "sealed" => ring.sealed.push(slot),
                "empty" => ring.empty.push(slot),
                other => ring.other.push(format!("{slot}:{other}")),
            }
            if row_by_row {
                ring.row_by_row.push(slot);
            }
        }
        let dead = self
            .client
            .query(DEAD, &[])
            .await
            .expect("the dead letters")
            .iter()
            .map(|r| (r.get(0), u64::try_from(r.get::<_, i64>(1)).unwrap_or(0)))
            .collect();
        let past: i64 = self
            .client
            .query_one(PAST_RETENTION, &[&ms(done)])
            .await
            .expect("rows past retention")
            .get(0);
        Look {
            ring,
            dead,
            past_retention: u64::try_from(past).unwrap_or(0),
        }
    }

    /// Dead letters and the bytes their payloads take in the table (after compression: a
    /// payload that compressed would move for nothing).
    pub async fn dead_letters(&self) -> (u64, u64) {
        let row = self
            .client
            .query_one(
                "SELECT count(*), coalesce(sum(pg_column_size(payload)), 0)::bigint
                 FROM webhook_events WHERE status = 'dead'",
                &[],
            )
            .await
            .expect("count the dead letters");
        let n = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        (n(0), n(1))
    }

    /// Moves the clock forward by `by` ([`AGE`]), in one transaction.
    pub async fn age(&mut self, by: Duration, done: Duration, dead: Duration) {
        let tx = self.client.transaction().await.expect("begin the aging");
        tx.execute(AGE, &[&ms(by), &ms(done), &ms(dead)])
            .await
            .expect("age the rows");
        tx.execute(AGE_RING, &[&ms(by)])
            .await
            .expect("age the ring");
        tx.commit().await.expect("commit the aging");
    }

    /// Drops the run's schema.
    pub async fn drop_schema(&self) {
        let _ = self
            .client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await;
    }
}
