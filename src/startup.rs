//! Builds a running node: the shards and workers, the HTTP server on its listener, and the
//! shutdown sequence. Tests call [`Application::build`] with port 0 and their own store,
//! delivery seam and logger.
//!
//! Shutdown (SIGTERM, SIGINT, or [`Stopper::stop`]): the shards stop claiming, the server
//! stops accepting and lets every request in flight finish — a delivery that reached the
//! target runs to its end (bounded by its target timeout), is recorded and answered; only
//! attempts that never reached the target are released (`failed`, fenced). Then the node
//! waits for the shards to be drained — at most the shutdown limit plus a lease, since a
//! queue outcome write waits for the store — and stops.
//!
//! A shard that dies (a panic in code it ran) cannot be missed: the node logs
//! `shard.crashed`, counts it, fails `/readyz`, shuts down as above and returns an error,
//! so the process exits non-zero and its supervisor (systemd) starts it again; the dead
//! shard's leases run out and its keys are retaken, as after a crash.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle, Service as _};
use actix_web::http::KeepAlive;
use actix_web::{web, App, HttpServer};
use anyhow::Context as _;
use slog::{info, Logger};

use crate::config::{cpus, Config};
use crate::http::{bound_writes, routes, AppState, ConnWatch, Sent};
use crate::metrics::Metrics;
use crate::operator_work::OperatorWork;
use crate::provider::{Provider, Route};
use crate::retention::Sweeper;
use crate::scheduler::Scheduler;
use crate::shard::{Dispatcher, ShardSettings};
use crate::store::Store;
use crate::worker::Delivery;

/// A node, bound and ready to serve.
pub struct Application {
    port: u16,
    server: Server,
    sweeping: actix_rt::task::JoinHandle<()>,
    scheduling: actix_rt::task::JoinHandle<()>,
    operator_task: actix_rt::task::JoinHandle<()>,
    watching: actix_rt::task::JoinHandle<()>,
    /// The shards found dead, once the watch found any.
    crashed: Arc<OnceLock<Vec<usize>>>,
    /// The longest the node waits, once stopped, for its attempts to be recorded.
    drain_limit: Duration,
    scheduler: Arc<Scheduler>,
    operator_work: Arc<OperatorWork>,
    stopper: Stopper,
    /// The tracer (tracing on) and how long a stop waits for its last export.
    tracer: Option<(Arc<crate::trace::Tracer>, Duration)>,
    log: Logger,
}

/// Starts a node's graceful shutdown; cheap to clone.
#[derive(Clone)]
pub struct Stopper {
    server: ServerHandle,
    dispatcher: Dispatcher,
    log: Logger,
}

impl Stopper {
    /// Stops claiming, then stops the server gracefully: requests in flight are answered.
    /// Returns once the server has stopped accepting; [`Application::run_until_stopped`]
    /// returns when everything has finished.
    pub async fn stop(&self) {
        info!(self.log, "hookgate.draining");
        self.dispatcher.drain().await;
        self.server.stop(true).await;
    }
}

