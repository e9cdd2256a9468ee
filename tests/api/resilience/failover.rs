//! Postgres failover under load, on a real primary + synchronous standby pair
//! (`scripts/pg-ha.sh`, one pair per test) reached through a multi-host URL: nothing
//! acknowledged is lost, nothing runs twice, no store deadline is overrun, the node never
//! holds more backends than its pool, and service comes back without a restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use hookgate::claim::Mode;
use hookgate::config::Config;
use hookgate::key::EventId;
use hookgate::worker::HttpDelivery;

use crate::helpers::{
    base_config, eventually, start_node, Behaviour, HaPair, TestApp, TestDb, TestTarget, PROVIDER,
};

/// The store deadline of every node here: short, so an overrun shows.
const DEADLINE: Duration = Duration::from_millis(500);

/// How much later than [`DEADLINE`] an answer may come: the HTTP round trip, admission,
/// a claim batch that started just before this one's call, and a busy machine. Generous on
/// purpose: what it catches is a hang (a commit that waits for a lost standby never
/// returns), not slowness.
const SLACK: Duration = Duration::from_millis(4500);

/// The queue-mode provider beside the sync one ([`PROVIDER`]).
const QUEUED: &str = "queued";

/// Sync mode's rule with room for a promotion inside the lease: target timeout 5 s < lease
/// 15 s < first backoff 20 s; outcome writes are retried within the lease.
fn failover_config(c: &mut Config) {
    // A worker for every event a test holds at the target, whichever shard it hashes to.
    c.server.workers_per_shard = 16;
    c.store.statement_timeout = Some(DEADLINE);
    c.store.pool_timeout = Duration::from_secs(1);
    c.lease.duration = Duration::from_secs(15);
    c.retry.base = Duration::from_secs(20);
    c.providers[0].target.timeout = Duration::from_secs(5);
    c.queue.poll_interval = Duration::from_millis(100);
    let mut queued = c.providers[0].clone();
    queued.name = QUEUED.into();
    queued.mode = Some(Mode::Queue);
    c.providers.push(queued);
}

/// A node on `url` (a schema of its own), with `edit` applied after [`failover_config`].
async fn node_on(pair: &HaPair, url: String, edit: impl FnOnce(&mut Config)) -> TestApp {
    let db = TestDb::on_url(&pair.url).await;
    let target = TestTarget::start().await;
    let mut config = base_config(&db, &target);
    failover_config(&mut config);
    config.store.url = url;
    edit(&mut config);
    start_node(db, target, config, Arc::new(HttpDelivery)).await
}

async fn enqueue(app: &TestApp, key: &str) -> crate::helpers::Answer {
    app.post(
        &format!("/webhooks/{QUEUED}"),
        &[("X-Idempotency-Key", key)],
        "{}".into(),
    )
    .await
}

/// The row's status as the node's own store reads it (through the multi-host URL).
async fn status(app: &TestApp, provider: &str, key: &str) -> Option<String> {
    let row = app.store.lookup(&EventId::new(provider, key)).await.ok()?;
    row.map(|r| r.status.as_str().to_owned())
}

/// Rows of `schema` with `status`, read on the server at `url` directly.
async fn keys_with(url: &str, schema: &str, status: &str) -> Vec<String> {
    let client = HaPair::connect(url).await;
    let rows = client
        .query(
            &format!(
                "SELECT provider || ':' || event_key FROM {schema}.webhook_events \
                 WHERE status = $1 ORDER BY 1"
            ),
            &[&status],
        )
        .await
        .expect("read rows");
    rows.iter().map(|r| r.get(0)).collect()
}

/// A delivery answered within the deadline and its slack: 503 `store_unavailable`.
async fn refused_in_time(app: &TestApp, key: &str) {
    let sent = Instant::now();
    let answer = app.deliver(key, "{}").await;
    let took = sent.elapsed();
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.path, "store_unavailable", "{answer:?}");
    assert!(
        took < DEADLINE + SLACK,
        "answered after {took:?}, past the {DEADLINE:?} deadline"
    );
}

