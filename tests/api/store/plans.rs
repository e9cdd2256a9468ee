//! The hot statements' plans (claims — with other routes' rows too — completions, failures,
//! renewals and the scheduler's batched take) do not depend on when the table was last analyzed: prepared
//! while `webhook_events` was empty and never analyzed, they still find rows by the primary
//! key once it holds 100 000 rows — half of them `in_progress` — never by a sequential scan
//! nor by walking an index (the status index holds every `in_progress` row). Counted as
//! rows read by sequential scans plus index entries read, per `pg_stat_user_*`. The
//! operators' reads of one page (dead letters, a job's results) read about that page,
//! whatever the tables hold, on plans cached while they were empty.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use hookgate::claim::{ClaimResult, Path, Status, StoredResult};
use hookgate::config::StoreConfig;
use hookgate::key::EventId;
use hookgate::store::operator::SearchFilter;
use hookgate::store::{QueueRow, Store};

use crate::helpers::{eventually, failure, TestDb};

const ROWS: i64 = 100_000;

/// Claims keys `hot{i}` and ends each won attempt one of three ways (complete; fail;
/// renew, then complete), so every fenced single-row and batched statement runs; with
/// `old`, also claims a key of the big table, which is reported, not won.
async fn claim_and_complete(store: &Arc<dyn Store>, keys: std::ops::Range<u32>, old: bool) {
    let done = StoredResult {
        status: 200,
        content_type: None,
        body: Vec::new(),
    };
    let lease = Duration::from_secs(30);
    let work = keys.map(|i| {
        let (store, done) = (Arc::clone(store), done.clone());
        async move {
            let id = EventId::new("p", format!("hot{i}"));
            // Every fourth event has another route: the routed claim statement.
            let others: Vec<QueueRow> = (i % 4 == 3)
                .then(|| QueueRow {
                    id: EventId::new("p.r", format!("hot{i}")),
                    fingerprint: Some("fp".into()),
                    payload: "{}".into(),
                    content_type: None,
                    headers: None,
                    keep_payload: false,
                    start: None,
                })
                .into_iter()
                .collect();
            let claimed = store
                .claim_routed(&id, Some("fp"), lease, None, Path::FirstRun, &others)
                .await
                .map(|routed| routed.answer);
            if let Ok(ClaimResult::Won { attempts, .. }) = claimed {
                match i % 3 {
                    0 => {
                        store.fail(&id, attempts, &failure(None)).await.unwrap();
                    }
                    1 => {
                        store.renew(&id, attempts, lease).await.unwrap();
                        store.complete(&id, attempts, &done, None).await.unwrap();
                    }
                    _ => {
                        store.complete(&id, attempts, &done, None).await.unwrap();
                    }
                }
            }
            if old {
                let old = EventId::new("p", format!("old{}", i64::from(i) % ROWS + 1));
                store.claim(&old, None, lease, None).await.unwrap();
            }
            // The scheduler's batched take, with keys of its own in flight to skip.
            if i % 10 == 0 {
                let busy: Vec<Arc<str>> = vec![Arc::from(format!("hot{i}"))];
                store.take_due("p", 10, lease, &busy).await.unwrap();
            }
        }
    });
    join_all(work).await;
}

#[actix_web::test]
async fn claims_and_completions_never_scan_the_table_whatever_its_statistics() {
    let db = TestDb::new().await;
    let (store, name) = db.named_store("hookgate_plans", 4).await;
    db.autovacuum_off(&["webhook_events"]).await;
    // Prepared and run on an empty table, each statement more often than Postgres's five
    // custom plans on every pooled connection, so a generic plan is chosen there.
    // The table is emptied after each round, so the scans a tiny table rightly gets read
    // next to nothing.
    for round in 0..40 {
        claim_and_complete(&store, round * 10..round * 10 + 10, false).await;
        db.execute("DELETE FROM webhook_events").await;
    }

    db.execute(&format!(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     result_status, locked_until)
         SELECT 'p', 'old' || g, CASE g % 2 WHEN 0 THEN 'done' ELSE 'in_progress' END, 1,
                'first_run', 200, now() + interval '1 hour'
         FROM generate_series(1, {ROWS}) g"
    ))
    .await;
    claim_and_complete(&store, 400..3400, true).await;

    // Stats reach pg_stat_user_tables when the connections end: close them, then read.
    drop(store);
    eventually("hookgate's connections to end", || async {
        db.rows_scanned(&name).await.1 == 0
    })
    .await;
    let (read, _) = db.rows_scanned(&name).await;
    assert!(
        read < ROWS,
        "{read} rows or index entries read by scans: at least one walk of the table or \
         of an index"
    );
}