impl Application {
    /// Binds `server.listen` (port 0 picks a free port) and starts the shards.
    pub async fn build(
        config: &Config,
        store: Arc<dyn Store>,
        delivery: Arc<dyn Delivery>,
        log: Logger,
    ) -> anyhow::Result<Self> {
        let providers = config
            .providers
            .iter()
            .map(|p| {
                let mut runtime = Provider::from_config(p, config.sender_horizon(p))?;
                // Fingerprints are keyed whenever the store seals what it keeps.
                let keyed = (*runtime.fingerprint)
                    .clone()
                    .keyed(store.keyring().cloned());
                runtime.fingerprint = Arc::new(keyed);
                Ok((p.name.clone(), runtime))
            })
            .collect::<Result<HashMap<_, _>, String>>()
            .map_err(anyhow::Error::msg)?;
        let listener = TcpListener::bind(&config.server.listen)
            .with_context(|| format!("binding {}", config.server.listen))?;
        let port = listener.local_addr()?.port();
        let shards = config.server.shard_count();
        let metrics = Arc::new(Metrics::new());
        let tracer = match config.tracing.endpoint {
            Some(_) => Some(
                crate::trace::start(
                    &config.tracing,
                    &crate::node::name(),
                    metrics.trace_counters(),
                    log.clone(),
                )
                .map_err(anyhow::Error::msg)?,
            ),
            None => None,
        };
        let settings = shard_settings(config, shards, tracer.clone());
        let primed: Vec<&str> = providers
            .values()
            .flat_map(|p| p.routes.iter().map(|r| &*r.scope))
            .collect();
        metrics.prime(shards, &primed);
        let dispatcher = Dispatcher::spawn(
            shards,
            config.server.workers_per_shard,
            settings,
            Arc::clone(&store),
            delivery,
            Arc::clone(&metrics),
            &log,
        );
        // Every route's scope is a name the node knows: a removed route's queue rows become
        // dead letters after the grace, as a removed provider's do.
        let horizons = providers
            .values()
            .flat_map(|p| p.routes.iter())
            .map(|r| (r.scope.to_string(), r.target.horizon))
            .collect();
        let sweeper = Sweeper::new(
            Arc::clone(&store),
            config.retention.clone(),
            Arc::clone(&metrics),
            log.clone(),
        )
        .with_horizons(horizons)
        .with_orphan_grace(config.retry.sender_horizon);
        let sweeping = actix_rt::spawn(sweeper.run_forever());
        // Every route's queue rows are delivered, whatever its provider's mode is now; each
        // route has its own limits.
        let routes: Vec<Arc<Route>> = providers
            .values()
            .flat_map(|p| p.routes.iter().cloned())
            .collect();
        let queued: Vec<_> = routes
            .iter()
            .map(|r| {
                dispatcher
                    .gate()
                    .configure(&r.scope, r.max_rate, r.max_in_flight);
                (Arc::clone(&r.scope), Arc::clone(&r.target))
            })
            .collect();
        let scheduler = Arc::new(Scheduler::new(
            Arc::clone(&store),
            dispatcher.clone(),
            queued,
            Arc::clone(&metrics),
            log.clone(),
            config.queue.poll_interval,
            config.lease.duration,
        ));
        let scheduling = actix_rt::spawn(Arc::clone(&scheduler).run_forever());
        let targets = routes
            .iter()
            .map(|r| (Arc::clone(&r.scope), Arc::clone(&r.target)))
            .collect();
        let operator_work = Arc::new(OperatorWork::new(
            Arc::clone(&store),
            dispatcher.clone(),
            targets,
            Arc::clone(&metrics),
            log.clone(),
            config.queue.poll_interval,
        ));
        let operator_task = actix_rt::spawn(Arc::clone(&operator_work).run_forever());
        warn_if_not_durable(Arc::clone(&store), log.clone());
        warn_if_not_authenticated(&config.store.url, &log);
        let metrics_for_watch = Arc::clone(&metrics);
        let state = web::Data::new(AppState {
            routes: routes
                .iter()
                .map(|r| (r.scope.to_string(), Arc::clone(r)))
                .collect(),
            providers,
            dispatcher: dispatcher.clone(),
            store,
            max_body_bytes: config.server.max_body_bytes,
            body_budget: crate::http::BodyBudget::new(config.server.max_body_bytes_in_flight),
            read_timeout: config.server.read_timeout,
            log: log.clone(),
            metrics,
            admin_token: config.admin.token.clone(),
            paused_retry_after: paused_retry_after(config),
            operator_work: Arc::clone(&operator_work),
            rekey: Default::default(),
            readiness: Default::default(),
            stats: crate::http::StatsCache::new(config.admin.stats_max_age),
            tracer: tracer.clone(),
        });
        let server = http_server(config, listener, state)?;
        info!(log, "hookgate.listening"; "port" => port, "shards" => shards);
        let stopper = Stopper {
            server: server.handle(),
            dispatcher,
            log: log.clone(),
        };
        let crashed = Arc::new(OnceLock::new());
        let watching = actix_rt::spawn(watch_shards(
            stopper.clone(),
            metrics_for_watch,
            Arc::clone(&crashed),
        ));
        Ok(Self {
            port,
            server,
            sweeping,
            scheduling,
            operator_task,
            watching,
            crashed,
            drain_limit: config
                .shutdown_limit()
                .saturating_add(config.lease.duration),
            scheduler,
            operator_work,
            stopper,
            tracer: tracer.map(|t| (t, config.tracing.timeout)),
            log,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's queue scheduler (tests run passes by hand).
    pub fn scheduler(&self) -> Arc<Scheduler> {
        Arc::clone(&self.scheduler)
    }

    /// The node's part in operators' work: pauses and bulk replays (tests run passes by hand).
    pub fn operator_work(&self) -> Arc<OperatorWork> {
        Arc::clone(&self.operator_work)
    }

    /// Stops the node from outside (tests); SIGTERM and SIGINT do the same.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Serves until SIGTERM, SIGINT or [`Stopper::stop`], then waits until every claim
    /// and delivery in flight has been recorded, and stops.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let signals = actix_rt::spawn(stop_on_signal(self.stopper.clone()));
        self.server.await.context("HTTP server")?;
        signals.abort();
        self.sweeping.abort();
        self.scheduling.abort();
        self.operator_task.abort();
        self.watching.abort();
        // Bounded: a queue outcome write waits for the store however long it takes, but a
        // process that never exits is never restarted. Past the limit the unrecorded
        // attempts keep their leases and are retaken, as after a crash.
        let drained = tokio::time::timeout(self.drain_limit, self.stopper.dispatcher.drained());
        if drained.await.is_err() {
            slog::error!(self.log, "hookgate.stop_unrecorded";
                "waited_s" => self.drain_limit.as_secs(),
                "why" => "attempts still waiting for the store; their leases run out and \
                          they are retaken");
            self.stopper.dispatcher.stop();
            anyhow::bail!(
                "stopped with attempts unrecorded after {} s",
                self.drain_limit.as_secs()
            );
        }
        if let Some((tracer, within)) = &self.tracer {
            // The spans of the last attempts, and those still waiting for their batch.
            if !tracer.flush(*within).await {
                slog::warn!(self.log, "tracing.flush_timeout"; "waited_s" => within.as_secs());
            }
        }
        info!(self.log, "hookgate.stopped");
        self.stopper.dispatcher.stop();
        match self.crashed.get() {
            Some(shards) => anyhow::bail!(
                "shard(s) {shards:?} crashed; the node stopped so that it is started afresh"
            ),
            None => Ok(()),
        }
    }
}

/// What every shard of a node is configured with (`shards` of them share the cache).
fn shard_settings(
    config: &Config,
    shards: usize,
    tracer: Option<Arc<crate::trace::Tracer>>,
) -> ShardSettings {
    ShardSettings {
        tracer,
        lease: config.lease.duration,
        retry: config.retry.policy(),
        cache_capacity: config.cache.capacity.div_ceil(shards),
        cache_bytes: config.cache.max_bytes / shards,
        mailbox_capacity: config.server.mailbox_capacity,
        admission_queue: config
            .server
            .admission_queue
            .unwrap_or(config.server.workers_per_shard),
        admission_wait: config.server.admission_wait,
        paused_retry_after: paused_retry_after(config),
        max_target_pause: config.queue.max_target_pause,
    }
}

/// `Retry-After` of a paused provider's 503: the interval at which nodes learn of a resume.
fn paused_retry_after(config: &Config) -> u64 {
    config.queue.poll_interval.as_secs().max(1)
}

/// The HTTP server on `listener`, with the node's limits and shutdown timeout.
fn http_server(
    config: &Config,
    listener: TcpListener,
    state: web::Data<AppState>,
) -> anyhow::Result<Server> {
    let http_workers = config.server.http_workers.unwrap_or_else(cpus).max(1);
    let read_timeout = config.server.read_timeout;
    // With keep-alive off every request is a connection's first, whose head actix times.
    let watch = (!config.server.keep_alive.is_zero()).then(|| {
        let watch = ConnWatch::new(config.server.keep_alive, config.server.read_timeout);
        actix_rt::spawn(close_stuck_connections(Arc::clone(&watch)));
        watch
    });
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap_fn(|req, service| {
                let busy = ConnWatch::busy(&req);
                let answered = service.call(req);
                async move {
                    let answer = answered.await?;
                    Ok(answer.map_body(|_, body| Sent::new(body, busy)))
                }
            })
            .configure(routes)
    })
    .on_connect(move |io, data| {
        bound_writes(io, read_timeout);
        if let Some(watch) = &watch {
            watch.on_connect(io, data);
        }
    })
    .listen(listener)?
    .workers(http_workers)
    // Signals are ours: the shards must stop claiming before the server stops.
    .disable_signals()
    .client_request_timeout(config.server.read_timeout)
    .keep_alive(keep_alive(config.server.keep_alive))
    .max_connections(config.server.max_connections.div_ceil(http_workers))
    .shutdown_timeout(config.shutdown_limit().as_secs().max(1))
    .run())
}