#[actix_web::test]
async fn events_in_flight_in_both_modes_when_the_primary_dies_end_done_once_on_the_new_primary() {
    let pair = HaPair::start().await;
    let app = node_on(&pair, pair.url.clone(), |_| {}).await;
    let schema = app.db.schema.clone();

    // Acknowledged before the failover: done rows the new primary must hold.
    let mut acknowledged = Vec::new();
    for i in 0..3 {
        let key = format!("evt_before_{i}");
        assert_eq!(app.deliver(&key, "{}").await.status, 201);
        acknowledged.push(format!("{PROVIDER}:{key}"));
        let key = format!("q_before_{i}");
        assert_eq!(enqueue(&app, &key).await.status, 202);
        eventually("a queued event to be done", || async {
            status(&app, QUEUED, &key).await.as_deref() == Some("done")
        })
        .await;
        acknowledged.push(format!("{QUEUED}:{key}"));
    }

    // In flight when the primary dies: held at the target.
    app.target.set(Behaviour::Hang);
    let sync_keys: Vec<String> = (0..4).map(|i| format!("evt_flight_{i}")).collect();
    let queue_keys: Vec<String> = (0..4).map(|i| format!("q_flight_{i}")).collect();
    for key in &queue_keys {
        assert_eq!(enqueue(&app, key).await.status, 202);
    }
    let sync_answers = join_all(sync_keys.iter().map(|k| app.deliver(k, "{}")));
    let failover = async {
        for key in &sync_keys {
            app.target.wait_for(&TestApp::idem(key), 1).await;
        }
        for key in &queue_keys {
            app.target.wait_for(&format!("{QUEUED}:{key}"), 1).await;
        }
        pair.kill_first().await;
        // The window: no primary. Answers come within the deadline; /readyz says so.
        refused_in_time(&app, "evt_window").await;
        eventually("/readyz to report the store unavailable", || async {
            app.get("/readyz").await.status == 503
        })
        .await;
        // The target answers now: every outcome write meets no primary and is retried.
        app.target.release();
        eventually("an outcome write to be retried", || async {
            app.log.count("webhook.record_retry") > 0
        })
        .await;
        pair.promote().await;
        eventually("/readyz once the standby is promoted", || async {
            app.get("/readyz").await.status == 200
        })
        .await;
    };
    let (answers, ()) = futures_util::join!(sync_answers, failover);

    for (key, answer) in sync_keys.iter().zip(&answers) {
        assert_eq!(answer.status, 201, "{key}: {answer:?}");
        assert_eq!(answer.path, "first_run", "{key}");
    }
    for key in &queue_keys {
        eventually(&format!("{key} to be done"), || async {
            status(&app, QUEUED, key).await.as_deref() == Some("done")
        })
        .await;
    }
    let back = app.deliver("evt_window", "{}").await;
    assert_eq!((back.status, back.path.as_str()), (201, "first_run"));

    let done = keys_with(&pair.second_url, &schema, "done").await;
    for key in &acknowledged {
        assert!(done.contains(key), "{key} acknowledged done, not done now");
    }
    let delivered = sync_keys
        .iter()
        .map(|k| TestApp::idem(k))
        .chain(queue_keys.iter().map(|k| format!("{QUEUED}:{k}")))
        .chain(acknowledged.iter().cloned())
        .chain([TestApp::idem("evt_window")]);
    for key in delivered {
        assert_eq!(app.target.count(&key), 1, "{key} delivered once");
        assert!(done.contains(&key), "{key} is done on the new primary");
    }
}