/// Rows the current slot holds when the test below caches plans a second time (about
/// when the ring analyzes it), and rows it gains after that.
const SETTLING: i64 = 15_000;
const GROWN: i64 = 30_000;

/// The ring opens each slot empty, and the completions' batch statement names the
/// current slot's partition. A plan cached on a connection while that partition held a
/// few rows walked it whole at every batch once it had grown — its key index end to end,
/// as the outer side of the join — until an autovacuum happened to analyze it (5 249
/// buffers a call for 4 rows in the soak). Here the hot statements (claims, completion
/// batches, failures, renewals, the queue's take) run on one connection while the current
/// slot is empty and analyzed (as autovacuum leaves a slot the ring emptied: its changes
/// since its last analyze outlive the truncation), again once it holds [`SETTLING`] rows,
/// and again after [`GROWN`] more: they read their rows by key every time.
#[actix_web::test]
async fn hot_statements_on_a_current_slot_that_grew_after_they_ran_read_their_rows_by_key() {
    let db = TestDb::new().await;
    let (store, name) = db.named_store("hookgate_young_slot", 1).await;
    db.autovacuum_off(&["webhook_events"]).await;
    let slot = db.current_slot().await;
    db.execute(&format!("ANALYZE webhook_events_s{slot}")).await;
    let grow = |from: i64, rows: i64| {
        format!(
            "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                         result_status)
             SELECT 'p', md5(g::text), 'done', 1, 'first_run', 200
             FROM generate_series({from}, {}) g",
            from + rows - 1
        )
    };
    // Each time more runs than Postgres's five custom plans, so a generic one is cached.
    for round in 0..10 {
        claim_and_complete(&store, round * 10..round * 10 + 10, false).await;
    }
    db.execute(&grow(1, SETTLING)).await;
    for round in 10..20 {
        claim_and_complete(&store, round * 10..round * 10 + 10, false).await;
    }
    db.execute(&grow(SETTLING + 1, GROWN)).await;
    db.flush_stats().await;
    let tables = ["webhook_events"];
    let before = db.reads(&tables).await;
    for round in 20..30 {
        claim_and_complete(&store, round * 10..round * 10 + 10, false).await;
    }
    db.close(store, &name).await;
    let read = db.reads(&tables).await - before;
    // About 30 a key by index; a walk of the partition reads all its 45 000 rows.
    assert!(
        read < GROWN / 3,
        "{read} rows or index entries read by 100 events' claims and completions: a walk \
         of the current slot's partition"
    );
    // The ring analyzed its current slot once it had grown.
    let estimate: f32 = db
        .query_one(
            &format!(
                "SELECT reltuples FROM pg_class WHERE oid = 'webhook_events_s{slot}'::regclass"
            ),
            &[],
        )
        .await
        .get(0);
    assert!(
        estimate >= SETTLING as f32 / 2.0,
        "the current slot's partition is estimated at {estimate} rows"
    );
}

/// How many times the test below runs the take on its one connection: a number no other
/// test's take reaches, by which its statement is told apart from theirs (each schema's
/// statements are counted apart, under the same text). Counted as the growth of each
/// statement's calls over the test, so the statements of earlier runs of the suite on the
/// same cluster (which `pg_stat_statements` keeps) do not count.
const TAKES: i64 = 137;

