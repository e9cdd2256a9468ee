//! `hookgate store rekey`: every stored body sealed anew under the sealing key, a page at a
//! time at a bounded rate, with a progress line a page (the loop is `operator_work::rekey`'s,
//! which the admin API's job runs too); and the count `check-config --rows` prints.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context as _;

use crate::config::Config;
use crate::operator_work::rekey::{Rekey, RekeyProgress};
use crate::store::{self, Store};

/// Runs a rekey (with `check`, a count) to its end, printing its progress.
pub(super) async fn rekey(
    config: &Config,
    batch: u32,
    rate: f64,
    check: bool,
) -> anyhow::Result<()> {
    let store = store::open(&config.store)
        .await
        .with_context(|| format!("opening {}", config.store.redacted_url()))?;
    let progress = run(store, batch, rate, check, true).await?;
    out!("{}", summary(&progress))?;
    if progress.unreadable > 0 {
        anyhow::bail!(
            "{} bodies do not open with the configured keys (the latest: {}); add the key \
             that sealed them to [store.encryption] keys and run again",
            progress.unreadable,
            progress.last_unreadable.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// Runs a rekey of `store` to its end; with `print`, a progress line a page.
pub(super) async fn run(
    store: Arc<dyn Store>,
    batch: u32,
    rate: f64,
    check: bool,
    print: bool,
) -> anyhow::Result<RekeyProgress> {
    let mut rekey = Rekey::new(store, check).map_err(anyhow::Error::msg)?;
    let stop = AtomicBool::new(false);
    rekey
        .run(batch, rate, &stop, |p| {
            if print && !p.done {
                let _ = out!("{}", summary(p));
            }
        })
        .await
        .context("rekeying the store")?;
    Ok(rekey.progress().clone())
}

/// One line of progress.
pub(super) fn summary(p: &RekeyProgress) -> String {
    let stale: Vec<String> = p.stale.iter().map(|(k, n)| format!("{k}={n}")).collect();
    format!(
        "{}{}: rows read {}, not under key {}: [{}], resealed {}, changed meanwhile {}, \
         unreadable {}",
        if p.done { "done" } else { "reading " },
        if p.done {
            String::new()
        } else {
            p.table.to_owned()
        },
        p.rows_read,
        p.sealing_key,
        stale.join(", "),
        p.resealed,
        p.changed_meanwhile,
        p.unreadable
    )
}