#[actix_web::test]
async fn a_primary_waiting_for_a_lost_standby_costs_at_most_the_pool_and_recovers_by_itself() {
    const NAME: &str = "hookgate-ghost";
    // The senders' pool and the operators' (the node's pause poll reads on it).
    const POOL: usize = 2;
    const OPERATOR_POOL: usize = 1;
    let pair = HaPair::start().await;
    let app = node_on(&pair, pair.url_named(NAME), |c| {
        c.store.pool_size = POOL;
        c.store.operator_pool_size = OPERATOR_POOL;
        // A short lease: the claims a cancelled wait committed are retaken soon after.
        c.lease.duration = Duration::from_secs(2);
        c.retry.base = Duration::from_secs(3);
        c.providers[0].target.timeout = Duration::from_secs(1);
        c.providers[1].target.timeout = Duration::from_secs(1);
    })
    .await;
    assert_eq!(app.deliver("evt_before", "{}").await.status, 201);

    pair.require_ghost().await;
    let primary = &pair.first_url;
    let until = Instant::now() + Duration::from_secs(4);
    let sending = async {
        let mut n = 0;
        while Instant::now() < until {
            let keys: Vec<String> = (n..n + 4).map(|i| format!("evt_ghost_{i}")).collect();
            n += 4;
            join_all(keys.iter().map(|k| refused_in_time(&app, k))).await;
        }
    };
    // The node's backends, counted all along (not only between rounds of requests).
    let counting = async {
        let mut most = 0;
        while Instant::now() < until {
            most = most.max(HaPair::backends(primary, NAME).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    };
    let ((), most) = futures_util::join!(sending, counting);
    assert!(
        most <= (POOL + OPERATOR_POOL) as i64,
        "{most} backends of a node whose pools are {POOL} + {OPERATOR_POOL}"
    );
    // Nothing ran at the target while no commit completed.
    assert_eq!(app.target.total(), 1);
    // The database is still there for its operators.
    let superuser = HaPair::connect(primary).await;
    superuser.simple_query("SELECT 1").await.expect("a query");

    pair.release_ghost().await;
    eventually("service to resume by itself", || async {
        app.deliver("evt_after", "{}").await.status == 201
    })
    .await;
    // A claim whose wait was cancelled committed locally: its row is in progress and is
    // retaken once its lease has passed, then delivered once.
    eventually("a refused key to be delivered after its lease", || async {
        app.deliver("evt_ghost_0", "{}").await.status == 201
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_ghost_0")), 1);
    assert!(HaPair::backends(primary, NAME).await <= (POOL + OPERATOR_POOL) as i64);
}

#[actix_web::test]
async fn a_connection_to_a_server_turned_read_only_is_dropped_and_writes_reach_the_new_primary() {
    const NAME: &str = "hookgate-read-only";
    let pair = HaPair::start().await;
    let app = node_on(&pair, pair.url_named(NAME), |c| c.store.pool_size = 4).await;
    let schema = app.db.schema.clone();
    // Several pooled connections on the first server.
    let warm: Vec<String> = (0..8).map(|i| format!("evt_warm_{i}")).collect();
    for answer in join_all(warm.iter().map(|k| app.deliver(k, "{}"))).await {
        assert_eq!(answer.status, 201, "{answer:?}");
    }
    let pooled = HaPair::backends(&pair.first_url, NAME).await;
    assert!(
        pooled >= 2,
        "{pooled} pooled connections on the first server"
    );

    // A switchover that fences the old primary read-only and keeps it running.
    let first = HaPair::connect(&pair.first_url).await;
    for sql in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        first
            .batch_execute(sql)
            .await
            .expect("fence the first server");
    }
    pair.promote_second_keeping_first().await;

    let mut n = 0;
    eventually("a write to land on the new primary", || {
        n += 1;
        let key = format!("evt_moved_{n}");
        let app = &app;
        async move { app.deliver(&key, "{}").await.status == 201 }
    })
    .await;
    let done = keys_with(&pair.second_url, &schema, "done").await;
    assert!(done.contains(&TestApp::idem(&format!("evt_moved_{n}"))));
    // The first refusal retired every connection opened before it, not only its own: at
    // most one write met the read-only server, whatever the number pooled on it.
    let refused: Vec<_> = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.unavailable")
        .filter(|l| l["error"].as_str().is_some_and(|e| e.contains("read-only")))
        .collect();
    assert!(refused.len() <= 1, "{refused:#?}");
}

/// An operator's write (a pause) that meets the old primary fenced read-only retires the
/// connections opened before it, as a sender's write does: the next operator write opens
/// a connection that finds the new primary, instead of going back to the read-only server
/// for as long as the pooled connection lives.
#[actix_web::test]
async fn an_operator_write_refused_by_a_read_only_server_does_not_keep_its_connection() {
    let pair = HaPair::start().await;
    let db = TestDb::on_url(&pair.url).await;
    // One connection: the refused write's own is the only one the next write could reuse.
    let config = hookgate::config::StoreConfig {
        pool_size: 1,
        ..db.store_config()
    };
    let store = db.store_with(config).await;
    let operator = store.operator();
    operator
        .set_paused(PROVIDER, true)
        .await
        .expect("a write on the first primary");

    let first = HaPair::connect(&pair.first_url).await;
    for sql in [
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        first
            .batch_execute(sql)
            .await
            .expect("fence the first server");
    }
    pair.promote_second_keeping_first().await;

    let refused = operator.set_paused(PROVIDER, false).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("read-only")),
        "the pooled connection is on the fenced server: {refused:?}"
    );
    operator
        .set_paused(PROVIDER, false)
        .await
        .expect("the next operator write reaches the new primary");
    assert!(
        keys_paused(&pair.second_url, &db.schema).await.is_empty(),
        "the resume landed on the new primary"
    );
}

/// The providers paused in `schema`, read on the server at `url` directly.
async fn keys_paused(url: &str, schema: &str) -> Vec<String> {
    let client = HaPair::connect(url).await;
    let rows = client
        .query(
            &format!("SELECT provider FROM {schema}.hookgate_paused"),
            &[],
        )
        .await
        .expect("paused providers");
    rows.iter().map(|r| r.get(0)).collect()
}

#[actix_web::test]
async fn a_commit_whose_standby_wait_was_cancelled_is_never_taken_for_a_confirmed_one() {
    const NAME: &str = "hookgate-unconfirmed";
    let pair = HaPair::start().await;
    // A deadline long enough for the test to cancel the wait before it passes.
    let app = node_on(&pair, pair.url_named(NAME), |c| {
        c.store.statement_timeout = Some(Duration::from_secs(5));
    })
    .await;
    let superuser = HaPair::connect(&pair.first_url).await;
    // Cancels the commit of this node that waits for a synchronous standby, as an
    // operator's pg_cancel_backend would.
    let cancel_the_wait = || end_standby_waits(&superuser, NAME, "pg_cancel_backend");

    // An outcome write: done on the primary, unconfirmed; the write is retried, finds the
    // row done, and says so in the log.
    app.target.set(Behaviour::Hang);
    let delivery = app.deliver("evt_done_unconfirmed", "{}");
    let cancel = async {
        app.target
            .wait_for(&TestApp::idem("evt_done_unconfirmed"), 1)
            .await;
        pair.require_ghost().await;
        app.target.release();
        cancel_the_wait().await;
    };
    let (answer, ()) = futures_util::join!(delivery, cancel);
    assert_eq!((answer.status, answer.path.as_str()), (201, "first_run"));
    let retries = app
        .log
        .events("webhook.record_retry", "evt_done_unconfirmed");
    assert!(
        retries.iter().any(|l| l["error"]
            .as_str()
            .is_some_and(|e| e.contains("without a synchronous standby's confirmation"))),
        "{retries:?}"
    );

    // A claim: won on the primary, unconfirmed; nothing is delivered on it.
    let (answer, ()) = futures_util::join!(
        app.deliver("evt_claim_unconfirmed", "{}"),
        cancel_the_wait()
    );
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.path, "store_unavailable");
    assert_eq!(app.target.count(&TestApp::idem("evt_claim_unconfirmed")), 0);
    pair.release_ghost().await;
    // Committed on the primary: the row is held by a lease nobody delivers on.
    eventually("the claimed row to be read", || async {
        status(&app, PROVIDER, "evt_claim_unconfirmed")
            .await
            .as_deref()
            == Some("in_progress")
    })
    .await;
}

