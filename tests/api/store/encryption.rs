//! Encryption at rest, on both stores: what the tables hold (no body in plain), what
//! operators read (every body whole), a sealed body moved to another row (it does not
//! open), a key no longer configured or encryption turned off (named where it is read), keyed fingerprints, rows
//! written before encryption was on (read as they stand, then sealed by a rekey), and a
//! rotation under live deliveries (no duplicate, nothing left under the old key).

use std::sync::Arc;

use hookgate::key::EventId;
use hookgate::operator_work::rekey::Rekey;
use hookgate::seal::{sealed_id, sealed_text_id};
use hookgate::secret::Secret;
use hookgate::store::StoreError;
use serde_json::Value;

use crate::helpers::{
    bearer, dead_letter, eventually, key_text, keyring, spawn_app_on, Backend, Behaviour, TestApp,
    PROVIDER,
};

const TOKEN: &str = "encryption-admin-token";
/// Text in a payload, a kept header and a target's error page, to look for in the tables.
const PAYLOAD_MARK: &str = "PAYLOADMARK-4242";
const HEADER_MARK: &str = "HEADERMARK-agent";
const PAGE_MARK: &str = "upstream down";

/// A node whose store seals with the test keys `ids`, keeping every payload, with the
/// admin API on.
async fn sealed_app(backend: Backend, ids: &'static [&'static str]) -> TestApp {
    spawn_app_on(backend, |c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.providers[0].keep_payload = serde_json::from_value(serde_json::json!("always")).unwrap();
        c.store.encryption = sealed(c, ids);
    })
    .await
}

fn sealed(c: &hookgate::config::Config, ids: &[&str]) -> hookgate::config::EncryptionConfig {
    let mut encryption = c.store.encryption.clone();
    encryption.keys = ids
        .iter()
        .map(|id| hookgate::config::KeyConfig {
            id: (*id).into(),
            env: format!("HOOKGATE_TEST_KEY_{id}"),
        })
        .collect();
    encryption.keyring = Some(keyring(ids));
    encryption
}

