//! The embedded store's operator side under test: its reads' plans (each status by its
//! index, a job's items by theirs), key prefixes matched literally, and reads that never
//! hold up the writer or outlive their deadline.

use super::*;
use crate::store::sqlite::rows::select_summary;
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

/// A migrated store in a directory of its own, removed when dropped.
struct TempStore {
    dir: std::path::PathBuf,
    store: SqliteStore,
}

impl TempStore {
    async fn new() -> Self {
        Self::with_deadline(Duration::from_secs(5)).await
    }

    /// Migrated under the usual deadline, then opened again with `deadline`.
    async fn with_deadline(deadline: Duration) -> Self {
        let dir = std::env::temp_dir().join(format!("hookgate-prefix-{}", fastrand::u64(..)));
        let path = dir.join("events.db");
        let store = SqliteStore::open(&path, Duration::from_secs(5)).unwrap();
        store.migrate().await.unwrap();
        drop(store);
        let store = SqliteStore::open(&path, deadline).unwrap();
        Self { dir, store }
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The keys a search with `prefix` finds (sorted), after checking that `count` agrees.
async fn found(store: &SqliteStore, prefix: &str) -> Vec<String> {
    let filter = SearchFilter {
        key_prefix: Some(prefix.into()),
        ..SearchFilter::default()
    };
    let page = store.operator().search(&filter, None, 100).await.unwrap();
    let mut keys: Vec<String> = page
        .rows
        .into_iter()
        .map(|r| r.id.key.to_string())
        .collect();
    keys.sort();
    let counted = store.operator().count(&filter).await.unwrap();
    assert_eq!(counted, keys.len() as u64, "count and search of {prefix:?}");
    keys
}

/// SQLite's plan of `sql`, one line a step (`EXPLAIN QUERY PLAN`), on `t`'s database.
fn plan(t: &TempStore, sql: &str, params: impl rusqlite::Params) -> Vec<String> {
    let conn = Connection::open(t.dir.join("events.db")).unwrap();
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let rows = stmt.query_map(params, |r| r.get::<_, String>(3)).unwrap();
    rows.map(Result::unwrap).collect()
}

#[tokio::test]
async fn a_jobs_latest_results_come_from_an_index_not_a_sort_of_all_of_them() {
    let t = TempStore::new().await;
    let steps = plan(&t, JOB_ITEMS, params![1, 200]);
    assert!(
        steps
            .iter()
            .all(|s| !s.contains("TEMP B-TREE") && !s.starts_with("SCAN")),
        "{steps:?}"
    );
}

#[tokio::test]
async fn a_search_reads_each_status_by_its_index_in_the_page_order() {
    let t = TempStore::new().await;
    let newest = select_summary(search::NEWEST);
    let oldest = select_summary(search::OLDEST);
    for steps in [
        plan(&t, &newest, params!["dead", 1e12, 0.0]),
        plan(&t, &oldest, params!["dead"]),
    ] {
        assert!(
            steps
                .iter()
                .any(|s| s.contains("USING INDEX webhook_events_status_updated (status=?")),
            "{steps:?}"
        );
        // Ties on updated_at may be ordered as they come ("RIGHT PART OF ORDER BY");
        // every row of a status read and sorted may not.
        assert!(
            steps
                .iter()
                .all(|s| !s.starts_with("SCAN") && !s.contains("TEMP B-TREE FOR ORDER BY")),
            "{steps:?}"
        );
    }
}

#[tokio::test]
async fn a_key_prefix_matches_case_exact_keys_and_its_metacharacters_literally() {
    let t = TempStore::new().await;
    let keys = [
        "evt_Ab1",
        "evt_ab2",
        "evt_A%c",
        "evt_A_d",
        "evt_AÉ",
        "evt_Aé",
        "evt_A*[x]",
        "evt_Az",
        "evu_A",
        "evt_\u{10FFFF}x",
        "evt_\u{10FFFF}",
    ];
    for key in keys {
        let id = EventId::new("stripe", key);
        store_claim(&t.store, &id).await;
    }
    let t = &t.store;
    assert_eq!(
        found(t, "evt_A").await,
        [
            "evt_A%c",
            "evt_A*[x]",
            "evt_A_d",
            "evt_Ab1",
            "evt_Az",
            "evt_AÉ",
            "evt_Aé"
        ]
    );
    assert_eq!(found(t, "evt_A%").await, ["evt_A%c"]);
    assert_eq!(found(t, "evt_A_").await, ["evt_A_d"]);
    assert_eq!(found(t, "evt_A*").await, ["evt_A*[x]"]);
    assert_eq!(found(t, "evt_A*[").await, ["evt_A*[x]"]);
    assert_eq!(found(t, "evt_a").await, ["evt_ab2"]);
    assert_eq!(found(t, "evt_Aé").await, ["evt_Aé"]);
    assert_eq!(found(t, "evt_AÉ").await, ["evt_AÉ"]);
    assert_eq!(
        found(t, "evt_\u{10FFFF}").await,
        ["evt_\u{10FFFF}", "evt_\u{10FFFF}x"]
    );
    assert_eq!(
        found(t, "").await.len(),
        keys.len(),
        "an empty prefix matches all"
    );
}

#[test]
fn a_key_range_ends_before_the_next_character() {
    let end = |prefix: &str| key_range(prefix).1;
    assert_eq!(end("evt_A").as_deref(), Some("evt_B"));
    assert_eq!(
        end("k\u{D7FF}").as_deref(),
        Some("k\u{E000}"),
        "past the surrogates"
    );
    assert_eq!(end("k\u{10FFFF}").as_deref(), Some("l"));
    assert_eq!(end("\u{10FFFF}"), None);
    assert_eq!(end(""), None);
}

#[tokio::test]
async fn a_claim_completes_while_an_operator_read_holds_its_snapshot_open() {
    let t = TempStore::new().await;
    store_claim(&t.store, &EventId::new("stripe", "evt_1")).await;
    let (entered, inside) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (seen, snapshot) = std::sync::mpsc::channel::<i64>();
    // The next operator read stops part-way through a scan — its read transaction
    // open — until the claim below has answered, then counts within that snapshot.
    t.store.set_read_hook(Box::new(move |conn| {
        let mut scan = conn
            .prepare("SELECT event_key FROM webhook_events")
            .unwrap();
        let mut rows = scan.query([]).unwrap();
        assert!(rows.next().unwrap().is_some());
        entered.send(()).unwrap();
        let _ = released.recv();
        let rows_seen = conn
            .query_row("SELECT count(*) FROM webhook_events", [], |r| r.get(0))
            .unwrap();
        drop(rows);
        seen.send(rows_seen).unwrap();
    }));
    let read = t.store.operator().status_counts();
    let claim = async {
        let began = tokio::task::spawn_blocking(move || inside.recv()).await;
        assert!(matches!(began, Ok(Ok(()))), "the read began");
        let won = t
            .store
            .claim(
                &EventId::new("stripe", "evt_2"),
                None,
                Duration::from_secs(60),
                None,
            )
            .await;
        let _ = release.send(());
        won
    };
    let (counts, won) = tokio::join!(read, claim);
    let won = won.expect("the claim answers while the read is inside its scan");
    assert!(
        matches!(won, crate::claim::ClaimResult::Won { .. }),
        "{won:?}"
    );
    assert_eq!(
        snapshot.recv().unwrap(),
        1,
        "the read's snapshot predates the claim"
    );
    let rows: u64 = counts.unwrap().iter().map(|c| c.rows).sum();
    assert_eq!(
        rows, 2,
        "the read itself ran after the hook, in a new snapshot"
    );
}

#[tokio::test]
async fn an_operator_read_past_its_deadline_is_stopped_not_left_running() {
    let t = TempStore::with_deadline(Duration::from_secs(1)).await;
    let (ended, end) = std::sync::mpsc::channel();
    t.store.set_read_hook(Box::new(move |conn| {
        // Never ends by itself: only an interrupt stops it.
        let endless = conn.query_row(
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n)
             SELECT count(*) FROM n",
            [],
            |r| r.get::<_, i64>(0),
        );
        let _ = ended.send(endless.map_err(|e| e.sqlite_error_code()));
    }));
    let late = t.store.operator().status_counts().await.unwrap_err();
    assert!(matches!(late, StoreError::TimedOut(_)), "{late}");
    // Waiting bounds only a failure: a read left running never sends.
    let endless = tokio::task::spawn_blocking(move || end.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the read was stopped, not left running");
    assert_eq!(
        endless,
        Err(Some(rusqlite::ErrorCode::OperationInterrupted))
    );
    let counts = t.store.operator().status_counts().await;
    assert!(counts.is_ok(), "the next read runs: {counts:?}");
}

async fn store_claim(store: &SqliteStore, id: &EventId) {
    let won = store
        .claim(id, None, Duration::from_secs(60), None)
        .await
        .unwrap();
    assert!(
        matches!(won, crate::claim::ClaimResult::Won { .. }),
        "{won:?}"
    );
}
