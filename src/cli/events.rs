//! `hookgate events show|list|history`: one event's row, rows by provider and status, an
//! event's attempts.

use anyhow::Context as _;

use crate::claim::Status;
use crate::config::Config;
use crate::http::{event_json, route_json};
use crate::key::EventId;
use crate::store;

pub(super) async fn show(config: &Config, id: EventId, dead_only: bool) -> anyhow::Result<()> {
    let store = store::open(&config.store).await?;
    match store.operator().event(&id).await? {
        Some(record) if dead_only && record.status != Status::Dead => {
            anyhow::bail!("{id} is {}, not a dead letter", record.status.as_str())
        }
        Some(record) => {
            let mut json = event_json(&record);
            json["routes"] = routes(config, &*store, &id).await?.into();
            out!("{}", serde_json::to_string_pretty(&json)?)?;
            Ok(())
        }
        None => anyhow::bail!("no event {id}"),
    }
}

/// The event's row on each route of its provider (as the admin API shows them): `status`
/// null where the route did not take it.
async fn routes(
    config: &Config,
    store: &dyn store::Store,
    id: &EventId,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let Some(provider) = config.provider(crate::key::provider_of(&id.provider)) else {
        return Ok(Vec::new());
    };
    let mut routes = Vec::new();
    for (_, target) in provider.all_routes() {
        let name = target.name.as_deref();
        let scope = crate::config::route_scope(&provider.name, name);
        let row = store
            .lookup(&EventId::new(scope.as_str(), &*id.key))
            .await?;
        let route = name.unwrap_or(crate::key::MAIN_ROUTE);
        routes.push(route_json(route, &scope, row.as_ref()));
    }
    Ok(routes)
}

/// `events list`: one line a row, least recently changed first — provider, key, status,
/// mode, attempts, age, last error.
pub async fn list(
    config: &Config,
    provider: Option<&str>,
    status: Option<&str>,
    limit: u32,
) -> anyhow::Result<Vec<String>> {
    let status = match status {
        Some(text) => Some(Status::parse(text).with_context(|| {
            format!("unknown status {text:?} (queued, in_progress, done, failed or dead)")
        })?),
        None => None,
    };
    let store = store::open(&config.store).await?;
    let rows = store.list(provider, status, limit).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    Ok(rows
        .iter()
        .map(|r| {
            format!(
                "{}\t{}\t{}\t{}\tattempts={}\tage={}s\t{}",
                r.id.provider,
                r.id.key,
                r.status.as_str(),
                r.mode,
                r.attempts,
                (now - r.created_at).max(0.0).round(),
                r.last_error.as_deref().unwrap_or("-"),
            )
        })
        .collect())
}

/// `events history`: one line an attempt, oldest first, the latest `limit` (at most
/// [`MAX_HISTORY_PAGE`](crate::store::operator::MAX_HISTORY_PAGE)) numbered below `before`;
/// then how many older ones it did not show.
pub async fn history(
    config: &Config,
    id: EventId,
    before: Option<i32>,
    limit: u32,
) -> anyhow::Result<Vec<String>> {
    let store = store::open(&config.store).await?;
    let Some(row) = store.operator().event(&id).await? else {
        anyhow::bail!("no event {id}");
    };
    let limit = limit.clamp(1, crate::store::operator::MAX_HISTORY_PAGE);
    let page = store.operator().history(&id, before, limit).await?;
    let attempts = &page.attempts;
    let mut lines = vec![format!(
        "{id}: {} after {} attempt(s), last path {}",
        row.status.as_str(),
        row.attempts,
        row.last_path.map_or("-", |p| p.as_str())
    )];
    if attempts.is_empty() && row.attempts > 0 {
        lines.push("  (no history rows: a first run that ended done tells its story whole)".into());
    }
    for a in attempts {
        let json = crate::http::attempt_json(a);
        lines.push(format!(
            "  #{} {} {} on {} at {} ({} ms){}{}{}",
            a.attempt,
            a.path,
            a.outcome,
            a.node,
            json["started_at"].as_str().unwrap_or("-"),
            json["duration_ms"],
            a.target_status
                .map(|s| format!(", target {s}"))
                .unwrap_or_default(),
            a.error
                .as_deref()
                .map(|e| format!(", {e}"))
                .unwrap_or_default(),
            a.answer
                .as_deref()
                .map(|t| format!(", answered {:?}", t.chars().take(80).collect::<String>()))
                .unwrap_or_default(),
        ));
    }
    if let Some(older) = page.before {
        lines.push(format!(
            "  ({} of {} history row(s) shown; older ones: --before {older})",
            attempts.len(),
            page.total
        ));
    }
    Ok(lines)
}