/// The scheduler's take is planned once per connection, not at every execution, whatever
/// the statistics make of its parameters. Planned at each execution, it is a join over
/// every slot with the node's keys in flight as a constant: half of Postgres's CPU in the
/// queue-mode soak (docs/performance-log.md, "Queue mode's rise in CPU, measured again").
/// Here the statistics say one provider holds every row, so a take for another provider,
/// planned for its value, looks cheaper than the generic plan: Postgres's plan cache would
/// plan every execution. Counted by `pg_stat_statements` (the test cluster loads it).
#[actix_web::test]
async fn a_queue_take_is_planned_once_whatever_its_parameters() {
    let db = TestDb::new().await;
    db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements WITH SCHEMA public")
        .await;
    let (store, name) = db.named_store("hookgate_take_plans", 1).await;
    db.execute(
        "INSERT INTO webhook_events (provider, event_key, status, mode, attempts, last_path,
                                     next_attempt_at)
         SELECT 'p', 'q' || g, 'queued', 'queue', 0, 'queued', now() - interval '1 hour'
         FROM generate_series(1, 20000) g",
    )
    .await;
    db.execute("ANALYZE webhook_events").await;
    db.execute(
        "CREATE TEMP TABLE takes_before AS
         SELECT userid, dbid, queryid, toplevel, calls, plans FROM public.pg_stat_statements
         WHERE query LIKE '%event_key <> ALL%'",
    )
    .await;
    let busy: Vec<Arc<str>> = (0..300).map(|i| Arc::from(format!("busy{i}"))).collect();
    let lease = Duration::from_secs(30);
    for _ in 0..TAKES {
        let taken = store.take_due("other", 10, lease, &busy).await.unwrap();
        assert!(taken.is_empty(), "the other provider has no rows");
    }
    db.close(store, &name).await;

    let row = db
        .query_one(
            "SELECT count(*), COALESCE(sum(s.plans - COALESCE(b.plans, 0)), 0)::bigint
             FROM public.pg_stat_statements s
             LEFT JOIN takes_before b USING (userid, dbid, queryid, toplevel)
             WHERE s.query LIKE '%event_key <> ALL%'
               AND s.calls - COALESCE(b.calls, 0) = $1",
            &[&TAKES],
        )
        .await;
    let (statements, plans): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(statements, 1, "the take's statement, run {TAKES} times");
    assert!(
        plans <= 6,
        "{plans} plans for {TAKES} takes on one connection: planned at every execution"
    );
}

/// Rows of the operator-reads table: two thirds dead letters, three providers, one row
/// changed every millisecond (two at a time: ties for the page order's tie-break).
const BIG: i64 = 100_000;

/// Items of the bulk replay job whose latest results are read.
const ITEMS: i64 = 50_000;

/// The most rows and index entries one page of 50 may read: its rows, the ties of its last
/// update time, and the edge of the index. A read that walks the table reads tens of
/// thousands.
const PAGE_READS: i64 = 1_000;

/// The most rows and index entries a search that finds too few matches may read before it
/// answers what it found with the place to go on from: well under the table, which a
/// search for a key prefix or a provider that is not there would otherwise read whole.
const SCAN_READS: i64 = 12_000;

/// One operator read, as the console, the admin API and the command line make them.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// `/admin/dead`, `hookgate dead list`: the newest 50 dead letters.
    FirstDeadPage,
    /// The page after the 30 000th dead letter (an operator paging down, a bulk job deep in
    /// a backlog).
    DeepDeadPage,
    /// The newest 50 dead letters of one provider.
    DeadPageOfProvider,
    /// A replay job's latest 200 results (its page, polled twice a second).
    JobItems,
    /// The console's events page: a search without a status.
    Search,
    /// The same, deep: after the 30 000th row.
    DeepSearch,
    /// A search of one provider's rows, any status.
    SearchByProvider,
    /// A search by the last path, any status.
    SearchByPath,
    /// A search for a key prefix few keys have, any status.
    SearchByKeyPrefix,
    /// A search for a provider no row has.
    SearchForNothing,
    /// `hookgate events list`, every status.
    List,
    /// `hookgate events list --status dead --provider p2`.
    ListOfProviderDead,
}

impl Read {
    const ALL: [Read; 12] = [
        Read::FirstDeadPage,
        Read::DeepDeadPage,
        Read::DeadPageOfProvider,
        Read::JobItems,
        Read::Search,
        Read::DeepSearch,
        Read::SearchByProvider,
        Read::SearchByPath,
        Read::SearchByKeyPrefix,
        Read::SearchForNothing,
        Read::List,
        Read::ListOfProviderDead,
    ];