/// Delivers `key` with a marked payload and a marked `User-Agent` (a kept header).
async fn deliver_marked(app: &TestApp, key: &str) -> crate::helpers::Answer {
    let body = format!(r#"{{"id":"{key}","card":"{PAYLOAD_MARK}"}}"#);
    app.post(
        &format!("/webhooks/{PROVIDER}"),
        &[("X-Idempotency-Key", key), ("User-Agent", HEADER_MARK)],
        body,
    )
    .await
}

async fn admin_get(app: &TestApp, path: &str) -> (u16, Value) {
    let answer = app.get_with(path, &bearer(TOKEN)).await;
    (
        answer.status,
        serde_json::from_str(&answer.body).unwrap_or(Value::Null),
    )
}

/// A row of each kind: done (cached answer, kept payload and headers) and dead after a
/// failure whose error page is in the history. The tables hold none of it in plain, every
/// body is sealed by the key; the admin API and `hookgate dead show` read it whole.
async fn the_tables_hold_no_body_in_plain_and_operators_read_every_one(backend: Backend) {
    let app = sealed_app(backend, &["2026-12"]).await;
    assert_eq!(deliver_marked(&app, "evt_done").await.status, 201);
    app.target.set(Behaviour::LargePage(500, 2000));
    assert_eq!(deliver_marked(&app, "evt_dead").await.status, 503);
    app.target.set(Behaviour::Status(400));
    assert_eq!(deliver_marked(&app, "evt_dead").await.status, 200);
    app.wait_status("evt_dead", "dead").await;
    app.target.set(Behaviour::Accept);

    let bodies = app.db.raw_bodies().await;
    for column in ["payload", "result_body", "request_headers", "answer"] {
        assert!(
            bodies.iter().any(|(at, _)| at.starts_with(column)),
            "no {column} stored: {bodies:?}"
        );
    }
    for (at, bytes) in &bodies {
        let sealer =
            sealed_id(bytes).or_else(|| std::str::from_utf8(bytes).ok().and_then(sealed_text_id));
        assert_eq!(sealer, Some("2026-12"), "{at} is not sealed");
        for mark in [PAYLOAD_MARK, HEADER_MARK, PAGE_MARK, "received"] {
            assert!(!contains(bytes, mark), "{at} holds {mark:?} in plain");
        }
    }
    let file = app.db.file_bytes();
    for mark in [PAYLOAD_MARK, HEADER_MARK, PAGE_MARK] {
        assert!(!contains(&file, mark), "the SQLite file holds {mark:?}");
    }

    // Read back whole: the duplicate's cached answer, the admin API, the command line.
    let duplicate = deliver_marked(&app, "evt_done").await;
    assert_eq!(
        (duplicate.status, duplicate.path.as_str()),
        (201, "duplicate_done")
    );
    assert!(duplicate.body.contains("received"), "{}", duplicate.body);
    let (status, event) = admin_get(&app, &format!("/admin/api/events/{PROVIDER}/evt_dead")).await;
    assert_eq!(status, 200, "{event}");
    assert!(
        event["payload"].as_str().unwrap().contains(PAYLOAD_MARK),
        "{event}"
    );
    assert_eq!(
        event["request_headers"]["user-agent"], HEADER_MARK,
        "{event}"
    );
    let answers: Vec<&str> = event["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["answer"].as_str())
        .collect();
    assert!(answers.iter().any(|a| a.contains(PAGE_MARK)), "{event}");

    let env = [("HOOKGATE_TEST_STORE_KEY", key_text("2026-12"))];
    let out = cli(
        &app,
        &["dead", "show", PROVIDER, "evt_dead"],
        &[("2026-12", "HOOKGATE_TEST_STORE_KEY")],
        &env,
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(PAYLOAD_MARK), "{stdout}");
}

/// A sealed payload copied over another row's (by someone with the database, not the key)
/// does not open there: the admin API names the row and the column, a replay delivers
/// nothing, and the row it came from still reads.
async fn a_body_moved_to_another_row_does_not_open(backend: Backend) {
    let app = sealed_app(backend, &["k1"]).await;
    dead_letter(&app, "evt_a").await;
    dead_letter(&app, "evt_b").await;
    app.db.copy_payload(PROVIDER, "evt_a", "evt_b").await;

    let (status, body) = admin_get(&app, &format!("/admin/api/events/{PROVIDER}/evt_b")).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"], "unreadable", "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("evt_b") && message.contains("payload"),
        "{message}"
    );
    let read = app
        .store
        .operator()
        .event(&EventId::new(PROVIDER, "evt_b"))
        .await;
    assert!(matches!(read, Err(StoreError::Sealed(_))), "{read:?}");
    let (status, _) = admin_get(&app, &format!("/admin/api/events/{PROVIDER}/evt_a")).await;
    assert_eq!(status, 200);

    let before = app.target.total();
    let replay = app
        .post(
            &format!("/admin/dead/{PROVIDER}/evt_b/replay"),
            &[("Authorization", &bearer(TOKEN))],
            String::new(),
        )
        .await;
    assert_ne!(replay.status, 200, "{}", replay.body);
    assert_eq!(
        app.target.total(),
        before,
        "a body that does not open was delivered"
    );
    // Refused before the row was reopened: still the dead letter it was.
    assert_eq!(
        app.db.status(PROVIDER, "evt_b").await.as_deref(),
        Some("dead")
    );
}

/// Rows sealed by a key that is no longer configured: every read names the key — the
/// store, the admin API, `hookgate dead show` — and `check-config --rows` fails naming it.
async fn a_key_no_longer_configured_is_named_where_a_row_is_read(backend: Backend) {
    let app = sealed_app(backend, &["old"]).await;
    dead_letter(&app, "evt_old").await;
    let only_new = app.db.sealed_store(&["new"]).await;
    let read = only_new
        .operator()
        .event(&EventId::new(PROVIDER, "evt_old"))
        .await;
    let Err(StoreError::Sealed(why)) = read else {
        panic!("read a row sealed by a missing key: {read:?}");
    };
    assert!(why.to_string().contains("\"old\""), "{why}");
    // With encryption off, a sealed body is refused the same way: never read as bytes.
    let plain = app.db.store().await;
    let id = EventId::new(PROVIDER, "evt_old");
    let read = plain.operator().event(&id).await;
    assert!(matches!(read, Err(StoreError::Sealed(_))), "{read:?}");
    let replayed = plain.replay(&id, std::time::Duration::from_secs(30)).await;
    assert!(
        matches!(replayed, Err(StoreError::Sealed(_))),
        "{replayed:?}"
    );

    let env = [("HOOKGATE_TEST_STORE_KEY", key_text("new"))];
    let keys = [("new", "HOOKGATE_TEST_STORE_KEY")];
    let out = cli(&app, &["dead", "show", PROVIDER, "evt_old"], &keys, &env).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("\"old\""), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("\"id\":\"x\""));
    let out = cli(&app, &["check-config", "--rows"], &keys, &env).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("\"old\"")),
        "{stdout}"
    );
    // Encryption turned off over sealed rows: the same check fails.
    let out = cli(&app, &["check-config", "--rows"], &[], &[]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("\"old\"")),
        "{stdout}"
    );
}

