//! Finding events, on both stores: the search filters and pages, reads a bounded number of
//! rows a page, and lists carry sizes, not payloads; the statistics count the table once
//! per max age; an event with any key is opened and replayed by its query.

use std::time::Duration;

use hookgate::key::EventId;
use hookgate::store::operator::SearchFilter;
use serde_json::{json, Value};

use crate::helpers::{Backend, Behaviour, TestApp, PROVIDER};

use super::common::{admin_app, auth, get_json, post_json};

/// The search pages by cursor, filters by status and key prefix, and refuses what it
/// cannot read.
async fn events_are_searched_by_filter_and_paged(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    for n in 0..5 {
        app.deliver(&format!("ok_{n}"), "{}").await;
    }
    app.target.set(Behaviour::Status(400));
    for n in 0..2 {
        app.deliver(&format!("bad_{n}"), "{}").await;
    }
    let dead = get_json(&app, "/admin/api/events?status=dead").await;
    assert_eq!(dead["events"].as_array().unwrap().len(), 2);
    assert!(dead["next_cursor"].is_null());
    let mut seen = Vec::new();
    let mut path = "/admin/api/events?key_prefix=ok_&limit=2".to_owned();
    loop {
        let page = get_json(&app, &path).await;
        for e in page["events"].as_array().unwrap() {
            seen.push(e["event_key"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/admin/api/events?key_prefix=ok_&limit=2&cursor={c}"),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["ok_0", "ok_1", "ok_2", "ok_3", "ok_4"]);
    // A time range: everything changed in the last hour, nothing in the future.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let recent = get_json(
        &app,
        &format!("/admin/api/events?updated_after={}&limit=100", now - 3600.0),
    )
    .await;
    assert_eq!(recent["events"].as_array().unwrap().len(), 7);
    let future = get_json(
        &app,
        &format!("/admin/api/events?created_after={}", now + 60.0),
    )
    .await;
    assert_eq!(future["events"], json!([]));
    // `_` in a prefix is a character, not a wildcard.
    let none = get_json(&app, "/admin/api/events?key_prefix=ok%25").await;
    assert_eq!(none["events"], json!([]));
    let bad = app.get_with("/admin/api/events?status=gone", &auth()).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(app.get("/admin/api/events").await.status, 401);
}

/// Lists never carry payloads: six dead letters of 1 MB each are listed whole in a few
/// kilobytes — by `/admin/dead`, the search and the command line's `dead list` — each with
/// its payload's size; one event's page still has its payload whole.
async fn lists_of_large_dead_letters_carry_their_sizes_not_their_payloads(backend: Backend) {
    let app = admin_app(backend, |c| c.server.max_body_bytes = 2 << 20).await;
    app.target.set(Behaviour::Status(400));
    let filler = "x".repeat(1 << 20);
    for i in 0..6 {
        let body = format!(r#"{{"id":"evt_big{i}","filler":"{filler}"}}"#);
        let answer = app.deliver(&format!("evt_big{i}"), &body).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let size = (format!(r#"{{"id":"evt_big0","filler":"{filler}"}}"#)).len();
    for (path, list) in [
        ("/admin/dead?limit=1000", "dead"),
        ("/admin/api/events?status=dead&limit=500", "events"),
    ] {
        let answer = app.get_with(path, &auth()).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        assert!(
            answer.body.len() < 16 << 10,
            "{path}: {} bytes",
            answer.body.len()
        );
        let page: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(page["truncated"], false, "{path}");
        let items = page[list].as_array().unwrap();
        assert_eq!(items.len(), 6, "{path}");
        for item in items {
            assert!(item.get("payload").is_none(), "{path}: {item}");
            assert!(item.get("request_headers").is_none(), "{path}: {item}");
            assert_eq!(item["payload_bytes"], json!(size), "{path}: {item}");
        }
    }
    let rows = app
        .store
        .dead_letters(Some(PROVIDER), None, 10)
        .await
        .unwrap();
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().all(|r| r.payload_bytes == Some(size as u64)));
    let one = get_json(&app, &format!("/admin/api/events/{PROVIDER}/evt_big3")).await;
    assert_eq!(one["payload"].as_str().map(str::len), Some(size));
}

/// A search reads at most its budget of rows a page: one no row matches answers empty pages
/// that say so, each going on from where the last stopped, to the end; one few rows match
/// finds each of them once, in the page order, whichever page they fall in.
async fn a_search_reads_a_bounded_number_of_rows_a_page_and_goes_on_from_there(backend: Backend) {
    let db = crate::helpers::TestDb::on(backend).await;
    let store = db.store().await;
    let rows = 2 * hookgate::store::SCAN_BUDGET + 5_000;
    db.fill_dead(rows).await;
    let pages = |filter: SearchFilter| {
        let store = std::sync::Arc::clone(&store);
        async move {
            let mut pages = Vec::new();
            let mut after = None;
            loop {
                let page = store
                    .operator()
                    .search(&filter, after.as_ref(), 50)
                    .await
                    .unwrap();
                after = page.next.clone();
                pages.push(page);
                if after.is_none() {
                    return pages;
                }
                assert!(pages.len() < 10, "a search that never ends");
            }
        }
    };
    let nothing = pages(SearchFilter {
        provider: Some("nobody".into()),
        ..SearchFilter::default()
    })
    .await;
    assert_eq!(nothing.len(), 3, "{rows} rows read a budget at a time");
    assert!(nothing.iter().all(|p| p.rows.is_empty()));
    assert!(nothing[..2].iter().all(|p| p.scan_stopped));
    assert!(!nothing[2].scan_stopped);

    let few = pages(SearchFilter {
        key_prefix: Some("k2500".into()),
        ..SearchFilter::default()
    })
    .await;
    let keys: Vec<String> = few
        .iter()
        .flat_map(|p| p.rows.iter().map(|r| r.id.key.to_string()))
        .collect();
    assert_eq!(keys, ["k2500", "k25000"]);
    let first = store
        .operator()
        .search(&SearchFilter::default(), None, 50)
        .await
        .unwrap();
    assert_eq!(first.rows.len(), 50);
    assert_eq!(first.rows[0].id.key.as_ref(), "k1", "newest first");
    assert!(!first.scan_stopped);
}

/// The statistics count rows per status at most once per `admin.stats_max_age` on a node,
/// and say how old their counts are; the queue's depth is read each time. With a max age
/// of zero every call counts.
async fn the_statistics_count_the_table_once_per_max_age_and_say_how_old(backend: Backend) {
    let done = |stats: &Value| stats["providers"][0]["counts"]["done"].clone();
    let app = admin_app(backend, |c| {
        c.admin.stats_max_age = Duration::from_secs(3600);
    })
    .await;
    assert_eq!(app.deliver("evt_s1", "{}").await.status, 201);
    let first = get_json(&app, "/admin/api/stats").await;
    assert_eq!(done(&first), 1);
    assert_eq!(first["counts_max_age_s"], 3600.0);
    assert_eq!(app.deliver("evt_s2", "{}").await.status, 201);
    let second = get_json(&app, "/admin/api/stats").await;
    assert_eq!(done(&second), 1, "the counts of the first call: {second}");
    let (a, b) = (
        first["counts_age_s"].as_f64(),
        second["counts_age_s"].as_f64(),
    );
    assert!(
        a.is_some_and(|a| b.is_some_and(|b| b >= a)),
        "{first} {second}"
    );

    let live = admin_app(backend, |c| c.admin.stats_max_age = Duration::ZERO).await;
    assert_eq!(live.deliver("evt_s1", "{}").await.status, 201);
    assert_eq!(done(&get_json(&live, "/admin/api/stats").await), 1);
    assert_eq!(live.deliver("evt_s2", "{}").await.status, 201);
    assert_eq!(done(&get_json(&live, "/admin/api/stats").await), 2);
}

/// Keys are the senders' to choose, and a path cannot carry some of them (a browser makes
/// `/events/stripe/..` into `/events/`): the query form of the API,
/// `GET /admin/api/event?provider=&key=` and `POST /admin/api/event/replay?provider=&key=`,
/// opens and replays an event whatever its key. A query without a key, or naming no
/// provider, is refused and replays nothing; the path form still serves plain keys.
async fn an_event_with_any_key_is_opened_and_replayed_by_its_query(backend: Backend) {
    let app = admin_app(backend, |_| {}).await;
    let keys = ["..", ".", "a/b", "%2e%2e", "q?x=1&y", "h#x", "plus+ space"];
    app.target.set(Behaviour::Status(400));
    for key in keys {
        let answer = app.deliver(key, "{}").await;
        assert_eq!(answer.body, r#"{"status":"dead_lettered"}"#, "{key}");
    }
    app.target.set(Behaviour::Accept);
    for key in keys {
        let query = format!("provider={PROVIDER}&key={}", encoded(key));
        let event = get_json(&app, &format!("/admin/api/event?{query}")).await;
        assert_eq!(event["event_key"], key);
        assert_eq!(event["status"], "dead", "{key}");
        let (status, body) = post_json(
            &app,
            &format!("/admin/api/event/replay?{query}"),
            Value::Null,
        )
        .await;
        assert_eq!(status, 200, "{key}: {body}");
        assert_eq!(body["event_key"], key);
        assert_eq!(body["status"], "done", "{key}");
        let at_target = EventId::new(PROVIDER, key).header_value();
        assert_eq!(app.target.count(&at_target), 2, "{key}");
    }
    let plain = get_json(&app, &format!("/admin/api/events/{PROVIDER}/plus+%20space")).await;
    assert_eq!(plain["event_key"], "plus+ space");

    app.target.set(Behaviour::Status(400));
    app.deliver("still_dead", "{}").await;
    for (path, status) in [
        (format!("/admin/api/event/replay?provider={PROVIDER}"), 400),
        ("/admin/api/event/replay?key=still_dead".to_owned(), 400),
        (
            "/admin/api/event/replay?provider=nope&key=still_dead".to_owned(),
            404,
        ),
    ] {
        let (answered, body) = post_json(&app, &path, Value::Null).await;
        assert_eq!(answered, status, "{path}: {body}");
    }
    let missing = app
        .get_with(&format!("/admin/api/event?provider={PROVIDER}"), &auth())
        .await;
    assert_eq!(missing.status, 400, "{}", missing.body);
    let unknown = app
        .get_with(
            &format!("/admin/api/event?provider={PROVIDER}&key=nope"),
            &auth(),
        )
        .await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert_eq!(app.target.count(&TestApp::idem("still_dead")), 1);
    assert_eq!(
        app.db.status(PROVIDER, "still_dead").await.as_deref(),
        Some("dead")
    );
}

/// Every byte but letters and digits as `%XX`, for a query string.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

on_both_stores!(
    the_statistics_count_the_table_once_per_max_age_and_say_how_old,
    a_search_reads_a_bounded_number_of_rows_a_page_and_goes_on_from_there,
    lists_of_large_dead_letters_carry_their_sizes_not_their_payloads,
    events_are_searched_by_filter_and_paged,
    an_event_with_any_key_is_opened_and_replayed_by_its_query,
);
