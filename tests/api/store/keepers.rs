//! What the ring keeps cannot stall it (docs/design.md, "Storage over time"): the rows that
//! outlive their slot — dead letters, rows not yet final, done rows inside retention — move
//! once to the keep slot, a megabyte or so per transaction, and never again; a slot whose
//! emptying fails leaves the ring turning and the pass saying so.

use std::time::Duration;

use hookgate::claim::ClaimResult;
use hookgate::key::EventId;

use super::{claims_wait_for_the_lease_then_see_it_done, retain, retention, turn};
use crate::helpers::{spawn_app_with, Behaviour, TestDb, PROVIDER};

/// The keep slot: the partition no emptying truncates.
const KEEP: i16 = 6;

/// `(key, xmin, payload bytes)` of `PROVIDER`'s rows in slot `slot`: the transaction that
/// last wrote each row, so a row moved (rewritten) again shows a new one.
async fn rows_in(db: &TestDb, slot: i16) -> Vec<(String, String, i64)> {
    let text = format!(
        "SELECT event_key, xmin::text, COALESCE(octet_length(payload), 0)::bigint
         FROM webhook_events WHERE provider = '{PROVIDER}' AND slot = {slot}
         ORDER BY event_key"
    );
    db.try_query(&text)
        .await
        .expect("the slot's rows")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Ten dead letters of 600 kB each (6 MB in all) left by a target answering 400, then the
/// ring aged past their slot's time: the emptying moves them to the keep slot in more than
/// one transaction, none carrying more than 1 MiB but for its first row (the old emptying
/// moved `sweep_batch` rows in one transaction, whatever their size, while every claim
/// waited: a thousand of 1 MiB outlasted the store deadline and the ring never turned
/// again). Later turns and emptyings never rewrite them, and each is still replayable
/// from its row.
#[actix_web::test]
async fn big_dead_letters_move_once_to_the_keep_slot_a_few_megabytes_at_a_time() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    app.target.set(Behaviour::Status(400));
    let pad = "x".repeat(600_000);
    for i in 0..10 {
        let body = format!(r#"{{"id":"big{i}","pad":"{pad}"}}"#);
        let answer = app.deliver(&format!("big{i}"), &body).await;
        assert_eq!(answer.body, r#"{"status":"dead_lettered"}"#);
    }
    assert_eq!(app.db.count_status("dead").await, 10);
    app.db.advance_clock(retention().done + turn()).await;
    let retained = retain(&app.store).await;
    assert_eq!(retained.failed, None);
    let kept = rows_in(&app.db, KEEP).await;
    assert_eq!(kept.len(), 10, "{:?}", app.db.ring().await);
    let mut batches: std::collections::BTreeMap<&str, (i64, usize)> = Default::default();
    for (_, xmin, bytes) in &kept {
        let batch = batches.entry(xmin.as_str()).or_default();
        batch.0 += bytes;
        batch.1 += 1;
    }
    assert!(batches.len() >= 2, "{batches:?}");
    for (xmin, (bytes, rows)) in &batches {
        assert!(
            *rows == 1 || *bytes <= 1 << 20,
            "transaction {xmin} moved {rows} rows of {bytes} bytes"
        );
    }
    // Two more turns and emptyings of the slots after it (the ring's clock: moving the
    // rows' times would rewrite them): the keep slot is not theirs.
    for _ in 0..2 {
        app.db.age_ring(turn()).await;
        assert_eq!(retain(&app.store).await.failed, None);
    }
    assert_eq!(rows_in(&app.db, KEEP).await, kept, "moved again");
    app.target.set(Behaviour::Accept);
    let replayed = app
        .store
        .replay(&EventId::new(PROVIDER, "big3"), Duration::from_secs(30))
        .await
        .expect("a replay");
    assert!(replayed.is_some(), "the dead letter is replayable");
}

/// A slot whose emptying the database refuses (here a trigger on its partition; in the
/// field, a move outlasting the store deadline): the pass says so in `failed`, and goes
/// on — the ring still turns while empty slots last, and the backlog is read — instead of
/// returning at the first error, which left the ring on one slot for good. Once the cause
/// is gone, the next pass empties it.
#[actix_web::test]
async fn an_emptying_that_fails_leaves_the_ring_turning_and_the_pass_saying_so() {
    let app = spawn_app_with(|c| c.cache.capacity = 0).await;
    app.target.set(Behaviour::Status(400));
    app.deliver("stuck", r#"{"id":"stuck"}"#).await;
    let slot = app.db.slots_of(PROVIDER, "stuck").await[0];
    app.db.advance_clock(retention().done + turn()).await;
    app.db
        .execute(&format!(
            "CREATE FUNCTION refuse_move() RETURNS trigger LANGUAGE plpgsql
                 AS $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
             CREATE TRIGGER refuse BEFORE UPDATE ON webhook_events_s{slot}
                 FOR EACH ROW EXECUTE FUNCTION refuse_move();"
        ))
        .await;
    let retained = retain(&app.store).await;
    let failed = retained.failed.clone().unwrap_or_default();
    assert!(failed.contains("refused by the test"), "{retained:?}");
    let first = app.db.current_slot().await;
    assert_ne!(first, slot, "the ring turned: {:?}", app.db.ring().await);
    // The slot's autovacuum is off while it waits to be emptied: a vacuum of the moves'
    // dead tuples would hold a lock its truncation does not wait for.
    assert_eq!(
        autovacuum(&app.db, slot).await,
        Some("autovacuum_enabled=false".to_owned())
    );
    // Another turn's time: the slot still cannot be emptied, and the ring turns again.
    app.db.age_ring(turn()).await;
    let retained = retain(&app.store).await;
    assert!(retained.failed.is_some(), "{retained:?}");
    assert!(!retained.backlog.is_zero(), "{retained:?}");
    let second = app.db.current_slot().await;
    assert!(
        second != first && second != slot,
        "{:?}",
        app.db.ring().await
    );
    assert_eq!(app.db.slots_of(PROVIDER, "stuck").await, vec![slot]);
    app.db
        .execute(&format!("DROP TRIGGER refuse ON webhook_events_s{slot}"))
        .await;
    let retained = retain(&app.store).await;
    assert_eq!(retained.failed, None);
    assert_eq!(app.db.slots_of(PROVIDER, "stuck").await, vec![KEEP]);
    let ring = app.db.ring().await;
    assert!(ring.contains(&(slot, "empty".to_owned())), "{ring:?}");
    assert_eq!(
        autovacuum(&app.db, slot).await,
        None,
        "back on once emptied"
    );
}

/// The `autovacuum_enabled` setting of slot `slot`'s events partition, if it has one.
async fn autovacuum(db: &TestDb, slot: i16) -> Option<String> {
    let text = format!(
        "SELECT o FROM pg_class, unnest(reloptions) o
         WHERE oid = 'webhook_events_s{slot}'::regclass AND o LIKE 'autovacuum_enabled=%'"
    );
    db.try_query(&text)
        .await
        .expect("the partition's options")
        .first()
        .map(|r| r.get(0))
}

/// A row whose lease is live when its slot is emptied moves to the keep slot under the
/// lease: claims meanwhile see it in progress, its attempt's outcome finds it there, and
/// it is answered done afterwards; the key is never in two slots.
#[actix_web::test]
async fn a_keeper_moved_while_its_lease_is_live_keeps_its_lease_and_its_outcome() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let id = EventId::new(PROVIDER, "leased");
    let lease = Duration::from_secs(600);
    let won = store.claim(&id, None, lease, None).await.unwrap();
    let ClaimResult::Won { attempts, .. } = won else {
        panic!("the first claim wins: {won:?}");
    };
    // The ring's clock only: the lease is still live when the slot is emptied.
    db.age_ring(retention().done + turn()).await;
    assert_eq!(retain(&store).await.failed, None);
    assert_eq!(db.slots_of(PROVIDER, "leased").await, vec![KEEP]);
    claims_wait_for_the_lease_then_see_it_done(&store, &id, attempts, lease).await;
    assert_eq!(db.status(PROVIDER, "leased").await.as_deref(), Some("done"));
    assert_eq!(db.keys_in_two_slots().await, Vec::<String>::new());
}
