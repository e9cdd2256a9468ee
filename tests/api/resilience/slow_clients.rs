//! Slow and stalled clients hold nothing for long: a body that stalls gets 408, a
//! stalled second request, a chunked body that never ends or an answer never read frees
//! its connection, and bodies that trickle in count against the node-wide budget only
//! for the bytes that arrived. Each test reproduces a way the promise once broke.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{eventually, spawn_app_with, TestApp, PROVIDER};

use super::metric;

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