/// How often stuck connections are looked for.
const STUCK_EVERY: Duration = Duration::from_secs(1);

/// Closes, every [`STUCK_EVERY`], the connections stuck in a request head that never ends
/// (see [`ConnWatch`]).
async fn close_stuck_connections(watch: Arc<ConnWatch>) {
    loop {
        tokio::time::sleep(STUCK_EVERY).await;
        watch.sweep();
    }
}

/// The server's keep-alive: off at zero (every connection closed after its answer).
fn keep_alive(idle: Duration) -> KeepAlive {
    if idle.is_zero() {
        KeepAlive::Disabled
    } else {
        KeepAlive::Timeout(idle)
    }
}

/// How often the node checks that every shard is alive: a dead shard's keys are refused
/// 503 until then, so a fraction of a second.
const SHARD_CHECK: Duration = Duration::from_millis(250);

/// Watches the shards; on finding one dead, logs and counts it, notes it in `crashed` and
/// shuts the node down.
async fn watch_shards(stopper: Stopper, metrics: Arc<Metrics>, crashed: Arc<OnceLock<Vec<usize>>>) {
    loop {
        tokio::time::sleep(SHARD_CHECK).await;
        let gone = stopper.dispatcher.crashed_shards();
        if gone.is_empty() {
            continue;
        }
        for &shard in &gone {
            slog::error!(stopper.log, "shard.crashed"; "shard" => shard,
                "why" => "a panic in code the shard ran; the node stops and must be restarted");
            metrics.actor_panic("shard");
        }
        let _ = crashed.set(gone);
        stopper.stop().await;
        return;
    }
}

/// Starts the graceful shutdown on the first SIGTERM or SIGINT.
async fn stop_on_signal(stopper: Stopper) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut term) = signal(SignalKind::terminate()) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    stopper.stop().await;
}

/// Logs `store.not_authenticated` when a Postgres on another host is reached without
/// authenticating it (`sslmode` prefer or require with no root certificate): what
/// `check-config` warns of, said again where the node runs.
fn warn_if_not_authenticated(url: &str, log: &Logger) {
    if crate::store::sqlite::SqliteStore::path_of(url).is_some() {
        return;
    }
    if let Ok(Some(why)) = crate::store::postgres::tls_warning(url) {
        slog::warn!(log, "store.not_authenticated"; "why" => why);
    }
}

/// Logs `store.not_durable` for each database setting under which an acknowledged commit
/// could be lost.
fn warn_if_not_durable(store: Arc<dyn Store>, log: Logger) {
    actix_rt::spawn(async move {
        if let Ok(risks) = store.durability_risks().await {
            for (setting, value) in risks {
                slog::warn!(log, "store.not_durable";
                    "setting" => &setting, "value" => &value,
                    "why" => "an acknowledged done row could be lost and its event delivered again");
            }
        }
    });
}
