//! The guarantee under pressure: overload, a frozen database, slow senders and large
//! answers. (A graceful shutdown: `shutdown.rs`.) Each test reproduces a way the promise once broke.

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{
    eventually, spawn_app_behind_proxy_with, spawn_app_on, spawn_app_with, Backend, Behaviour,
    TestApp, PROVIDER,
};

/// The value of the first `/metrics` sample whose line starts with `prefix`, or 0.
async fn metric(app: &TestApp, prefix: &str) -> f64 {
    let text = app.get("/metrics").await.body;
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Eight deliveries for two workers: only as many claims as workers that can start at
/// once; the rest are refused with nothing claimed. (Before: all eight were claimed and
/// six waited in a worker's mailbox while their leases ran.)
async fn a_claim_is_made_only_when_a_worker_can_start_at_once(backend: Backend) {
    let app = Rc::new(
        spawn_app_on(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 2;
            c.server.admission_queue = Some(0);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let refused = Rc::new(AtomicUsize::new(0));
    let sends: Vec<_> = (0..8)
        .map(|i| {
            let (app, refused) = (Rc::clone(&app), Rc::clone(&refused));
            actix_rt::spawn(async move {
                let answer = app.deliver(&format!("evt_adm{i}"), "{}").await;
                if answer.status == 503 {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                answer
            })
        })
        .collect();
    eventually("every request to be claimed or refused", || async {
        app.target.total() == 2
            && app.db.count_rows().await + refused.load(Ordering::SeqCst) as i64 >= 8
    })
    .await;
    assert_eq!(
        app.db.count_rows().await,
        2,
        "only the started deliveries claimed"
    );

    app.target.release();
    let answers: Vec<_> = join_all(sends)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for a in &answers {
        match a.status {
            201 => assert_eq!(a.path, "first_run"),
            503 => {
                assert_eq!(a.path, "overloaded", "{a:?}");
                assert_eq!(a.retry_after, Some(1));
                assert_eq!(a.attempt, None, "nothing was claimed");
            }
            _ => panic!("{a:?}"),
        }
    }
    assert_eq!(answers.iter().filter(|a| a.status == 201).count(), 2);
    assert_eq!(app.target.total(), 2);
    assert_eq!(app.db.count_rows().await, 2);
    // The cause of each 503 is in the log.
    let causes = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.unavailable" && l["path"] == "overloaded")
        .count();
    assert_eq!(causes, 6, "{:?}", app.log.lines());
}

/// Requests beyond the free workers wait for one *before* claiming, and are then served.
async fn waiting_requests_claim_only_when_a_worker_frees_up(backend: Backend) {
    let app = Rc::new(
        spawn_app_on(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 2;
            c.server.admission_queue = Some(6);
            c.server.admission_wait = Duration::from_secs(60);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let sends: Vec<_> = (0..8)
        .map(|i| {
            let app = Rc::clone(&app);
            actix_rt::spawn(async move { app.deliver(&format!("evt_w{i}"), "{}").await })
        })
        .collect();
    eventually("six requests to wait for a worker", || async {
        app.target.total() == 2 && metric(&app, "hookgate_admission_waiting{").await == 6.0
    })
    .await;
    assert_eq!(
        app.db.count_rows().await,
        2,
        "waiting requests claim nothing"
    );

    app.target.release();
    let answers: Vec<_> = join_all(sends)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        answers
            .iter()
            .all(|a| a.status == 201 && a.path == "first_run"),
        "{answers:?}"
    );
    assert_eq!(app.target.total(), 8);
}

/// A request that waits longer than `admission_wait` for a worker is refused with nothing
/// claimed; requests that come to wait later get their own full wait, whether or not the
/// queue emptied in between. (The waits share one timer per shard, see `Shard::admit`.)
async fn a_wait_for_a_worker_ends_in_a_refusal_that_claimed_nothing(backend: Backend) {
    let app = Rc::new(
        spawn_app_on(backend, |c| {
            c.server.shards = Some(1);
            c.server.workers_per_shard = 1;
            c.server.admission_queue = Some(4);
            c.server.admission_wait = Duration::from_millis(200);
        })
        .await,
    );
    app.target.set(Behaviour::Hang);
    let send = |key: String| {
        let app = Rc::clone(&app);
        actix_rt::spawn(async move { app.deliver(&key, "{}").await })
    };
    let held = send("evt_held".into());
    eventually("the worker to be busy", || async {
        app.target.total() == 1
    })
    .await;
    for round in 0..3 {
        let waits: Vec<_> = (0..2).map(|i| send(format!("evt_r{round}_{i}"))).collect();
        for answer in join_all(waits).await.into_iter().map(Result::unwrap) {
            assert_eq!(answer.status, 503, "{answer:?}");
            assert_eq!(answer.path, "overloaded");
            assert_eq!(answer.attempt, None, "nothing was claimed");
        }
        assert_eq!(metric(&app, "hookgate_admission_waiting{").await, 0.0);
    }
    assert_eq!(
        app.db.count_rows().await,
        1,
        "only the held delivery claimed"
    );
    let unavailable: Vec<_> = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.unavailable")
        .collect();
    assert_eq!(unavailable.len(), 6);
    assert!(unavailable.iter().all(|l| l["error"]
        .as_str()
        .unwrap_or("")
        .contains("no worker freed up")));

    app.target.release();
    assert_eq!(held.await.unwrap().status, 201);
    // A request that arrives once the worker is free is served at once.
    let next = app.deliver("evt_after", "{}").await;
    assert_eq!((next.status, next.path.as_str()), (201, "first_run"));
}

#[actix_web::test]
async fn a_frozen_database_is_answered_503_at_the_deadline_and_service_resumes_by_itself() {
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.store.statement_timeout = Some(Duration::from_millis(500))
    })
    .await;
    assert_eq!(app.deliver("evt_before", "{}").await.status, 201);

    proxy.freeze();
    let frozen = app.deliver("evt_frozen", "{}").await;
    assert_eq!(frozen.status, 503, "{frozen:?}");
    assert_eq!(frozen.path, "store_unavailable");
    assert!(frozen.retry_after.is_some());
    assert_eq!(app.get("/readyz").await.status, 503);
    assert_eq!(app.target.count(&TestApp::idem("evt_frozen")), 0);
    assert!(
        app.log
            .events("webhook.unavailable", "evt_frozen")
            .iter()
            .any(|l| l["error"].as_str().is_some_and(|e| e.contains("deadline"))),
        "{:?}",
        app.log.lines()
    );

    proxy.thaw();
    eventually("the store to answer again", || async {
        app.get("/readyz").await.status == 200
    })
    .await;
    // The claim that missed its deadline was held by the frozen proxy and may have reached
    // Postgres on thaw: then the key is leased by an attempt nobody runs (409 until the
    // lease ends, then `lease_retake`) — a delay, never a delivery. Otherwise it is new.
    let back = app.deliver("evt_frozen", "{}").await;
    assert!(
        back.status == 201 || back.path == "in_progress_elsewhere",
        "{back:?}"
    );
    assert_eq!(app.deliver("evt_after", "{}").await.status, 201);
}

#[actix_web::test]
async fn an_outcome_write_that_times_out_is_retried_and_the_event_is_delivered_once() {
    let (app, proxy) = spawn_app_behind_proxy_with(|c| {
        c.store.statement_timeout = Some(Duration::from_millis(500))
    })
    .await;
    app.target.set(Behaviour::Hang);
    let delivery = app.deliver("evt_rec", "{}");
    let freeze = async {
        app.target.wait_for(&TestApp::idem("evt_rec"), 1).await;
        proxy.freeze();
        app.target.release();
        eventually("a timed-out outcome write to be retried", || async {
            !app.log.events("webhook.record_retry", "evt_rec").is_empty()
        })
        .await;
        proxy.thaw();
    };
    let (answer, ()) = futures_util::join!(delivery, freeze);
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(
        app.db.status(PROVIDER, "evt_rec").await.as_deref(),
        Some("done")
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_rec")), 1);
}

/// A node with one pooled connection that waits at most 200 ms for the store: one claim
/// batch stuck on a row lock holds up everything behind it.
async fn spawn_app_with_one_connection() -> TestApp {
    spawn_app_with(|c| {
        c.store.pool_size = 1;
        c.store.pool_timeout = Duration::from_millis(200);
    })
    .await
}

#[actix_web::test]
async fn waiting_for_the_store_past_pool_timeout_is_overload_not_an_outage() {
    // The first claim's batch holds the only slot (and the only connection) while it waits
    // for a row lock; the second claim waits for its batch past `pool_timeout`, is
    // withdrawn unrun and answered 503 `overloaded`, and claims nothing.
    let app = spawn_app_with_one_connection().await;
    let lock = app.db.hold_new_row(PROVIDER, "evt_pool_a").await;
    let blocked = app.deliver("evt_pool_a", "{}");
    let other = async {
        app.db.wait_for_lock_waiter().await;
        let answer = app.deliver("evt_pool_b", "{}").await;
        lock.release().await;
        answer
    };
    let (a, b) = futures_util::join!(blocked, other);
    assert_eq!(b.status, 503, "{b:?}");
    assert_eq!(b.path, "overloaded");
    assert_eq!(a.status, 201, "{a:?}");
    assert_eq!(
        metric(&app, "hookgate_store_errors_total{kind=\"unavailable\"}").await,
        0.0
    );
    assert_eq!(app.deliver("evt_pool_b", "{}").await.status, 201);
}

/// A crowd of senders while the only claim batch waits on a row lock: each claim that
/// waited past `pool_timeout` is withdrawn before it runs — 503 `overloaded`, no row — and
/// when every sender then retries, twice at once, each event reaches the target once.
#[actix_web::test]
async fn claims_withdrawn_behind_a_stuck_batch_claim_nothing_and_retries_deliver_once() {
    let app = spawn_app_with_one_connection().await;
    let lock = app.db.hold_new_row(PROVIDER, "evt_stuck").await;
    let stuck = app.deliver("evt_stuck", "{}");
    let keys: Vec<String> = (0..24).map(|i| format!("evt_crowd{i}")).collect();
    let crowd = async {
        app.db.wait_for_lock_waiter().await;
        let answers = join_all(keys.iter().map(|k| app.deliver(k, "{}"))).await;
        // Read while the batch is still stuck: a withdrawn claim left no row behind.
        for (key, answer) in keys.iter().zip(&answers) {
            assert_eq!(answer.status, 503, "{key}: {answer:?}");
            assert_eq!(answer.path, "overloaded", "{key}: {answer:?}");
            assert_eq!(app.db.status(PROVIDER, key).await, None, "{key}");
        }
        lock.release().await;
    };
    let (stuck, ()) = futures_util::join!(stuck, crowd);
    assert_eq!(stuck.status, 201, "{stuck:?}");
    join_all(
        keys.iter()
            .flat_map(|k| [app.deliver(k, "{}"), app.deliver(k, "{}")]),
    )
    .await;
    for key in &keys {
        // A sender whose parallel retries were both refused gets through now.
        let last = app.deliver(key, "{}").await;
        assert!(last.status < 300, "{key}: {last:?}");
        assert_eq!(app.target.count(&TestApp::idem(key)), 1, "{key}");
        assert_eq!(
            app.db.status(PROVIDER, key).await.as_deref(),
            Some("done"),
            "{key}"
        );
    }
}

#[actix_web::test]
async fn a_stalled_body_gets_408_and_trickling_senders_do_not_delay_an_honest_one() {
    let app = spawn_app_with(|c| c.server.read_timeout = Duration::from_secs(1)).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut conn = tokio::net::TcpStream::connect(&address).await.unwrap();
        conn.write_all(
            format!(
                "POST /webhooks/{PROVIDER} HTTP/1.1\r\nHost: x\r\nX-Idempotency-Key: slow\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"id\":"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        stalled.push(conn);
    }
    let honest = app.deliver("evt_honest", "{}").await;
    assert_eq!(honest.status, 201);

    let mut first = stalled.swap_remove(0);
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), first.read_to_end(&mut answer))
        .await
        .expect("the server closes a stalled connection")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(app.db.status(PROVIDER, "slow").await, None);
}

/// A client that sent one whole request on a connection and then the first byte of a
/// second one, and nothing more, holds that connection no longer than `read_timeout`:
/// with four of them at a node's `max_connections = 4`, an honest sender still gets in.
#[actix_web::test]
async fn a_stalled_second_request_on_a_connection_does_not_hold_it() {
    let app = spawn_app_with(|c| {
        c.server.read_timeout = Duration::from_secs(1);
        c.server.http_workers = Some(1);
        c.server.max_connections = 4;
    })
    .await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut conn = tokio::net::TcpStream::connect(&address).await.unwrap();
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        conn.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        // The connection may already be closed: then this write fails, as it should.
        let _ = conn.write_all(b"G").await;
        stalled.push(conn);
    }
    for conn in &mut stalled {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut rest));
        // Closed: at the end of the first answer, or with a 408 for the stalled head.
        assert!(closed.await.is_ok(), "the connection is still held");
    }
    let honest = app.deliver("evt_honest", "{}").await;
    assert_eq!(honest.status, 201, "{honest:?}");
}

