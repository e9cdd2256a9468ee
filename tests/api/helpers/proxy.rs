//! A TCP proxy in front of Postgres whose network can be cut and restored: the store goes
//! away for real, without stopping the shared test cluster.

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone)]
pub struct StoreProxy {
    pub port: u16,
    down: watch::Sender<bool>,
}

impl StoreProxy {
    pub async fn start(upstream_url: &str) -> Self {
        let config: tokio_postgres::Config = upstream_url.parse().unwrap();
        let host = match &config.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            #[allow(unreachable_patterns)]
            _ => panic!("the test database must be reached over TCP"),
        };
        let upstream = format!("{host}:{}", config.get_ports()[0]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (down, _) = watch::channel(false);
        let down_rx = down.subscribe();
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
                actix_rt::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut a, mut b) = (inbound, outbound);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = cut.wait_for(|d| *d) => {}
                    }
                });
            }
        });
        Self { port, down }
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
