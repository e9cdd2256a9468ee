//! Every log event name hookgate writes, with what it means: the one list the docs point
//! to. A test reads `src/` and fails when a name is written that is not here, or a name
//! here is written nowhere.

/// `(name, meaning)` of every log event, grouped by what it is about.
pub const EVENTS: &[(&str, &str)] = &[
    // One event's story: `grep <event_key>` reads it in order.
    (
        "webhook.claim",
        "a delivery got its path: provider, event_key, path, attempts, shard",
    ),
    (
        "webhook.done",
        "the target answered 2xx and the row is done: outcome, status, duration_ms",
    ),
    (
        "webhook.failed",
        "an attempt failed and the row is failed: error, retry_after_s",
    ),
    ("webhook.dead", "the event became a dead letter: reason"),
    (
        "webhook.stale",
        "a late outcome changed nothing, the row was retaken (stale_completion)",
    ),
    (
        "webhook.record_retry",
        "an outcome write failed and is tried again: error, retry_in_ms",
    ),
    (
        "webhook.renew_failed",
        "queue mode: a lease renewal failed and is tried again",
    ),
    (
        "webhook.renew_lost",
        "queue mode: a renewal found another attempt owns the row",
    ),
    (
        "tracing.started",
        "tracing is on: spans are exported to this endpoint",
    ),
    (
        "tracing.flush_timeout",
        "at a stop, the last spans could not be sent within tracing.timeout",
    ),
    (
        "tracing.export_failed",
        "an export of spans failed (the collector refused or did not answer), or the collector \
         rejected some of its spans (a partial success); they are counted failed",
    ),
    (
        "webhook.hung_up",
        "queue mode: the lease could not be confirmed; the attempt hung up",
    ),
    (
        "webhook.payload_mismatch",
        "the key came with another payload (422): both fingerprints",
    ),
    (
        "webhook.unavailable",
        "a 503 that claimed nothing: path, reason, retry_after_s, error",
    ),
    (
        "webhook.rejected",
        "a request refused before any claim: provider, reason",
    ),
    (
        "webhook.unknown_provider",
        "(debug) an unknown provider name, as a bounded excerpt",
    ),
    // Workers.
    (
        "worker.not_started",
        "an attempt whose lease no longer covered the target timeout",
    ),
    (
        "worker.hung_up",
        "a worker dropped a delivery its runner let go of",
    ),
    (
        "worker.crashed",
        "a panic in delivery code, caught; the worker restarts",
    ),
    (
        "worker.restarted",
        "the supervisor started a worker again after a crash",
    ),
    // The queue scheduler and the sweeper.
    (
        "queue.poll_failed",
        "a scheduler pass could not read due rows; it backs off",
    ),
    (
        "queue.measure_failed",
        "the queue depth could not be read for the metrics",
    ),
    (
        "retention.swept",
        "old done or dead rows were deleted: done, dead, backlog_s, longest_lock_ms (the \
         longest one of its transactions held the tables' lock)",
    ),
    (
        "retention.pass_failed",
        "a retention pass, or one of its steps, failed: error, backlog_s; what it could not \
         remove is left for the next pass, which runs after retention.sweep_interval",
    ),
    (
        "retention.behind",
        "rows past retention are left for the next pass: backlog_s, how far past",
    ),
    (
        "retention.slot_filter",
        "the node read a filter of a sealed slot's keys (Postgres): slot, keys, bytes; its \
         claims of new keys skip that slot until it is emptied",
    ),
    (
        "retention.sizes_failed",
        "the tables' sizes could not be read for the metrics",
    ),
    (
        "retention.abandon_failed",
        "turning stale sync rows into sender_gave_up dead letters failed",
    ),
    (
        "retention.orphan_failed",
        "turning a removed provider's queue rows into dead letters failed",
    ),
    (
        "operator_work.failed",
        "reading paused providers or running a bulk replay failed; the next poll tries again",
    ),
    // The node.
    ("hookgate.listening", "the node serves: port, shards"),
    (
        "hookgate.draining",
        "a shutdown began: nothing more is claimed",
    ),
    ("hookgate.stopped", "the node stopped"),
    (
        "hookgate.stop_unrecorded",
        "a stop gave up waiting for attempts still being recorded",
    ),
    (
        "shard.crashed",
        "a shard died (a panic in code it ran); the node stops and exits non-zero",
    ),
    (
        "panic",
        "a panic anywhere, as one line instead of raw stderr",
    ),
    (
        "store.not_durable",
        "the database may lose acknowledged commits: setting, value",
    ),
    (
        "store.migration_waiting",
        "a migration found a table locked (a long transaction) and tries again: attempt, retry_in_ms, error",
    ),
    (
        "store.rekey_started",
        "an operator started a rekey from the admin API: sealing_key, check",
    ),
    (
        "store.rekey_ended",
        "a rekey ended (read to the end, stopped, or a store error): done, rows_read, resealed, unreadable, error",
    ),
    (
        "store.not_authenticated",
        "a Postgres on another host is reached without authenticating it: why",
    ),
    (
        "readyz.store_unavailable",
        "/readyz found the store unreachable",
    ),
    (
        "config.demo_secret",
        "a provider's events are signed with the public demo secret",
    ),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::EVENTS;

    /// Every `"name"` written as a log event (the message of a slog macro) under `dir`.
    fn written(dir: &std::path::Path, found: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                written(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for macro_name in [
                    "info!(", "warn!(", "error!(", "debug!(", "crit!(", "trace!(",
                ] {
                    for (at, _) in text.match_indices(macro_name) {
                        let rest = &text[at + macro_name.len()..];
                        // The logger, a comma, then the message.
                        let Some(comma) = rest.find(',') else {
                            continue;
                        };
                        let message = rest[comma + 1..].trim_start();
                        let Some(quoted) = message.strip_prefix('"') else {
                            continue;
                        };
                        let name = &quoted[..quoted.find('"').unwrap_or(0)];
                        if name.contains('.') || name == "panic" {
                            found.insert(name.to_owned());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_event_written_is_listed_and_every_listed_one_is_written() {
        let mut found = BTreeSet::new();
        written(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        let listed: BTreeSet<String> = EVENTS.iter().map(|(n, _)| (*n).to_owned()).collect();
        let unlisted: Vec<_> = found.difference(&listed).collect();
        let unwritten: Vec<_> = listed.difference(&found).collect();
        assert!(
            unlisted.is_empty(),
            "written but not in EVENTS: {unlisted:?}"
        );
        assert!(
            unwritten.is_empty(),
            "in EVENTS but written nowhere: {unwritten:?}"
        );
        assert_eq!(listed.len(), EVENTS.len(), "a name listed twice");
    }
}
