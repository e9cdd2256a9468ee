//! One Postgres connection's life outside a statement: opening it (the pool's [`Connector`]:
//! the hosts named tried one by one, each within its bound, and the server's notices
//! watched for commits a synchronous standby did not confirm), and ending it after a
//! statement that missed its deadline ([`end_cancelled`]: cancel on the server, wait until
//! the backend has let go — or a bounded silence — only then close).
//!
//! It never decides what an operation answers; `pool` does.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Connect, Object};
use tokio::task::JoinHandle;
use tokio_postgres::config::{Host, LoadBalanceHosts};
use tokio_postgres::error::DbError;
use tokio_postgres::{AsyncMessage, CancelToken, Client, Config, Error};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long a cancel request may take to reach the server (it opens a connection of its
/// own): the store's connect timeout.
const CANCEL_CONNECT: Duration = Duration::from_secs(3);

/// How long the backend has, after a cancel request, to answer the cancelled statement and
/// the statement queued behind it before the cancel is sent again. A cancel takes effect at
/// the backend's next interrupt check (microseconds to milliseconds); a second is ample,
/// and short enough that a lost cancel request costs little.
const ANSWER_AFTER_CANCEL: Duration = Duration::from_secs(1);

/// How long a connection whose backend has said nothing since the first cancel request is
/// kept before it is let go unproven: its network has gone silent (an address moved to
/// another server, a firewall forgot the connection) while cancel requests, which open
/// connections of their own, still get through. Held longer, such connections would keep
/// the pool's slots until the kernel gave up on them, minutes later, with the database
/// reachable all along.
const SILENT_LIMIT: Duration = Duration::from_secs(5);

/// Ends this connection's own backend (a role may always end its own); the server logs it
/// as `FATAL: terminating connection due to administrator command`. Locks nothing.
const END_BACKEND: &str = "SELECT pg_terminate_backend(pg_backend_pid())";

/// Opens the pool's connections and drives each on a task of its own, counting the
/// commits whose wait for a synchronous standby was cancelled (the server's warning
/// "canceling wait for synchronous replication"): committed on this server, not known to
/// be on any standby.
pub(crate) struct Connector {
    pub(crate) tls: MakeRustlsConnect,
    /// Such commits seen on any of the pool's connections, ever.
    pub(crate) unconfirmed: Arc<AtomicU64>,
    /// How long one host may take to give a usable connection (TCP, TLS, login, and the
    /// read-write check) before the next host named is tried.
    pub(crate) per_host: Duration,
}

type Connected = Result<(Client, JoinHandle<()>), Error>;

impl Connect for Connector {
    fn connect(&self, config: &Config) -> Pin<Box<dyn Future<Output = Connected> + Send + '_>> {
        let (tls, hosts) = (self.tls.clone(), per_host(config));
        let (unconfirmed, per_host) = (Arc::clone(&self.unconfirmed), self.per_host);
        Box::pin(async move {
            // tokio-postgres tries a multi-host config's hosts in order, but bounds only
            // each TCP connect: a host that accepts and then stalls would hold up the rest.
            // So each host is tried alone, the whole opening bounded.
            let mut last = None;
            let mut opened = None;
            for host in hosts {
                match tokio::time::timeout(per_host, host.connect(tls.clone())).await {
                    Ok(Ok(pair)) => {
                        opened = Some(pair);
                        break;
                    }
                    Ok(Err(e)) => last = Some(e),
                    // tokio-postgres's own timeout error (its constructor is hidden from
                    // the docs, there for connectors such as this one).
                    Err(_) => last = Some(Error::__private_api_timeout()),
                }
            }
            let Some((client, mut connection)) = opened else {
                return Err(last.unwrap_or_else(Error::__private_api_timeout));
            };
            // Ends when the server closes the connection, or is aborted when the pool
            // drops the client.
            let driver = tokio::spawn(async move {
                while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) if unconfirmed_commit(&notice) => {
                            unconfirmed.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            });
            Ok((client, driver))
        })
    }
}

/// `config` once for each host it names, in its order (shuffled with
/// `load_balance_hosts=random`), each naming only that host, its address and its port;
/// every other setting as in `config`. A config naming one host is itself.
fn per_host(config: &Config) -> Vec<Config> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let n = hosts.len().max(addrs.len());
    if n <= 1 {
        return vec![config.clone()];
    }
    let mut each: Vec<Config> = (0..n)
        .map(|i| {
            let mut one = Config::new();
            match hosts.get(i) {
                Some(Host::Tcp(name)) => {
                    one.host(name);
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(addr) = addrs.get(i) {
                one.hostaddr(*addr);
            }
            // libpq's rule: one port serves every host.
            if let Some(port) = if ports.len() == 1 {
                ports.first()
            } else {
                ports.get(i)
            } {
                one.port(*port);
            }
            copy_settings(config, &mut one);
            one
        })
        .collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        fastrand::shuffle(&mut each);
    }
    each
}