/// A queue row whose payload does not open never holds up a batch take: the others are
/// handed over opened, and it is handed over marked unreadable (why, naming the column),
/// its stored value as it is, for its attempt to end it; a read of that row names why.
async fn a_row_that_does_not_open_never_holds_up_a_batch_take(backend: Backend) {
    let db = crate::helpers::TestDb::on(backend).await;
    let store = db.sealed_store(&["q"]).await;
    for key in ["evt_q1", "evt_q2", "evt_q3"] {
        let row = hookgate::store::QueueRow {
            id: EventId::new(PROVIDER, key),
            fingerprint: None,
            payload: format!(r#"{{"id":"{key}"}}"#).into_bytes().into(),
            content_type: Some("application/json".into()),
            headers: None,
            keep_payload: false,
            start: None,
        };
        store.enqueue(&row).await.unwrap();
    }
    db.copy_payload(PROVIDER, "evt_q1", "evt_q2").await;
    let lease = std::time::Duration::from_secs(30);
    let taken = store.take_due(PROVIDER, 10, lease, &[]).await.unwrap();
    let mut keys: Vec<&str> = taken.iter().map(|t| &*t.id.key).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["evt_q1", "evt_q2", "evt_q3"]);
    for t in &taken {
        if &*t.id.key == "evt_q2" {
            let why = t.unreadable.as_deref().unwrap_or_default();
            assert!(why.contains("evt_q2") && why.contains("payload"), "{why}");
            assert!(
                sealed_id(&t.payload).is_some(),
                "the stored value, as it is"
            );
        } else {
            assert_eq!(t.unreadable, None);
            assert!(t.payload.starts_with(b"{\"id\""));
        }
    }
    let read = store
        .operator()
        .event(&EventId::new(PROVIDER, "evt_q2"))
        .await;
    assert!(matches!(read, Err(StoreError::Sealed(_))), "{read:?}");
}