#[actix_web::test]
async fn an_outcome_write_whose_backend_ends_mid_commit_is_found_in_place_not_taken_for_lost() {
    const NAME: &str = "hookgate-ended";
    let pair = HaPair::start().await;
    let app = node_on(&pair, pair.url_named(NAME), |c| {
        c.store.statement_timeout = Some(Duration::from_secs(5));
    })
    .await;
    let superuser = HaPair::connect(&pair.first_url).await;
    app.target.set(Behaviour::Hang);
    let delivery = app.deliver("evt_ended", "{}");
    let end_it = async {
        app.target.wait_for(&TestApp::idem("evt_ended"), 1).await;
        pair.require_ghost().await;
        app.target.release();
        // The completion commits on the primary and waits for the standby; its backend is
        // ended, as a primary's crash or an operator's pg_terminate_backend ends it: the
        // connection closes, the commit has taken effect.
        end_standby_waits(&superuser, NAME, "pg_terminate_backend").await;
    };
    let (answer, ()) = futures_util::join!(delivery, end_it);
    assert_eq!((answer.status, answer.path.as_str()), (201, "first_run"));
    assert!(app.log.events("webhook.stale", "evt_ended").is_empty());
    assert_eq!(app.target.count(&TestApp::idem("evt_ended")), 1);
}

/// Calls `function` (`pg_cancel_backend` or `pg_terminate_backend`) on every backend of
/// the node named `name` whose commit waits for the synchronous standby, once there is one.
async fn end_standby_waits(superuser: &tokio_postgres::Client, name: &str, function: &str) {
    let sql = format!(
        "SELECT count({function}(pid)) FROM pg_stat_activity
         WHERE application_name = $1 AND wait_event = 'SyncRep'"
    );
    eventually(
        &format!("a commit of {name} to wait for the standby"),
        || async {
            let ended: i64 = superuser
                .query_one(&sql, &[&name])
                .await
                .unwrap_or_else(|e| panic!("{function}: {e}"))
                .get(0);
            ended > 0
        },
    )
    .await;
}
