//! A TCP proxy in front of Postgres (or any TCP peer) whose network can be cut and
//! restored, or frozen and thawed: the store goes away (or stops answering with its sockets
//! open, as when a network drops packets) for real, without stopping the shared test
//! cluster. It can also slow down every new connection, or silence only the connections
//! open now (a moved address or a firewall that dropped them) while new ones flow. The
//! tests' store faults and the faults bench use it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone)]
/// A running proxy.
pub struct StoreProxy {
    /// The port it listens on.
    pub port: u16,
    down: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    /// Connections numbered below this one are silent for good.
    silenced_below: watch::Sender<u64>,
    /// Connections accepted so far (the next one's number).
    accepted: Arc<AtomicU64>,
    /// How long each new connection waits before it reaches the upstream.
    connect_delay: watch::Sender<Duration>,
}

/// Copies `from` to `to`, holding every byte while the proxy is frozen, and for good once
/// connection `id` is silenced.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
    (id, mut silenced_below): (u64, watch::Receiver<u64>),
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err()
            || silenced_below.wait_for(|below| id >= *below).await.is_err()
        {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl StoreProxy {
    /// A proxy in front of the Postgres server of `upstream_url`.
    pub async fn start(upstream_url: &str) -> Self {
        let config: tokio_postgres::Config = upstream_url.parse().unwrap();
        let host = match &config.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[allow(unreachable_patterns)]
            _ => panic!("the test database must be reached over TCP"),
        };
        Self::start_to(format!("{host}:{}", config.get_ports()[0])).await
    }

    /// A proxy in front of `upstream` (`host:port`).
    pub async fn start_to(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (down, _) = watch::channel(false);
        let (frozen, _) = watch::channel(false);
        let (silenced_below, _) = watch::channel(0);
        let (connect_delay, _) = watch::channel(Duration::ZERO);
        let accepted = Arc::new(AtomicU64::new(0));
        let down_rx = down.subscribe();
        let frozen_rx = frozen.subscribe();
        let silenced_rx = silenced_below.subscribe();
        let delay_rx = connect_delay.subscribe();
        let counter = Arc::clone(&accepted);
        actix_rt::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if *down_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let id = counter.fetch_add(1, Ordering::SeqCst);
                let delay = *delay_rx.borrow();
                let upstream = upstream.clone();
                let mut cut = down_rx.clone();
                let frozen = frozen_rx.clone();
                let silenced = silenced_rx.clone();
                actix_rt::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (a_read, a_write) = inbound.into_split();
                    let (b_read, b_write) = outbound.into_split();
                    tokio::select! {
                        _ = pump(a_read, b_write, frozen.clone(), (id, silenced.clone())) => {}
                        _ = pump(b_read, a_write, frozen, (id, silenced)) => {}
                        _ = cut.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Self {
            port,
            down,
            frozen,
            silenced_below,
            accepted,
            connect_delay,
        }
    }

    /// Silences, for good, every connection open now; new ones flow.
    pub fn silence_open(&self) {
        self.silenced_below
            .send_replace(self.accepted.load(Ordering::SeqCst));
    }

    /// Makes every new connection wait `delay` before it reaches the upstream.
    pub fn delay_connects(&self, delay: Duration) {
        self.connect_delay.send_replace(delay);
    }

    /// Stops forwarding bytes either way; every socket stays open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again, including what was held while frozen.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.down.send_replace(true);
    }

    /// Lets new connections through again after a [`cut`](Self::cut).
    pub fn restore(&self) {
        self.down.send_replace(false);
    }

    /// `url` with its port replaced by the proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let config: tokio_postgres::Config = url.parse().unwrap();
        url.replace(
            &format!(":{}/", config.get_ports()[0]),
            &format!(":{}/", self.port),
        )
    }
}