/// Fingerprints are keyed (not the payload's plain hash, which a small payload could be
/// guessed from) and still catch another payload under a known key.
async fn fingerprints_are_keyed_and_still_catch_another_payload(backend: Backend) {
    let app = sealed_app(backend, &["fp"]).await;
    assert_eq!(
        app.deliver("evt_fp", r#"{"id":"1","n":1}"#).await.status,
        201
    );
    let (_, event) = admin_get(&app, &format!("/admin/api/events/{PROVIDER}/evt_fp")).await;
    let fingerprint = event["fingerprint"].as_str().unwrap().to_owned();
    assert!(fingerprint.starts_with("k:fp:"), "{fingerprint}");
    let plain = hookgate::canonical::canonical_hash(&serde_json::json!({"id":"1","n":1}));
    assert!(!fingerprint.contains(&plain));
    let other = app.deliver("evt_fp", r#"{"id":"1","n":2}"#).await;
    assert_eq!(
        (other.status, other.path.as_str()),
        (422, "payload_mismatch")
    );
    let same = app.deliver("evt_fp", r#"{"n":1,"id":"1"}"#).await;
    assert_eq!(same.path, "duplicate_done");
}

/// Turning encryption on over rows written without it: they read as they stand (answers,
/// payloads, fingerprints that cannot be compared, so no false mismatch), and the admin
/// API's rekey job seals every one of them.
async fn rows_from_before_encryption_read_as_they_stand_until_a_rekey_seals_them(backend: Backend) {
    let plain = spawn_app_on(backend, |c| {
        c.providers[0].keep_payload = serde_json::from_value(serde_json::json!("always")).unwrap();
    })
    .await;
    for key in ["evt_p1", "evt_p2", "evt_p3"] {
        assert_eq!(deliver_marked(&plain, key).await.status, 201);
    }
    plain.target.set(Behaviour::LargePage(500, 600));
    assert_eq!(deliver_marked(&plain, "evt_p4").await.status, 503);
    plain.target.set(Behaviour::Accept);
    assert!(plain
        .db
        .raw_bodies()
        .await
        .iter()
        .any(|(_, b)| contains(b, PAYLOAD_MARK)));

    let app = plain
        .second_node(|c| {
            c.admin.token = Some(Secret::new(TOKEN));
            c.store.encryption = sealed(c, &["k1"]);
        })
        .await;
    let duplicate = deliver_marked(&app, "evt_p1").await;
    assert_eq!(
        (duplicate.status, duplicate.path.as_str()),
        (201, "duplicate_done")
    );
    assert!(duplicate.body.contains("evt_p1"), "{}", duplicate.body);
    assert_eq!(deliver_marked(&app, "evt_p4").await.status, 201);

    let started = app
        .post(
            "/admin/api/store/rekey?batch=2",
            &[("Authorization", &bearer(TOKEN))],
            String::new(),
        )
        .await;
    assert_eq!(started.status, 202, "{}", started.body);
    eventually("the rekey job to end", || async {
        admin_get(&app, "/admin/api/store/rekey").await.1["running"] == false
    })
    .await;
    let status = admin_get(&app, "/admin/api/store/rekey").await.1;
    assert_eq!(status["progress"]["done"], true, "{status}");
    assert!(
        status["progress"]["resealed"].as_u64().unwrap() >= 4,
        "{status}"
    );
    assert_eq!(status["progress"]["unreadable"], 0, "{status}");
    for (at, bytes) in app.db.raw_bodies().await {
        for mark in [PAYLOAD_MARK, HEADER_MARK, PAGE_MARK] {
            assert!(!contains(&bytes, mark), "{at} still holds {mark:?}");
        }
    }
    let (status, event) = admin_get(&app, &format!("/admin/api/events/{PROVIDER}/evt_p2")).await;
    assert_eq!(status, 200);
    assert!(
        event["payload"].as_str().unwrap().contains(PAYLOAD_MARK),
        "{event}"
    );
    let again = Rekey::new(Arc::clone(&app.store), true).unwrap();
    assert_eq!(counted(again).await, 0);
}

/// Rotation beside live traffic: rows sealed by `old`, then a node sealing by `new` (and
/// opening `old`) takes new events and redeliveries of the old ones while a rekey runs on
/// it and a second rekey on another store: every event reaches the target exactly as many
/// times as before (new ones once), and afterwards no body needs `old`.
async fn rotation_beside_deliveries_runs_nothing_twice_and_leaves_nothing_under_the_old_key(
    backend: Backend,
) {
    let old = sealed_app(backend, &["old"]).await;
    for i in 0..20 {
        assert_eq!(deliver_marked(&old, &format!("evt_o{i}")).await.status, 201);
    }
    old.target.set(Behaviour::Status(500));
    for i in 0..5 {
        assert_eq!(deliver_marked(&old, &format!("evt_f{i}")).await.status, 503);
    }
    old.target.set(Behaviour::Accept);
    let before: Vec<(String, usize)> = (0..20)
        .map(|i| format!("evt_o{i}"))
        .chain((0..5).map(|i| format!("evt_f{i}")))
        .map(|k| {
            let n = old.target.count(&TestApp::idem(&k));
            (k, n)
        })
        .collect();

    let new = old
        .second_node(|c| {
            c.providers[0].keep_payload =
                serde_json::from_value(serde_json::json!("always")).unwrap();
            c.store.encryption = sealed(c, &["new", "old"]);
        })
        .await;
    let other_rekeyer = new.db.sealed_store(&["new", "old"]).await;
    let keys: Vec<String> = (0..20)
        .flat_map(|i| [format!("evt_n{i}"), format!("evt_o{i}")])
        .chain((0..5).map(|i| format!("evt_f{i}")))
        .collect();
    let deliveries = futures_util::future::join_all(keys.iter().map(|k| deliver_marked(&new, k)));
    let rekeys = async {
        let mut a = Rekey::new(Arc::clone(&new.store), false).unwrap();
        let mut b = Rekey::new(other_rekeyer, false).unwrap();
        let (mut more_a, mut more_b) = (true, true);
        while more_a || more_b {
            if more_a {
                more_a = a.run_once(3).await.unwrap();
            }
            if more_b {
                more_b = b.run_once(5).await.unwrap();
            }
        }
        (a.progress().clone(), b.progress().clone())
    };
    let (answers, (a, b)) = futures_util::future::join(deliveries, rekeys).await;
    for answer in &answers {
        assert!([201, 200].contains(&answer.status), "{answer:?}");
    }
    assert_eq!(a.unreadable + b.unreadable, 0, "{a:?} {b:?}");
    assert!(a.resealed + b.resealed > 0, "{a:?} {b:?}");
    for (key, n) in &before {
        let expected = if key.starts_with("evt_f") { n + 1 } else { *n };
        assert_eq!(new.target.count(&TestApp::idem(key)), expected, "{key}");
    }
    for i in 0..20 {
        assert_eq!(new.target.count(&TestApp::idem(&format!("evt_n{i}"))), 1);
    }

    // Whatever the live writes and the two rekeys did, one more pass finds nothing old.
    let mut last = Rekey::new(Arc::clone(&new.store), false).unwrap();
    while last.run_once(50).await.unwrap() {}
    let check = Rekey::new(Arc::clone(&new.store), true).unwrap();
    assert_eq!(counted(check).await, 0);
    let only_new = new.db.sealed_store(&["new"]).await;
    for key in before.iter().map(|(k, _)| k.as_str()) {
        let id = EventId::new(PROVIDER, key);
        let row = only_new.operator().event(&id).await.unwrap().unwrap();
        assert!(
            contains(row.payload.as_deref().unwrap(), PAYLOAD_MARK),
            "{key}"
        );
        only_new.operator().history(&id, None, 50).await.unwrap();
    }
}

/// Bodies a check-only rekey finds not under the sealing key.
async fn counted(mut check: Rekey) -> u64 {
    while check.run_once(100).await.unwrap() {}
    check.progress().stale.values().sum()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Runs the command line on `app`'s store sealing with `keys` (`(id, variable)`), with
/// `env` set.
async fn cli(
    app: &TestApp,
    args: &[&str],
    keys: &[(&str, &str)],
    env: &[(&str, String)],
) -> std::process::Output {
    let keys: Vec<String> = keys
        .iter()
        .map(|(id, var)| format!("{{ id = \"{id}\", env = \"{var}\" }}"))
        .collect();
    let dir = std::env::temp_dir().join(format!("hookgate-sealed-cli-{}", fastrand::u32(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("hookgate.toml");
    let schema = if app.db.schema.is_empty() {
        String::new()
    } else {
        format!("schema = \"{}\"\n", app.db.schema)
    };
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"{}\"\n{schema}encryption = {{ keys = [{}] }}\n[[providers]]\n\
             name = \"{PROVIDER}\"\npreset = \"none\"\nkey = [{{ header = \"X-Idempotency-Key\" }}]\n\
             target = {{ url = \"{}\" }}\n",
            app.db.url,
            keys.join(", "),
            app.target.url
        ),
    )
    .unwrap();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let out = actix_web::rt::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_hookgate"))
            .args(args)
            .arg("--config")
            .arg(&config)
            .envs(env)
            .output()
            .expect("run hookgate")
    })
    .await
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

on_both_stores!(
    the_tables_hold_no_body_in_plain_and_operators_read_every_one,
    a_body_moved_to_another_row_does_not_open,
    a_key_no_longer_configured_is_named_where_a_row_is_read,
    fingerprints_are_keyed_and_still_catch_another_payload,
    rows_from_before_encryption_read_as_they_stand_until_a_rekey_seals_them,
    rotation_beside_deliveries_runs_nothing_twice_and_leaves_nothing_under_the_old_key,
    a_row_that_does_not_open_never_holds_up_a_batch_take,
);