/// A request refused before its body is read (an unknown provider: 404), whose chunked body
/// then never ends: actix goes on reading and discarding the body with no deadline, and the
/// connection is closed all the same once it has had no request in hand for keep-alive plus
/// `read_timeout`.
#[actix_web::test]
async fn a_refused_request_whose_chunked_body_never_ends_does_not_hold_its_connection() {
    let app = spawn_app_with(|c| c.server.read_timeout = Duration::from_secs(1)).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&address).await.unwrap();
    conn.write_all(
        b"POST /webhooks/nobody HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\
          Content-Type: application/json\r\n\r\n1\r\n{\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer));
    assert!(closed.await.is_ok(), "the connection is still held");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
}

/// Clients that ask for a large answer and never read it hold their connections no longer
/// than about `read_timeout` without taking a byte: with four of them at a node's
/// `max_connections = 4`, an honest sender still gets in; a client that reads, slowly for a
/// while, gets the answer whole. (Before, an answer larger than the socket buffers stayed
/// in hand for ever, and so did the connection.) With keep-alive on, and off.
#[actix_web::test]
async fn clients_that_never_read_their_answers_do_not_hold_their_connections() {
    for keep_alive in [Duration::from_secs(5), Duration::ZERO] {
        readers_that_take_nothing_are_cut(keep_alive).await;
    }
}

