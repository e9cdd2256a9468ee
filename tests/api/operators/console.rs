//! The operator console in a real browser: headless Debian Chromium through chromedriver
//! against a node on Postgres. An operator logs in with the token, filters and pages events,
//! reads an event's attempts timeline (its hostile payload, sealed at rest, shown as text), bulk-replays
//! dead letters, and pauses and resumes a queue provider — each checked at the target.
//! Screenshots of each page go to `target/console-screenshots/`.

use std::path::{Path, PathBuf};

use hookgate::claim::Mode;

use hookgate::key::EventId;
use hookgate::secret::Secret;
use serde_json::json;

use crate::helpers::webdriver::{self, Browser};
use crate::helpers::{
    eventually, spawn_app_behind_proxy_with, spawn_app_on, Backend, Behaviour, TestApp, PROVIDER,
};

const TOKEN: &str = "t0ken";

/// A second provider, in queue mode, for pause and resume.
const QUEUED: &str = "github";

/// A payload and a kept header that would run script if the page ever made markup of them.
const HOSTILE: &str = "<script>alert(1)</script><img src=x onerror=alert(1)>";
const HOSTILE_AGENT: &str = "<img src=x onerror=alert(2)>";

#[actix_web::test]
async fn an_operator_works_through_the_console_in_a_real_browser() {
    if webdriver::skip_without_browser() {
        return;
    }
    // Behind a proxy the test can cut: the API then fails as it does when the store goes.
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        // Payloads kept once done too, so the event page shows the done event's payload.
        c.providers[0].keep_payload = serde_json::from_value(json!("always")).expect("always");
        // Sealed at rest: every body the console shows was opened on its way out.
        c.store.encryption.keys = vec![hookgate::config::KeyConfig {
            id: "console".into(),
            env: "HOOKGATE_TEST_KEY_console".into(),
        }];
        c.store.encryption.keyring = Some(crate::helpers::keyring(&["console"]));
        let mut queued = c.providers[0].clone();
        queued.name = QUEUED.into();
        queued.mode = Some(Mode::Queue);
        c.providers.push(queued);
    })
    .await;
    let shots = screenshots();
    seed(&app).await;
    for (at, body) in app.db.raw_bodies().await {
        let hostile = HOSTILE.as_bytes();
        assert!(
            !body.windows(hostile.len()).any(|w| w == hostile),
            "{at} in plain"
        );
    }

    let browser = Browser::start(Path::new(env!("CARGO_TARGET_TMPDIR"))).await;
    let console = format!("{}/admin/", app.address);

    // With scripts off the page says why it is empty.
    browser.goto(&console).await;
    let noscript = browser
        .script(
            "const n = document.querySelector('noscript'); return n ? n.textContent : ''",
            json!([]),
        )
        .await;
    assert!(
        noscript.as_str().is_some_and(|t| t.contains("JavaScript")),
        "{noscript}"
    );
    // The token is not a password a browser offers to save: no password field, no form.
    assert_eq!(browser.count("input[type=password], #login form").await, 0);

    // Log in: a token the node cannot check (its store is gone) is not kept, and the
    // message says the node failed, not the token; a wrong token is refused and not kept;
    // the right one opens the overview and is kept, the field emptied.
    proxy.cut();
    browser.type_into("#token", TOKEN).await;
    browser.click("#login-button").await;
    browser
        .wait_text("#login-error", "could not be checked")
        .await;
    assert_eq!(stored_token(&browser).await, json!(null), "kept unchecked");
    proxy.restore();
    eventually("the store to answer again", || async {
        app.get("/readyz").await.status == 200
    })
    .await;
    browser.type_into("#token", "wrong").await;
    browser.click("#login-button").await;
    browser.wait_text("#login-error", "refused").await;
    assert_eq!(
        stored_token(&browser).await,
        json!(null),
        "kept when refused"
    );
    browser.type_into("#token", TOKEN).await;
    browser.click("#login-button").await;
    browser.wait_text("#overview h1", "Overview").await;
    assert_eq!(stored_token(&browser).await, json!(TOKEN));
    let field = browser
        .script("return document.getElementById('token').value", json!([]))
        .await;
    assert_eq!(field, json!(""), "the token left in its field");
    let mode = browser
        .script("return document.compatMode", json!([]))
        .await;
    assert_eq!(mode, "CSS1Compat", "the page renders in standards mode");
    let dead_cell = format!("[data-provider={PROVIDER}] td[data-status=dead]");
    browser.wait_text(&dead_cell, "3").await;
    browser.wait_text("#counts-age", "counted").await;
    browser.screenshot(&shots.join("overview.png")).await;

    // Events, filtered by status, then paged two at a time.
    browser.click("#nav-events").await;
    browser.wait_count("#events-table .event-row", 6).await;
    browser.click("#f-status option[value=dead]").await;
    browser.click("#apply").await;
    browser.wait_count("#events-table .event-row", 3).await;
    assert_eq!(
        shown_keys(&browser).await,
        ["evt_dead1", "evt_dead2", "evt_dead3"]
    );
    browser.screenshot(&shots.join("events.png")).await;
    browser
        .goto(&format!("{console}#/events?status=dead&limit=2"))
        .await;
    browser.wait_count("#events-table .event-row", 2).await;
    let first = shown_keys(&browser).await;
    browser.click("#next-page").await;
    browser.wait_count("#events-table .event-row", 1).await;
    let mut all = [first, shown_keys(&browser).await].concat();
    all.sort();
    assert_eq!(all, ["evt_dead1", "evt_dead2", "evt_dead3"]);
    browser.click("#prev-page").await;
    browser.wait_count("#events-table .event-row", 2).await;

    // A time range (Unix seconds in the address): all of them changed within the hour.
    let hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs()
        - 3600;
    browser
        .goto(&format!("{console}#/events?updated_after={hour_ago}"))
        .await;
    browser.wait_count("#events-table .event-row", 6).await;
    browser
        .goto(&format!("{console}#/events?updated_before={hour_ago}"))
        .await;
    browser.wait_text("#events-table", "No events match").await;

    // The event with three attempts: its timeline, and its payload and headers as text.
    browser
        .goto(&format!("{console}#/events?key_prefix=evt_timeline"))
        .await;
    browser.click("a[href='#/event/stripe/evt_timeline']").await;
    browser.wait_count("#timeline li.attempt", 3).await;
    let outcomes = browser
        .script(
            "return [...document.querySelectorAll('#timeline li')].map(li => li.dataset.outcome)",
            json!([]),
        )
        .await;
    assert_eq!(outcomes, json!(["failed", "failed", "done"]));
    let payload = browser.wait_text("#payload", HOSTILE).await;
    assert!(payload.contains("evt_timeline"), "{payload}");
    assert_eq!(browser.count("#payload img, #payload script").await, 0);
    browser.wait_text("#headers", HOSTILE_AGENT).await;
    assert_eq!(browser.count("#headers img, main img").await, 0);
    assert_eq!(browser.alert_text().await, None, "a dialog opened");
    let event_png = shots.join("event.png");
    browser.screenshot(&event_png).await;

    // An event a target throttled for long: its latest page of attempts and their number,
    // then the page before it on request.
    app.db.fill_history(PROVIDER, "evt_throttled", 120).await;
    browser
        .goto(&format!("{console}#/event/{PROVIDER}/evt_throttled"))
        .await;
    browser.wait_count("#timeline li.attempt", 50).await;
    browser
        .wait_text("#attempts-shown", "The latest 50 of 120.")
        .await;
    browser.click("#older-attempts").await;
    browser.wait_count("#timeline li.attempt", 100).await;
    let first = browser
        .script(
            "return document.querySelector('#timeline li').dataset.attempt",
            json!([]),
        )
        .await;
    assert_eq!(first, "21", "the older page comes first");

    // Bulk replay of the dead letters: plan (a count), confirm, progress until done.
    app.target.set(Behaviour::Accept);
    browser.click("#nav-dead").await;
    browser.wait_count("#events-table .event-row", 3).await;
    browser.click("#plan").await;
    browser
        .wait_text("#plan-count", "3 dead letters match")
        .await;
    browser.screenshot(&shots.join("dead.png")).await;
    browser.click("#plan-confirm").await;
    browser.wait_text("#job-state", "done").await;
    browser
        .wait_text("#job-counts", "3 replayed, 0 failed, of 3")
        .await;
    for key in ["evt_dead1", "evt_dead2", "evt_dead3"] {
        app.target.wait_for(&TestApp::idem(key), 2).await;
    }
    assert!(cancel_hidden(&browser).await);
    browser.screenshot(&shots.join("job.png")).await;
    // A job's address is decoded once: the node is asked for job `<x>`, not `%3Cx%3E`.
    browser.goto(&format!("{console}#/jobs/%3Cx%3E")).await;
    browser
        .wait_text("#view .error-box", "replay job <x>")
        .await;

    // A running job is cancelled: the target holds its first replay meanwhile, and the
    // job replays nothing more once that one ends.
    let cancelled = ["evt_cancel1", "evt_cancel2"].map(TestApp::idem);
    app.target.set(Behaviour::Status(400));
    for key in ["evt_cancel1", "evt_cancel2"] {
        dead_letter(&app, key).await;
    }
    app.target.set(Behaviour::Hang);
    browser.click("#nav-dead").await;
    browser.wait_count("#events-table .event-row", 2).await;
    browser.click("#plan").await;
    browser
        .wait_text("#plan-count", "2 dead letters match")
        .await;
    browser.click("#plan-confirm").await;
    let replays = || cancelled.iter().map(|k| app.target.count(k)).sum::<usize>();
    eventually("a replay held at the target", || async { replays() == 3 }).await;
    browser.wait_text("#job-state", "running").await;
    browser.click("#job-cancel").await;
    browser.wait_text("#job-state", "cancelled").await;
    assert!(cancel_hidden(&browser).await);
    app.target.release();
    eventually("the held replay to end", || async {
        let mut statuses = Vec::new();
        for key in ["evt_cancel1", "evt_cancel2"] {
            statuses.push(app.db.status(PROVIDER, key).await);
        }
        statuses.iter().any(|s| s.as_deref() == Some("done"))
    })
    .await;

    // Pause the queue provider: an event queued meanwhile waits; resume: it arrives.
    let queued_key = format!("{QUEUED}:evt_q1");
    browser.click("#nav-overview").await;
    browser
        .click(&format!("button.pause[data-provider={QUEUED}]"))
        .await;
    browser
        .wait_text(&format!("[data-provider={QUEUED}] .state"), "paused")
        .await;
    let answer = app
        .post(
            &format!("/webhooks/{QUEUED}"),
            &[("X-Idempotency-Key", "evt_q1")],
            r#"{"id":"evt_q1"}"#.into(),
        )
        .await;
    assert_eq!(answer.status, 202, "{answer:?}");
    app.scheduler.run_once().await.expect("a scheduler pass");
    assert_eq!(
        app.db.status(QUEUED, "evt_q1").await.as_deref(),
        Some("queued")
    );
    assert_eq!(app.target.count(&queued_key), 0, "delivered while paused");
    browser.goto(&console).await;
    browser
        .wait_text(&format!("[data-provider={QUEUED}] .queue-rows"), "1")
        .await;
    browser.screenshot(&shots.join("paused.png")).await;
    assert_eq!(app.target.count(&queued_key), 0, "delivered while paused");
    browser
        .click(&format!("button.resume[data-provider={QUEUED}]"))
        .await;
    browser
        .wait_text(&format!("[data-provider={QUEUED}] .state"), "running")
        .await;
    app.target.wait_for(&queued_key, 1).await;
    eventually("the queued event to be done", || async {
        app.db.status(QUEUED, "evt_q1").await.as_deref() == Some("done")
    })
    .await;
    // A target that asks for an hour holds its provider for a bounded time, shown on the
    // provider's card; a resume ends it.
    app.target.set(Behaviour::Throttle(429, "3600"));
    let answer = app
        .post(
            &format!("/webhooks/{QUEUED}"),
            &[("X-Idempotency-Key", "evt_q2")],
            r#"{"id":"evt_q2"}"#.into(),
        )
        .await;
    assert_eq!(answer.status, 202, "{answer:?}");
    eventually("the throttled event to be failed", || async {
        app.db.status(QUEUED, "evt_q2").await.as_deref() == Some("failed")
    })
    .await;
    app.target.set(Behaviour::Accept);
    browser.goto(&console).await;
    let badge = format!("[data-provider={QUEUED}] .target-pause");
    let shown = browser.wait_text(&badge, "target asked for time").await;
    assert!(shown.contains("s left"), "{shown}");
    browser
        .click(&format!("button.resume[data-provider={QUEUED}]"))
        .await;
    browser.wait_count(&badge, 0).await;
    assert_eq!(browser.alert_text().await, None, "a dialog opened");
    // A refresh that fails says so and marks what is shown as stale, until one succeeds.
    proxy.cut();
    browser
        .wait_text("#overview #stale", "could not be refreshed")
        .await;
    assert_eq!(browser.count("#overview .grid.stale").await, 1);
    browser.screenshot(&shots.join("stale.png")).await;
    proxy.restore();
    browser
        .wait_until("the stale banner to go", || async {
            let hidden = browser
                .script(
                    "return document.getElementById('stale').hidden \
                     && !document.querySelector('#overview .stale')",
                    json!([]),
                )
                .await;
            (hidden == json!(true)).then_some(())
        })
        .await;
    // Seconds after the cancelled job's held replay ended, it has replayed nothing more.
    assert_eq!(replays(), 3, "the cancelled job went on");

    // The dead letter the cancelled job left is replayed from its own page.
    let mut left = None;
    for key in ["evt_cancel1", "evt_cancel2"] {
        if app.db.status(PROVIDER, key).await.as_deref() == Some("dead") {
            left = Some(key);
        }
    }
    let left = left.expect("one dead letter left by the cancelled job");
    browser
        .goto(&format!("{console}#/event/{PROVIDER}/{left}"))
        .await;
    browser.wait_text("#event-row", "dead").await;
    browser.click("#replay").await;
    browser.wait_text("#flash", "now done").await;
    browser.wait_text("#event-row", "replay").await;
    assert_eq!(app.target.count(&TestApp::idem(left)), 2);
    assert_eq!(browser.alert_text().await, None, "a dialog opened");

    // Keys a URL path cannot carry open from the dead letters' list, again from their own
    // page's address, and are replayed from there.
    app.target.set(Behaviour::Status(400));
    for key in ODD_KEYS {
        dead_letter(&app, key).await;
    }
    app.target.set(Behaviour::Accept);
    for key in ODD_KEYS {
        browser.goto(&format!("{console}#/dead")).await;
        browser
            .click(&format!("#events-table tr.event-row[data-key=\"{key}\"] a"))
            .await;
        shows_event(&browser, key).await;
        let address = browser.script("return location.href", json!([])).await;
        browser.goto(&console).await;
        browser.wait_text("#overview h1", "Overview").await;
        browser.goto(address.as_str().expect("an address")).await;
        shows_event(&browser, key).await;
        browser.wait_text("#event-row", "dead").await;
        browser.click("#replay").await;
        browser.wait_text("#flash", "now done").await;
        browser.wait_text("#event-row", "replay").await;
        let at_target = EventId::new(PROVIDER, key).header_value();
        assert_eq!(app.target.count(&at_target), 2, "{key}");
    }
    assert_eq!(browser.alert_text().await, None, "a dialog opened");
}

