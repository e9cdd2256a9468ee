//! The admin API's door: absent without a token, the token checked before a byte of the
//! body is read, an operator's body read within limits like a sender's (408, 413), a
//! malformed request a JSON 400 only after the token, and operators' work on connections
//! of its own.

use std::time::Duration;

use hookgate::secret::Secret;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::bearer;
use crate::helpers::{spawn_app, spawn_app_with, TestApp, PROVIDER};

const TOKEN: &str = "s3cret-admin-token";

async fn admin_app() -> TestApp {
    spawn_app_with(|c| c.admin.token = Some(Secret::new(TOKEN))).await
}

#[actix_web::test]
async fn the_admin_api_wants_the_token_and_is_absent_without_one() {
    let app = admin_app().await;
    let path = format!("/admin/events/{PROVIDER}/evt_1");
    assert_eq!(app.get(&path).await.status, 401);
    let wrong = bearer("wrong");
    let got = app.get_with(&path, &wrong).await;
    assert_eq!(got.status, 401);
    assert!(got.body.contains("unauthorized"));
    assert_eq!(app.get_with(&path, &bearer(TOKEN)).await.status, 404);

    let closed = spawn_app().await;
    assert_eq!(closed.get_with(&path, &bearer(TOKEN)).await.status, 404);
    // Disabled, every /admin/ route is 404 before anything reads the request: a query the
    // API would refuse (400) does not show that it exists.
    for probe in ["/admin/dead?limit=x", "/admin/dead", "/admin/anything"] {
        assert_eq!(closed.get(probe).await.status, 404, "{probe}");
    }
    let replay = format!("/admin/dead/{PROVIDER}/evt_1/replay");
    assert_eq!(closed.post(&replay, &[], String::new()).await.status, 404);
}

/// One raw request on its own connection (`head` without the blank line, then `body`, then
/// silence), and everything the server sends until it closes the connection. The 20 s is a
/// deadline for a hung test, not a timing claim.
async fn raw(app: &TestApp, head: &str, body: &str) -> String {
    let address = app.address.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(address).await.unwrap();
    conn.write_all(format!("{head}\r\n\r\n{body}").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes the connection")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The `error` code of a raw answer's JSON body.
fn error_code(answer: &str) -> String {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let body: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    body["error"].as_str().unwrap_or_default().to_owned()
}

/// The token is checked before a byte of the body is read: a client without it that
/// declares 2 MB and sends one byte is answered 401 without waiting for the rest, and holds
/// neither the connection nor a buffer.
#[actix_web::test]
async fn an_admin_post_without_the_token_is_refused_before_its_body_is_read() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.server.read_timeout = Duration::from_secs(1);
    })
    .await;
    for path in ["/admin/api/replays/plan", "/admin/api/replays"] {
        let answer = raw(
            &app,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 Content-Length: 2000000"
            ),
            "{",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
        assert_eq!(error_code(&answer), "unauthorized", "{path}: {answer}");
    }
}

/// `POST /admin/api/replays/plan` with the token, declaring `length` bytes and sending one.
fn operators_head(length: usize) -> String {
    format!(
        "POST /admin/api/replays/plan HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}",
        bearer(TOKEN)
    )
}

/// An operator's body is read like a sender's: within `server.read_timeout`, then 408
/// and the connection closed.
#[actix_web::test]
async fn an_operators_stalled_body_gets_408_within_read_timeout() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.server.read_timeout = Duration::from_secs(1);
    })
    .await;
    let stalled = raw(&app, &operators_head(100), "{").await;
    assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
    assert_eq!(error_code(&stalled), "request_timeout", "{stalled}");
}

/// A filter is small: an operator's body past 64 KiB is 413 before it is read.
#[actix_web::test]
async fn an_operators_body_over_64_kib_gets_413() {
    let app = spawn_app_with(|c| {
        c.admin.token = Some(Secret::new(TOKEN));
        c.server.read_timeout = Duration::from_secs(1);
    })
    .await;
    let oversized = raw(&app, &operators_head((64 << 10) + 1), "{").await;
    assert!(oversized.starts_with("HTTP/1.1 413"), "{oversized}");
    assert_eq!(error_code(&oversized), "body_too_large", "{oversized}");
}

/// A malformed body or query is a 400 with the API's JSON error, and only after the
/// token: without it the answer is 401 whatever the request holds.
#[actix_web::test]
async fn a_malformed_admin_request_gets_a_json_400_after_the_token() {
    let app = admin_app().await;
    let token = bearer(TOKEN);
    let auth = [("Authorization", token.as_str())];
    let code = |body: &str| -> String {
        let body: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        body["error"].as_str().unwrap_or_default().to_owned()
    };
    for path in ["/admin/api/replays/plan", "/admin/api/replays"] {
        let answer = app.post(path, &auth, "{not json".to_owned()).await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert_eq!(code(&answer.body), "invalid_json", "{path}: {answer:?}");
        let answer = app.post(path, &[], "{not json".to_owned()).await;
        assert_eq!(answer.status, 401, "{path}: {answer:?}");
    }
    for path in ["/admin/dead?limit=x", "/admin/api/events?limit=x"] {
        let answer = app.get_with(path, &token).await;
        assert_eq!(answer.status, 400, "{path}: {answer:?}");
        assert_eq!(code(&answer.body), "bad_query", "{path}: {answer:?}");
        assert_eq!(app.get(path).await.status, 401, "{path}");
    }
    let answer = app.get_with("/admin/api/replays/x", &token).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(code(&answer.body), "no_such_event", "{answer:?}");
    assert_eq!(app.get("/admin/api/replays/x").await.status, 401);
}

/// Operators' work has connections of its own: with more operator requests stuck in the
/// store (pauses blocked on a lock the test holds on the paused-providers table, until a
/// deadline far off) than the node has connections for senders, senders are still
/// answered, at once and claimed; the stuck requests hold operator connections only.
#[actix_web::test]
async fn operator_requests_stuck_in_the_store_take_no_connection_a_sender_needs() {
    let app = std::rc::Rc::new(
        spawn_app_with(|c| {
            c.admin.token = Some(Secret::new(TOKEN));
            c.store.pool_size = 2;
            // A sender that finds no free connection is refused soon, not after the test.
            c.store.pool_timeout = Duration::from_secs(1);
            // The stuck requests stay stuck while the senders are tried.
            c.store.statement_timeout = Some(Duration::from_secs(25));
            // No pause poll of the node's own joins the stuck requests.
            c.queue.poll_interval = Duration::from_secs(3600);
        })
        .await,
    );
    let lock = app.db.lock_pg_table("hookgate_paused").await;
    let stuck: Vec<_> = (0..4)
        .map(|_| {
            let app = std::rc::Rc::clone(&app);
            actix_rt::spawn(async move {
                app.post(
                    &format!("/admin/api/providers/{PROVIDER}/pause"),
                    &[("Authorization", &bearer(TOKEN))],
                    String::new(),
                )
                .await
            })
        })
        .collect();
    // As many statements stuck as the pool that runs them has connections.
    app.db.wait_for_waiters_on("hookgate_paused", 2).await;

    for n in 0..3 {
        let answer = app.deliver(&format!("evt_beside_{n}"), "{}").await;
        assert_eq!(
            (answer.status, answer.path.as_str()),
            (201, "first_run"),
            "a sender beside stuck operators: {answer:?}"
        );
    }
    lock.release().await;
    for request in stuck {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
    }
}