async fn readers_that_take_nothing_are_cut(keep_alive: Duration) {
    const TOKEN: &str = "slow-reader-admin-token";
    let app = spawn_app_with(|c| {
        // Long enough for a debug build to make the large answer before a head's deadline.
        c.server.read_timeout = Duration::from_secs(3);
        c.server.keep_alive = keep_alive;
        c.server.http_workers = Some(1);
        c.server.max_connections = 4;
        c.server.max_body_bytes = 16 * 1024 * 1024;
        c.admin.token = Some(hookgate::secret::Secret::new(TOKEN));
        c.providers[0].keep_payload = hookgate::config::KeepPayload::Always;
    })
    .await;
    // The event's kept payload makes its admin answer about 8 MiB: more than the kernel
    // holds for a socket whose reader takes nothing (Linux lets a socket's send buffer
    // grow to 4 MiB by default, `net.ipv4.tcp_wmem`).
    let big = padded_body("evt_big", 8 * 1024 * 1024);
    // Sent as a sender would: a connection reset while the 8 MiB body goes out (the 3 s
    // read deadline, on a debug build beside the rest of the suite) is sent again; the key
    // makes a second copy a duplicate, answered 2xx as well.
    let mut tries = 0;
    let stored = loop {
        tries += 1;
        let sent = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish()
            .post(format!("{}/webhooks/{PROVIDER}", app.address))
            .insert_header(("Content-Type", "application/json"))
            .insert_header(("X-Idempotency-Key", "evt_big"))
            .send_body(big.clone())
            .await;
        match sent {
            Ok(response) => break response.status().as_u16(),
            Err(e) if tries < 5 => eprintln!("storing evt_big, try {tries}: {e}"),
            Err(e) => panic!("storing evt_big: {e}"),
        }
    };
    assert!((200..300).contains(&stored), "{stored}");
    let address: std::net::SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    let request = format!(
        "GET /admin/api/events/{PROVIDER}/evt_big HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    );
    let ask = || async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut conn = socket.connect(address).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut head = [0u8; 12];
        conn.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        conn
    };
    let mut readers = Vec::new();
    for _ in 0..4 {
        // ...and nothing more is read from it.
        readers.push(ask().await);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for attempt in 0.. {
        // A new key each time: an attempt given up here may still be answered there.
        let key = format!("evt_honest_{attempt}");
        let honest = tokio::time::timeout(Duration::from_secs(5), app.deliver(&key, "{}"));
        match honest.await {
            Ok(answer) => {
                assert!((200..300).contains(&answer.status), "{answer:?}");
                break;
            }
            Err(_) => assert!(
                tokio::time::Instant::now() < deadline,
                "four readers that take nothing still hold every connection"
            ),
        }
    }
    drop(readers);
    // A reader that reads, through the same small buffer, gets the whole answer, even one
    // that reads slowly (16 KiB every 50 ms) for longer than `read_timeout` first.
    let mut conn = ask().await;
    let mut rest = b"HTTP/1.1 200".to_vec();
    let slow_until = tokio::time::Instant::now() + Duration::from_secs(4);
    let mut slice = vec![0u8; 16 * 1024];
    while tokio::time::Instant::now() < slow_until {
        let n = conn.read(&mut slice).await.unwrap();
        assert!(n > 0, "a slow reader was cut after {} bytes", rest.len());
        rest.extend_from_slice(&slice[..n]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut rest))
        .await
        .expect("the answer is sent within 30 s")
        .unwrap();
    let text = String::from_utf8(rest).unwrap();
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    let event: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(event["payload"].as_str(), Some(big.as_str()));
}

/// A JSON body of exactly `len` bytes with `"id": key`.
fn padded_body(key: &str, len: usize) -> String {
    let head = format!("{{\"id\":\"{key}\",\"pad\":\"");
    format!("{head}{}\"}}", "x".repeat(len - head.len() - 2))
}

/// The node-wide budget counts the body bytes that have arrived, not those a request
/// declares: senders that declared the largest bodies and sent a few bytes hold a few bytes
/// (before, 64 idle sockets declaring 1 MiB held the whole default budget). Past the budget
/// a request gets 503 `overloaded` and claims nothing.
#[actix_web::test]
async fn bodies_past_the_node_wide_budget_get_503_overloaded_and_claim_nothing() {
    let app = spawn_app_with(|c| {
        c.server.max_body_bytes = 1000;
        c.server.max_body_bytes_in_flight = 2000;
    })
    .await;
    let address = app.address.trim_start_matches("http://").to_owned();
    // Two senders that declared 1000 bytes each and sent only their first bytes.
    let mut held = Vec::new();
    for key in ["big1", "big2"] {
        let body = padded_body(key, 1000);
        let mut conn = tokio::net::TcpStream::connect(&address).await.unwrap();
        conn.write_all(
            format!(
                "POST /webhooks/{PROVIDER} HTTP/1.1\r\nHost: x\r\nX-Idempotency-Key: {key}\r\n\
                 Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{}",
                &body[..10]
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        held.push((conn, body));
    }
    // Watched through /metrics, which takes nothing from the budget itself.
    eventually("both bodies' first bytes to be held", || async {
        metric(&app, "hookgate_body_bytes_in_flight ").await == 20.0
    })
    .await;
    assert_eq!(app.deliver("evt_tiny", "{}").await.status, 201);

    // Most of both bodies arrives: 1980 of 2000 bytes held.
    for (conn, body) in &mut held {
        conn.write_all(&body.as_bytes()[10..990]).await.unwrap();
    }
    eventually("most of both bodies to be held", || async {
        metric(&app, "hookgate_body_bytes_in_flight ").await == 1980.0
    })
    .await;
    let small = padded_body("evt_small", 100);
    let refused = app.deliver("evt_small", &small).await;
    assert_eq!(refused.path, "overloaded", "{}", refused.body);
    assert_eq!(refused.retry_after, Some(1));
    assert!(refused.body.contains("overloaded"), "{}", refused.body);
    assert_eq!(
        app.db.status(PROVIDER, "evt_small").await,
        None,
        "claimed nothing"
    );
    assert_eq!(app.target.count(&TestApp::idem("evt_small")), 0);

    // One body arrives whole: it is delivered, its bytes go back, a new request fits.
    let (mut conn, body) = held.swap_remove(0);
    conn.write_all(&body.as_bytes()[990..]).await.unwrap();
    let mut answer = [0u8; 12];
    conn.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 201");
    drop(conn);
    eventually("the delivered body's bytes to come back", || async {
        app.deliver("evt_small", &small).await.status == 201
    })
    .await;
    assert_eq!(app.target.count(&TestApp::idem("evt_small")), 1);
}

#[actix_web::test]
async fn large_answers_are_bounded_in_bytes_and_replayed_whole_from_the_row() {
    let app = spawn_app_with(|c| c.cache.max_bytes = 256 * 1024).await;
    app.target.set(Behaviour::Large(60_000));
    for i in 0..40 {
        let a = app.deliver(&format!("evt_big{i}"), "{}").await;
        assert_eq!(a.status, 200);
        assert_eq!(a.body.len(), 60_000);
    }
    let bytes = metric(&app, "hookgate_cache_bytes ").await;
    assert!(bytes > 0.0 && bytes <= 256.0 * 1024.0, "{bytes}");
    let again = app.deliver("evt_big0", "{}").await;
    assert_eq!(again.path, "duplicate_done");
    assert_eq!(again.body.len(), 60_000);
    assert_eq!(app.target.total(), 40);
}

on_both_stores!(
    a_claim_is_made_only_when_a_worker_can_start_at_once,
    waiting_requests_claim_only_when_a_worker_frees_up,
    a_wait_for_a_worker_ends_in_a_refusal_that_claimed_nothing,
);
