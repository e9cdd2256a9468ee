//! The Postgres store's two pools, built from `[store]`: the senders' (claims,
//! completions, the queue, sweeps: `store.pool_size`) and the operators' (searches,
//! histories, statistics, pauses, bulk replay bookkeeping: `store.operator_pool_size`).
//! Each has its own connections and reconnect backoff under the same statement deadline,
//! so no operator read, however slow, holds a connection a sender needs, nor opens the
//! senders' backoff by missing its deadline. A read-only server met on either retires the
//! connections of both: they reach the same server. Connections open on first use.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts,
};

use super::connection::Connector;
use super::pool::{Inner, Retired, RingView};
use super::tls;
use crate::config::StoreConfig;
use crate::store::reconnect::Reconnect;
use crate::store::{millis, StoreError};

/// How long opening a connection to one host may take — TCP, TLS, login and the
/// read-write check — before the next host named is tried (TCP alone is also bounded by
/// it): a primary that died without a word (its packets dropped), or one that accepts and
/// then stalls, costs each new connection this long before the standby's turn.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The `application_name` of hookgate's sessions when `store.url` names none: operators
/// find them in `pg_stat_activity` by it.
const APPLICATION_NAME: &str = "hookgate";

/// The store's pools.
pub(crate) struct Pools {
    /// The senders' pool: every statement of the claim path, the queue and retention.
    pub(crate) hot: Arc<Inner>,
    /// The operators' pool.
    pub(crate) operator: Arc<Inner>,
}

/// Both pools for `config`, their tables in `schema` (checked by the caller).
pub(crate) fn open(config: &StoreConfig, schema: String) -> Result<Pools, StoreError> {
    let (mut pg, tls) = tls::config(&config.url)?;
    // Planner settings: the hot statements probe the primary key per input key (see
    // batch.rs) on cached generic plans (custom plans cost as much planning as
    // execution). A plan cached on an empty, never-analyzed table must not become a scan
    // once it holds millions of rows (measured once: ~5.8k -> ~2.3k first runs/s over 100k
    // rows), so these sessions rule out sequential scans and hash/merge joins; every hot,
    // queue and sweep statement finds rows by an index. Checked by tests/api/store/plans.rs.
    // A plan that has no choice but a ruled-out node (the ring's six-row table is read
    // whole) costs above jit_above_cost, and compiling it took a second of a 1 ms
    // statement: these sessions never JIT-compile.
    let options = format!(
        "-c search_path={schema} -c statement_timeout={} -c enable_seqscan=off \
         -c enable_hashjoin=off -c enable_mergejoin=off -c jit=off",
        millis(config.deadline()).max(1)
    );
    pg.connect_timeout(CONNECT_TIMEOUT);
    read_write_by_default(&mut pg, &config.url);
    if pg.get_application_name().is_none() {
        pg.application_name(APPLICATION_NAME);
    }
    let tls = tls::connector(&tls)?;
    let retired = Arc::new(Retired::default());
    let pool = |size: usize, options: String| {
        let mut pg = pg.clone();
        pg.options(options);
        build(pg, tls.clone(), size, config, schema.clone(), &retired)
    };
    // The operators' reads are pages in the order of an index ((status, updated_at), a
    // job's (job_id, at)), read newest first and stopped at a limit; with statistics that
    // say a table is small (an empty one analyzed, or none yet) a plan would rather read
    // every matching row and sort them, or gather them through a bitmap, which on a grown
    // table reads all of them for one page. Their sessions rule out both: an ordered scan
    // stopped at its limit, ties put in order a few at a time (an incremental sort).
    // Checked by tests/api/store/plans.rs.
    let operators = format!("{options} -c enable_sort=off -c enable_bitmapscan=off");
    // The hot statements keep their generic plans whatever the statistics say. Left to
    // choose (it chooses again whenever autovacuum's ANALYZE of a slot invalidates a
    // plan), the plan cache came to plan the queue's take at every execution — a join over
    // every slot with the keys in flight as a constant — and planning took half of
    // Postgres's CPU (docs/performance.md). The operators' reads keep the choice: their
    // optional filters are worth a plan per value. Checked by tests/api/store/plans.rs.
    let hot = format!("{options} -c plan_cache_mode=force_generic_plan");
    Ok(Pools {
        hot: pool(config.pool_size, hot)?,
        operator: pool(config.operator_pool_size, operators)?,
    })
}