/// Keys that a URL path collapses (`..`, `.`, percent-encoded or not) or splits (`/`, `?`,
/// `#`): senders choose keys, so the console must carry each as it is.
const ODD_KEYS: [&str; 6] = ["..", ".", "a/b", "%2e%2e", "q?x=1", "h#x"];

/// Waits until the event page shows the event keyed `key`.
async fn shows_event(browser: &Browser, key: &str) {
    browser
        .wait_until(&format!("the event page of {key:?}"), || async {
            let shown = browser
                .script(
                    "const h = document.querySelector('#event h1 .mono'); \
                     return h ? h.textContent : null",
                    json!([]),
                )
                .await;
            (shown == json!(key)).then_some(())
        })
        .await;
}

/// The token the console keeps in the tab's `sessionStorage` (null: none).
async fn stored_token(browser: &Browser) -> serde_json::Value {
    browser
        .script("return sessionStorage.getItem('hookgate.token')", json!([]))
        .await
}

/// Whether the job page's Cancel button is hidden (the job no longer runs).
async fn cancel_hidden(browser: &Browser) -> bool {
    browser
        .script(
            "return document.getElementById('job-cancel').hidden",
            json!([]),
        )
        .await
        == json!(true)
}

/// Makes `key` a dead letter (the target must answer 400).
async fn dead_letter(app: &TestApp, key: &str) {
    let answer = app.deliver(key, r#"{"id":"dead"}"#).await;
    assert_eq!(answer.body, r#"{"status":"dead_lettered"}"#, "{key}");
}

/// The page, its script and its style sheet come with the strict headers and need no token
/// (the page asks for it); without an admin token configured they are not there at all.
#[actix_web::test]
async fn the_console_files_carry_a_strict_content_security_policy() {
    let app = spawn_app_on(Backend::Postgres, |c| {
        c.admin.token = Some(Secret::new(TOKEN))
    })
    .await;
    let client = awc::Client::builder().disable_redirects().finish();
    for (path, kind) in [
        ("/admin/", "text/html"),
        ("/admin/console.js", "text/javascript"),
        ("/admin/console.css", "text/css"),
    ] {
        let response = client
            .get(format!("{}{path}", app.address))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "{path}");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(header("content-type").starts_with(kind), "{path}");
        assert_eq!(
            header("content-security-policy"),
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            "{path}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
        assert_eq!(header("cache-control"), "no-store", "{path}");
        assert_eq!(header("set-cookie"), "", "{path}");
    }
    let bare = client
        .get(format!("{}/admin", app.address))
        .send()
        .await
        .expect("request");
    assert_eq!(bare.status(), 308);
    assert_eq!(bare.headers().get("location").unwrap(), "/admin/");

    let closed = spawn_app_on(Backend::Postgres, |_| {}).await;
    for path in [
        "/admin/",
        "/admin/console.js",
        "/admin/console.css",
        "/admin",
    ] {
        assert_eq!(closed.get(path).await.status, 404, "{path}");
    }
}

/// Two done events, one that failed twice before it was done (with a hostile payload and
/// header), and three dead letters.
async fn seed(app: &TestApp) {
    for key in ["evt_ok1", "evt_ok2"] {
        assert_eq!(app.deliver(key, r#"{"id":"ok"}"#).await.status, 201);
    }
    let body = json!({ "id": "evt_timeline", "note": HOSTILE }).to_string();
    let headers = [
        ("X-Idempotency-Key", "evt_timeline"),
        ("User-Agent", HOSTILE_AGENT),
    ];
    let path = format!("/webhooks/{PROVIDER}");
    app.target.set(Behaviour::Status(503));
    for _ in 0..2 {
        let failed = app.post(&path, &headers, body.clone()).await;
        assert_eq!(failed.status, 503, "{failed:?}");
    }
    app.target.set(Behaviour::Accept);
    let done = app.post(&path, &headers, body).await;
    assert_eq!(done.status, 201, "{done:?}");
    assert_eq!(done.attempt, Some(3));

    app.target.set(Behaviour::Status(400));
    for key in ["evt_dead1", "evt_dead2", "evt_dead3"] {
        dead_letter(app, key).await;
    }
    app.target.set(Behaviour::Accept);
}

/// The keys the events table shows, sorted.
async fn shown_keys(browser: &Browser) -> Vec<String> {
    let keys = browser
        .script(
            "return [...document.querySelectorAll('#events-table .event-row')]\
             .map(r => r.dataset.key)",
            json!([]),
        )
        .await;
    let mut keys: Vec<String> = serde_json::from_value(keys).expect("keys");
    keys.sort();
    keys
}

/// `target/console-screenshots/`, created.
fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

/// Every answer under `/admin/` — the API's, the older routes', a redirect, and errors
/// (401, 404, 400) — says not to cache it and not to sniff its type: payloads and kept
/// headers must not stay in a browser's or a proxy's cache.
#[actix_web::test]
async fn every_admin_answer_is_marked_not_to_be_stored_or_sniffed() {
    let app = spawn_app_on(Backend::Postgres, |c| {
        c.admin.token = Some(Secret::new(TOKEN))
    })
    .await;
    app.target.set(Behaviour::Status(400));
    dead_letter(&app, "evt_cached").await;
    app.target.set(Behaviour::Accept);
    let client = awc::Client::builder().disable_redirects().finish();
    let bearer = format!("Bearer {TOKEN}");
    let key = format!("{PROVIDER}/evt_cached");
    for (method, path, auth, status) in [
        ("GET", "/admin/api/stats".to_owned(), true, 200),
        ("GET", "/admin/api/events?status=dead".to_owned(), true, 200),
        ("GET", format!("/admin/api/events/{key}"), true, 200),
        (
            "GET",
            format!("/admin/api/events/{PROVIDER}/nope"),
            true,
            404,
        ),
        (
            "GET",
            "/admin/api/events?status=bogus".to_owned(),
            true,
            400,
        ),
        ("GET", "/admin/api/replays".to_owned(), true, 200),
        ("GET", "/admin/api/replays/x".to_owned(), true, 404),
        ("GET", "/admin/api/stats".to_owned(), false, 401),
        ("GET", "/admin/api/no-such-call".to_owned(), true, 404),
        ("POST", "/admin/api/stats".to_owned(), true, 404),
        ("GET", format!("/admin/events/{key}"), true, 200),
        ("GET", "/admin/dead".to_owned(), true, 200),
        ("GET", "/admin/dead".to_owned(), false, 401),
        ("POST", format!("/admin/dead/{key}/replay"), true, 200),
        ("GET", "/admin".to_owned(), false, 308),
        ("GET", "/admin/".to_owned(), false, 200),
    ] {
        let method = awc::http::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = client.request(method.clone(), format!("{}{path}", app.address));
        if auth {
            request = request.insert_header(("Authorization", bearer.as_str()));
        }
        let response = request.send().await.expect("request");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let what = format!("{method} {path}");
        assert_eq!(response.status().as_u16(), status, "{what}");
        assert_eq!(header("cache-control"), "no-store", "{what}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{what}");
    }
}
