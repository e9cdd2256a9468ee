//! What a node says in its log at start about the Postgres it reaches: a server that may
//! lose acknowledged commits, a remote one reached without authenticating it (the risks
//! `check-config` names too, in `check_config.rs`).

use crate::helpers::{eventually, spawn_app, spawn_app_with};

#[actix_web::test]
async fn a_node_on_a_postgres_that_may_lose_commits_says_so_at_start() {
    // The test cluster runs with synchronous_commit = off (scripts/pg-throwaway.sh).
    let app = spawn_app().await;
    eventually("the durability warning", || async {
        app.log.lines().iter().any(|l| {
            l["msg"] == "store.not_durable"
                && l["setting"] == "synchronous_commit"
                && l["value"] == "off"
        })
    })
    .await;
}

/// A node whose `store.url` names a Postgres on another host without authenticating it
/// says so in its log at start, as `check-config` does; one on loopback does not.
#[actix_web::test]
async fn a_node_reaching_a_remote_postgres_unauthenticated_says_so_at_start() {
    let remote = spawn_app_with(|c| {
        // Named as a remote host, reached at the test cluster's loopback address.
        let url = c.store.url.replacen("@127.0.0.1:", "@db.example:", 1);
        let joint = if url.contains('?') { '&' } else { '?' };
        c.store.url = format!("{url}{joint}hostaddr=127.0.0.1");
    })
    .await;
    eventually("the TLS warning", || async {
        remote.log.lines().iter().any(|l| {
            l["msg"] == "store.not_authenticated"
                && l["why"].as_str().is_some_and(|w| w.contains("db.example"))
        })
    })
    .await;
    let local = spawn_app().await;
    assert_eq!(local.log.count("store.not_authenticated"), 0);
}