    /// The most it may read.
    fn bound(self) -> i64 {
        match self {
            Read::SearchByKeyPrefix | Read::SearchForNothing => SCAN_READS,
            _ => PAGE_READS,
        }
    }

    /// Runs the read; how many rows it answered.
    async fn run(self, store: &dyn Store, deep: &hookgate::store::PageCursor) -> usize {
        let search = |filter: SearchFilter, after: Option<&hookgate::store::PageCursor>| {
            let filter = filter.clone();
            let after = after.cloned();
            async move {
                store
                    .operator()
                    .search(&filter, after.as_ref(), 51)
                    .await
                    .unwrap()
                    .rows
                    .len()
            }
        };
        let provider = |p: &str| SearchFilter {
            provider: Some(p.into()),
            ..SearchFilter::default()
        };
        match self {
            Read::FirstDeadPage => store.dead_letters(None, None, 51).await.unwrap().len(),
            Read::DeepDeadPage => store
                .dead_letters(None, Some(deep), 51)
                .await
                .unwrap()
                .len(),
            Read::DeadPageOfProvider => store
                .dead_letters(Some("p1"), None, 51)
                .await
                .unwrap()
                .len(),
            Read::JobItems => store.operator().job_items(1, 200).await.unwrap().len(),
            Read::Search => search(SearchFilter::default(), None).await,
            Read::DeepSearch => search(SearchFilter::default(), Some(deep)).await,
            Read::SearchByProvider => search(provider("p2"), None).await,
            Read::SearchByPath => {
                let filter = SearchFilter {
                    path: Some("first_run".into()),
                    ..SearchFilter::default()
                };
                search(filter, None).await
            }
            Read::SearchByKeyPrefix => {
                let filter = SearchFilter {
                    key_prefix: Some("old1234".into()),
                    ..SearchFilter::default()
                };
                // The five newest of its eleven keys lie within the rows read.
                search(filter, None).await.max(1)
            }
            Read::SearchForNothing => search(provider("nobody"), None).await.max(1),
            Read::List => store.list(None, None, 50).await.unwrap().len(),
            Read::ListOfProviderDead => store
                .list(Some("p2"), Some(Status::Dead), 50)
                .await
                .unwrap()
                .len(),
        }
    }
}