/// Every setting of `from` but its hosts, addresses and ports, onto `to`.
fn copy_settings(from: &Config, to: &mut Config) {
    if let Some(user) = from.get_user() {
        to.user(user);
    }
    if let Some(password) = from.get_password() {
        to.password(password);
    }
    if let Some(dbname) = from.get_dbname() {
        to.dbname(dbname);
    }
    if let Some(options) = from.get_options() {
        to.options(options);
    }
    if let Some(name) = from.get_application_name() {
        to.application_name(name);
    }
    if let Some(timeout) = from.get_connect_timeout() {
        to.connect_timeout(*timeout);
    }
    if let Some(timeout) = from.get_tcp_user_timeout() {
        to.tcp_user_timeout(*timeout);
    }
    to.ssl_mode(from.get_ssl_mode())
        .ssl_negotiation(from.get_ssl_negotiation())
        .keepalives(from.get_keepalives())
        .keepalives_idle(from.get_keepalives_idle())
        .target_session_attrs(from.get_target_session_attrs())
        .channel_binding(from.get_channel_binding());
    if let Some(interval) = from.get_keepalives_interval() {
        to.keepalives_interval(interval);
    }
    if let Some(retries) = from.get_keepalives_retries() {
        to.keepalives_retries(retries);
    }
}

/// Whether a notice is one of PostgreSQL's two warnings that a commit stopped waiting for
/// a standby's confirmation, having taken effect locally: "canceling wait for synchronous
/// replication due to user request" (a cancel; the client is then told of success) and
/// "canceling the wait for synchronous replication and terminating connection" (the
/// backend ends; the client sees the connection close). Read from the message: the first
/// has no code of its own; a server whose `lc_messages` is not English goes unrecognised.
pub(crate) fn unconfirmed_commit(notice: &DbError) -> bool {
    let message = notice.message();
    message.starts_with("canceling wait for synchronous replication")
        || message.starts_with("canceling the wait for synchronous replication")
}

/// Ends the statement running on `client` past its deadline, then the connection.
///
/// Closing alone is not enough: a backend waiting for a synchronous standby does not read
/// its socket, so neither the client going away nor `statement_timeout` ends it; it would
/// hold a server connection while the pool opened a replacement. So: send a cancel
/// request (the backend then ends the statement), queue behind it a statement that ends
/// the backend itself ([`END_BACKEND`]), and wait for the server to close the connection —
/// its backend is gone then. `client` stays checked out of the pool until that moment, so
/// the pool opens no replacement meanwhile. The cancel is sent again each
/// [`ANSWER_AFTER_CANCEL`] while the backend stays silent; the connection is let go
/// without that proof when a cancel request cannot reach the server at all (nor could a
/// replacement), or after [`SILENT_LIMIT`] of silence. `ending` counts the connections in
/// here.
pub(crate) async fn end_cancelled(
    client: Object,
    token: CancelToken,
    tls: MakeRustlsConnect,
    ending: Arc<AtomicUsize>,
) {
    let silent_until = tokio::time::Instant::now() + SILENT_LIMIT;
    loop {
        let sent = tokio::time::timeout(CANCEL_CONNECT, token.cancel_query(tls.clone()))
            .await
            .is_ok_and(|sent| sent.is_ok());
        let answered = tokio::time::timeout(ANSWER_AFTER_CANCEL, client.simple_query(END_BACKEND))
            .await
            .is_ok();
        if answered {
            // Fails as soon as the connection is closed: the server closes it once the
            // backend has exited (at once, unless a late cancel request cancelled
            // END_BACKEND instead; the idle backend then exits on the close below).
            let _ = tokio::time::timeout(ANSWER_AFTER_CANCEL, client.simple_query("")).await;
            break;
        }
        if client.is_closed() || !sent || tokio::time::Instant::now() >= silent_until {
            break;
        }
    }
    drop(Object::take(client));
    ending.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_postgres::config::{Host, SslMode, TargetSessionAttrs};
    use tokio_postgres::Config;

    use super::per_host;

    #[test]
    fn each_host_alone_keeps_every_other_setting() {
        let mut config: Config = "postgres://app:pw@db1:5432,db2:5433/hookgate\
                                  ?target_session_attrs=read-write&application_name=x\
                                  &options=-c%20search_path%3Dhg&connect_timeout=3\
                                  &keepalives_idle=40"
            .parse()
            .unwrap();
        config.ssl_mode(SslMode::Require);
        let each = per_host(&config);
        assert_eq!(each.len(), 2);
        for (one, (host, port)) in each.iter().zip([("db1", 5432), ("db2", 5433)]) {
            assert_eq!(one.get_hosts(), [Host::Tcp(host.into())]);
            assert_eq!(one.get_ports(), [port]);
            assert_eq!(one.get_user(), Some("app"));
            assert_eq!(one.get_password(), Some(&b"pw"[..]));
            assert_eq!(one.get_dbname(), Some("hookgate"));
            assert_eq!(one.get_options(), Some("-c search_path=hg"));
            assert_eq!(one.get_application_name(), Some("x"));
            assert_eq!(one.get_ssl_mode(), SslMode::Require);
            assert_eq!(
                one.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite
            );
            assert_eq!(one.get_connect_timeout(), Some(&Duration::from_secs(3)));
            assert_eq!(one.get_keepalives_idle(), Duration::from_secs(40));
        }
        // One port serves every host; one host is the config itself.
        let one_port: Config = "host=a,b port=6000 user=u".parse().unwrap();
        let ports: Vec<_> = per_host(&one_port)
            .iter()
            .map(|c| c.get_ports().to_vec())
            .collect();
        assert_eq!(ports, [[6000], [6000]]);
        let single: Config = "host=a port=1 user=u".parse().unwrap();
        assert_eq!(per_host(&single).len(), 1);
    }
}
