//! A TCP proxy in front of Postgres (or any TCP peer) whose network can be cut and
//! restored, or frozen and thawed: the store goes away (or stops answering with its sockets
//! open, as when a network drops packets) for real, without stopping the shared test
//! cluster. The load bench's chaos scenario uses this same file.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone)]
pub struct StoreProxy {
    pub port: u16,
    down: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
}

/// Copies `from` to `to`, holding every byte while the proxy is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() {
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
        let down_rx = down.subscribe();
        let frozen_rx = frozen.subscribe();
        actix_rt::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if *down_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut cut = down_rx.clone();
                let frozen = frozen_rx.clone();
                actix_rt::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (a_read, a_write) = inbound.into_split();
                    let (b_read, b_write) = outbound.into_split();
                    tokio::select! {
                        _ = pump(a_read, b_write, frozen.clone()) => {}
                        _ = pump(b_read, a_write, frozen) => {}
                        _ = cut.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Self { port, down, frozen }
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