/// Every operator read of one page reads about its page, not the table, on plans cached
/// while the tables were empty: each read runs on a connection of its own eight times on
/// empty tables (Postgres then caches a generic plan), the empty tables are analyzed, then
/// each read runs once on 100 000 events and a job of 50 000 results; the rows and index
/// entries it read are counted (its connection ended, so its counts are reported).
#[actix_web::test]
async fn operator_reads_read_their_page_not_the_table_whatever_the_cached_plan() {
    let db = TestDb::new().await;
    drop(db.store().await);
    db.autovacuum_off(&["webhook_events", "hookgate_replay_items"])
        .await;
    db.execute(
        "INSERT INTO hookgate_replay_jobs (id, filter, status, total, rate)
         VALUES (1, '{}', 'done', 0, 1)",
    )
    .await;
    let empty_cursor = hookgate::store::PageCursor::after(1.0, &EventId::new("p", "k"));
    let mut stores = Vec::new();
    for (n, read) in Read::ALL.into_iter().enumerate() {
        let name = format!("hookgate_reads_{}_{n}", fastrand::u32(..));
        let store = hookgate::store::open(&StoreConfig {
            url: format!("{}?application_name={name}", db.url),
            schema: db.schema.clone(),
            pool_size: 1,
            ..StoreConfig::default()
        })
        .await
        .unwrap();
        for _ in 0..8 {
            read.run(&*store, &empty_cursor).await;
        }
        stores.push((read, name, store));
    }
    // Statistics that say the tables are empty, as a table's first analyze says: the
    // cached plans are made again from them at their next run, whatever the tables hold.
    db.execute("ANALYZE webhook_events; ANALYZE hookgate_replay_items")
        .await;

    db.execute(&format!(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     last_error, dead_reason, payload, created_at, updated_at)
         SELECT 'p' || g % 3, 'old' || g, CASE g % 3 WHEN 0 THEN 'done' ELSE 'dead' END, 1,
                'first_run', 'target answered 400',
                CASE g % 3 WHEN 0 THEN NULL ELSE 'non_retryable' END, '\\x7b7d',
                now() - g * interval '1 millisecond',
                now() - (g / 2) * interval '1 millisecond'
         FROM generate_series(1, {BIG}) g;
         INSERT INTO hookgate_replay_items (job_id, provider, event_key, outcome, at)
         SELECT 1, 'p1', 'old' || g, 'done', now() - g * interval '1 millisecond'
         FROM generate_series(1, {ITEMS}) g"
    ))
    .await;
    let row = db
        .query_one(
            "SELECT (extract(epoch FROM updated_at) * 1e6)::int8, provider, event_key
             FROM webhook_events WHERE status = 'dead'
             ORDER BY updated_at DESC, provider DESC, event_key DESC OFFSET 30000 LIMIT 1",
            &[],
        )
        .await;
    let deep = hookgate::store::PageCursor {
        updated_us: row.get(0),
        id: EventId::new(row.get::<_, String>(1), row.get::<_, String>(2)),
    };
    // What finding it read is not any read's.
    db.flush_stats().await;

    let tables = ["webhook_events", "hookgate_replay_items"];
    let mut over = Vec::new();
    for (read, name, store) in stores {
        let before = db.reads(&tables).await;
        let rows = read.run(&*store, &deep).await;
        assert!(rows > 0, "{read:?} found nothing");
        // Counts reach the statistics when the connection ends: close it, then read.
        drop(store);
        eventually("the read's connection to end", || async {
            db.backends(&name).await == 0
        })
        .await;
        let read_now = db.reads(&tables).await - before;
        if read_now > read.bound() {
            over.push(format!(
                "{read:?}: {read_now} rows or index entries (at most {})",
                read.bound()
            ));
        }
    }
    assert!(over.is_empty(), "reads past their bound: {over:#?}");
}

/// Lists read no payload: with twenty dead letters of 1 MB each, the dead-letter list, the
/// search and `events list` read not one block of the table's TOAST (where such payloads
/// live), while one event's read does.
#[actix_web::test]
async fn lists_read_no_payload_and_one_event_reads_its_own() {
    let db = TestDb::new().await;
    drop(db.store().await);
    db.execute(
        "INSERT INTO webhook_events (provider, event_key, status, attempts, last_path,
                                     dead_reason, payload)
         SELECT 'p', 'big' || g, 'dead', 1, 'first_run', 'non_retryable',
                convert_to((SELECT string_agg(md5(g::text || i::text), '')
                            FROM generate_series(1, 32768) i), 'UTF8')
         FROM generate_series(1, 20) g",
    )
    .await;
    let name = format!("hookgate_lists_{}", fastrand::u32(..));
    let config = StoreConfig {
        url: format!("{}?application_name={name}", db.url),
        schema: db.schema.clone(),
        ..StoreConfig::default()
    };
    let read = |one: bool| {
        let config = config.clone();
        async move {
            let store = hookgate::store::open(&config).await.unwrap();
            if one {
                let row = store.operator().event(&EventId::new("p", "big7")).await;
                assert!(row
                    .unwrap()
                    .unwrap()
                    .payload
                    .is_some_and(|p| p.len() == 1 << 20));
            } else {
                assert_eq!(store.dead_letters(None, None, 50).await.unwrap().len(), 20);
                let filter = hookgate::store::operator::SearchFilter::default();
                let found = store.operator().search(&filter, None, 50).await.unwrap();
                assert_eq!(found.rows.len(), 20);
                assert_eq!(store.list(None, None, 50).await.unwrap().len(), 20);
            }
        }
    };
    for one in [false, true] {
        let before = db.toast_reads().await;
        read(one).await;
        // Counts reach the statistics when the connections end (the store is dropped).
        eventually("the reads' connections to end", || async {
            db.backends(&name).await == 0
        })
        .await;
        let toast = db.toast_reads().await - before;
        if one {
            assert!(toast > 0, "one event's read reads its payload");
        } else {
            assert_eq!(toast, 0, "TOAST blocks read by lists");
        }
    }
}