/// One pool of at most `size` connections for `pg`, retired with `retired`.
fn build(
    pg: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    size: usize,
    config: &StoreConfig,
    schema: String,
    retired: &Arc<Retired>,
) -> Result<Arc<Inner>, StoreError> {
    let hosts = pg.get_hosts().len().max(pg.get_hostaddrs().len());
    let unconfirmed = Arc::default();
    let connector = Connector {
        tls: tls.clone(),
        unconfirmed: Arc::clone(&unconfirmed),
        per_host: CONNECT_TIMEOUT,
    };
    // Fast: a checked-out connection is not probed. One that met a read-only server is
    // retired by the hook below instead, and one whose statement missed its deadline
    // never comes back (`pool`).
    let manager = Manager::from_connect(
        pg,
        connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let fit = Arc::clone(retired);
    let pool = Pool::builder(manager)
        .max_size(size)
        .timeouts(Timeouts {
            wait: Some(config.pool_timeout),
            create: Some(opening_bound(hosts)),
            recycle: None,
        })
        .pre_recycle(Hook::sync_fn(move |_, metrics| {
            if fit.fit(metrics.created) {
                Ok(())
            } else {
                Err(HookError::message(
                    "opened before its server turned read-only",
                ))
            }
        }))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Query(format!("building the pool: {e}").into()))?;
    Ok(Arc::new(Inner {
        pool,
        schema,
        deadline: config.deadline(),
        reconnect: Reconnect::default(),
        tls,
        ending: Arc::default(),
        unconfirmed,
        retired: Arc::clone(retired),
        ring: RingView::new(config.slot_filter_keys),
    }))
}

/// A URL naming several hosts and no `target_session_attrs` asks for `read-write`: each new
/// connection then skips a host that takes no writes (a standby, an old primary rejoined
/// as one) for the next. libpq's default, `any`, would keep the first host that answers,
/// and a standby listed first would refuse every write for good. An explicit value stays.
fn read_write_by_default(pg: &mut tokio_postgres::Config, url: &str) {
    let hosts = pg.get_hosts().len().max(pg.get_hostaddrs().len());
    if hosts > 1 && !url.contains("target_session_attrs") {
        pg.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
}

/// How long opening one connection may take with `hosts` hosts named: each its
/// [`CONNECT_TIMEOUT`] (`connection.rs` tries them one by one), and a second more so the
/// last host is not cut short by the pool.
fn opening_bound(hosts: usize) -> Duration {
    CONNECT_TIMEOUT * u32::try_from(hosts.max(1)).unwrap_or(u32::MAX) + Duration::from_secs(1)
}

#[cfg(test)]
mod tests {
    use super::{opening_bound, read_write_by_default, CONNECT_TIMEOUT};
    use tokio_postgres::config::TargetSessionAttrs;

    #[test]
    fn several_hosts_without_target_session_attrs_ask_for_a_read_write_server() {
        let attrs = |url: &str| {
            let mut pg: tokio_postgres::Config = url.parse().unwrap();
            read_write_by_default(&mut pg, url);
            pg.get_target_session_attrs()
        };
        use TargetSessionAttrs::{Any, ReadWrite};
        assert_eq!(attrs("postgres://u@db1:5432,db2:5432/app"), ReadWrite);
        assert_eq!(attrs("host=db1,db2 port=5432,5432 dbname=app"), ReadWrite);
        assert_eq!(
            attrs("postgres://u@db1,db2/app?target_session_attrs=any"),
            Any
        );
        assert_eq!(attrs("postgres://u@db1:5432/app"), Any);
    }

    #[test]
    fn each_host_of_a_url_gets_its_connect_timeout_before_the_store_counts_as_unreachable() {
        let second = std::time::Duration::from_secs(1);
        assert_eq!(opening_bound(0), CONNECT_TIMEOUT + second);
        assert_eq!(opening_bound(1), CONNECT_TIMEOUT + second);
        assert_eq!(opening_bound(2), 2 * CONNECT_TIMEOUT + second);
    }
}
