//! The rules of a provider's routes — its `target` and each of its `routes`: named,
//! unique and URL-safe, an `http(s)://` URL (plain http on this host only, else a
//! warning), a timeout shorter than the lease (sync) or a renewal interval that is
//! (queue), a well-formed filter, queue limits that make sense, and a forwarding secret
//! without `not_after`.
//!
//! Each rule names the route where it is written: `providers.NAME.target…` for the main
//! route, `providers.NAME.routes.ROUTE…` for the others.

use std::collections::HashSet;
use std::time::Duration;

use super::provider::{effective_mode, ProviderConfig, TargetConfig, MAIN_ROUTE};
use super::rule::{advice, rule, show, Rule};
use crate::claim::Mode;

/// Every route of `p`, the main one first.
pub(super) fn route_rules(p: &ProviderConfig, lease: Duration) -> Vec<Rule> {
    let mut rules = Vec::new();
    let mut seen = HashSet::new();
    for (at, target) in p.all_routes() {
        let at = format!("providers.{}.{at}", p.name);
        let main = std::ptr::eq(target, &p.target);
        if main {
            seen.insert(MAIN_ROUTE.to_owned());
            if target.name.is_some() {
                rules.push(rule(
                    format!("{at}.name is not set"),
                    false,
                    "the main route is named main and its rows are the provider's own; \
                     name only the entries of routes",
                ));
            }
        } else {
            let name = target.name.as_deref().unwrap_or("");
            rules.push(rule(
                format!("{at}: name is unique and URL-safe"),
                seen.insert(name.to_owned()) && url_safe(name),
                "every route has a name of letters, digits, '-' and '_', unique within its \
                 provider and not main (the target's name)",
            ));
        }
        rules.extend(one_route_rules(p, &at, target, lease));
    }
    if !p.routes.is_empty() {
        let names: Vec<&str> = p
            .routes
            .iter()
            .map(|r| r.name.as_deref().unwrap_or("?"))
            .collect();
        rules.push(rule(
            format!("providers.{}: routes", p.name),
            true,
            format!(
                "{MAIN_ROUTE} (the target) answers the sender; also delivered to {} (each \
                 event queued for every route that accepts it, in the commit that writes its \
                 first row)",
                names.join(", ")
            ),
        ));
    }
    rules
}

/// Letters, digits, `-` and `_`, at least one.
fn url_safe(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// One route's URL, delivery time, filter, limits and forwarding secret.
fn one_route_rules(p: &ProviderConfig, at: &str, t: &TargetConfig, lease: Duration) -> Vec<Rule> {
    let url = &t.url;
    let local = ["http://127.", "http://localhost", "http://[::1]"]
        .iter()
        .any(|prefix| url.starts_with(prefix));
    let timeout = t.timeout;
    let mut rules = vec![
        rule(
            format!("{at}.url is http:// or https://"),
            url.starts_with("http://") || url.starts_with("https://"),
            format!("url = {url}"),
        ),
        advice(
            format!("{at}: plain http:// only on this host"),
            !url.starts_with("http://") || local,
            format!("url = {url}: events would cross the network unencrypted; use https://"),
        ),
        match effective_mode(p) {
            Mode::Sync => rule(
                format!("{at}.timeout < lease.duration"),
                timeout < lease,
                format!(
                    "timeout {} vs lease {}: lower the timeout or raise lease.duration",
                    show(timeout),
                    show(lease)
                ),
            ),
            Mode::Queue => rule(
                format!("{at} (queue): lease renewal interval < lease.duration"),
                lease / 3 < lease,
                format!(
                    "renewed every {} while a delivery runs (timeout {}); a crash frees the \
                     row after at most {}",
                    show(lease / 3),
                    show(timeout),
                    show(lease)
                ),
            ),
        },
    ];
    if let Some(filter) = &t.filter {
        let problem = filter.check();
        rules.push(rule(
            format!("{at}.filter is well formed"),
            problem.is_none(),
            problem.unwrap_or_else(|| format!("delivers only events where {filter}")),
        ));
    }
    rules.push(rule(
        format!("{at}.max_rate > 0 and max_in_flight >= 1"),
        t.max_rate.is_none_or(|r| r > 0.0 && r.is_finite())
            && t.max_in_flight.is_none_or(|n| n >= 1),
        format!(
            "max_rate {:?}, max_in_flight {:?}",
            t.max_rate, t.max_in_flight
        ),
    ));
    rules.push(rule(
        format!("{at}.signing_secret has no not_after"),
        t.signing_secret
            .as_ref()
            .is_none_or(|s| s.not_after.is_none()),
        "the forwarding secret is used until it is replaced; not_after applies to secrets",
    ));
    rules
}
