//! The request headers kept with an event: credentials are never kept, only the headers a
//! provider names, and a failed replay leaves what was kept as it was.

use hookgate::key::EventId;

use crate::helpers::{spawn_app_with, Behaviour, PROVIDER};

#[actix_web::test]
async fn kept_headers_drop_credentials_and_a_failed_replay_keeps_them() {
    let app = spawn_app_with(|c| c.providers[0].keep_headers = vec!["X-Trace".into()]).await;
    app.target.set(Behaviour::Status(500));
    app.post(
        &format!("/webhooks/{PROVIDER}"),
        &[
            ("X-Idempotency-Key", "evt_hdr"),
            ("X-Api-Token", "t0ken"),
            ("X-Webhook-Secret", "s3cret"),
            ("X-Password", "pw"),
            ("X-Client-Key", "k3y"),
            ("X-Authorization", "xauth"),
            ("X-Auth", "auth2"),
            ("Cf-Access-Jwt-Assertion", "cfjwt"),
            ("X-Goog-Iap-Jwt-Assertion", "iapjwt"),
            ("X-Amzn-Oidc-Data", "oidc"),
            ("X-Unnamed", "unnamed"),
            ("X-Trace", "keep-me"),
        ],
        "{}".into(),
    )
    .await;
    let kept = app.db.request_headers(PROVIDER, "evt_hdr").await.unwrap();
    assert!(kept.contains("keep-me"), "{kept}");
    for secret in [
        "t0ken", "s3cret", "pw\"", "k3y", "xauth", "auth2", "cfjwt", "iapjwt", "oidc", "unnamed",
    ] {
        assert!(!kept.contains(secret), "{secret} kept in {kept}");
    }
    // Make it a dead letter, then fail its replay: the kept headers survive.
    app.target.set(Behaviour::Status(400));
    app.deliver("evt_hdr", "{}").await;
    assert_eq!(
        app.db.status(PROVIDER, "evt_hdr").await.as_deref(),
        Some("dead")
    );
    let dead = app.db.request_headers(PROVIDER, "evt_hdr").await.unwrap();
    app.target.set(Behaviour::Status(500));
    let config = crate::helpers::base_config(&app.db, &app.target);
    let line = hookgate::cli::replay(&config, EventId::new(PROVIDER, "evt_hdr"))
        .await
        .expect("replay ran");
    assert!(line.contains("dead again"), "{line}");
    let after = app.db.request_headers(PROVIDER, "evt_hdr").await;
    assert_eq!(after.as_deref(), Some(dead.as_str()));
}
