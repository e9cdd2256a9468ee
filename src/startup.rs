//! Builds a running node: the shards and workers, the HTTP server on its listener, and the
//! shutdown sequence. Tests call [`Application::build`] with port 0 and their own store,
//! delivery seam and logger.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, App, HttpServer};
use anyhow::Context as _;
use slog::{info, Logger};

use crate::config::{cpus, Config};
use crate::http::{routes, AppState};
use crate::metrics::Metrics;
use crate::provider::Provider;
use crate::retention::Sweeper;
use crate::retry::RetryPolicy;
use crate::shard::{Dispatcher, ShardSettings};
use crate::store::Store;
use crate::worker::Delivery;

/// A node, bound and ready to serve.
pub struct Application {
    port: u16,
    server: Server,
    sweeping: actix_rt::task::JoinHandle<()>,
    dispatcher: Dispatcher,
    log: Logger,
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
            .map(|p| Ok((p.name.clone(), Provider::from_config(p)?)))
            .collect::<Result<HashMap<_, _>, String>>()
            .map_err(anyhow::Error::msg)?;
        let listener = TcpListener::bind(&config.server.listen)
            .with_context(|| format!("binding {}", config.server.listen))?;
        let port = listener.local_addr()?.port();
        let shards = config.server.shard_count();
        let settings = ShardSettings {
            lease: config.lease.duration,
            retry: RetryPolicy::new(&config.retry),
            cache_capacity: config.cache.capacity.div_ceil(shards),
            mailbox_capacity: config.server.mailbox_capacity,
        };
        let metrics = Arc::new(Metrics::new());
        let dispatcher = Dispatcher::start(
            shards,
            config.server.workers_per_shard,
            settings,
            Arc::clone(&store),
            delivery,
            Arc::clone(&metrics),
            &log,
        );
        let sweeper = Sweeper::new(
            Arc::clone(&store),
            config.retention.clone(),
            Arc::clone(&metrics),
            log.clone(),
        );
        let sweeping = actix_rt::spawn(sweeper.run_forever());
        let state = web::Data::new(AppState {
            providers,
            dispatcher: dispatcher.clone(),
            store,
            max_body_bytes: config.server.max_body_bytes,
            log: log.clone(),
            metrics,
            admin_token: config.admin.token.clone(),
        });
        let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
            .listen(listener)?
            .workers(config.server.http_workers.unwrap_or_else(cpus))
            .shutdown_timeout(config.shutdown.grace.as_secs())
            .run();
        info!(log, "hookgate.listening"; "port" => port, "shards" => shards);
        Ok(Self {
            port,
            server,
            sweeping,
            dispatcher,
            log,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from outside (tests); SIGTERM and SIGINT do the same.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until stopped, then releases the leases of attempts still running so that
    /// senders' retries need not wait for them to expire.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.server.await.context("HTTP server")?;
        self.sweeping.abort();
        let released = self.dispatcher.release_leases().await;
        info!(self.log, "hookgate.stopped"; "leases_released" => released);
        self.dispatcher.stop();
        Ok(())
    }
}
