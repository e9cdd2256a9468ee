//! Providers end to end: every preset's signature accepted when right and refused (401,
//! nothing claimed, nothing delivered) when tampered, wrongly keyed, stale, future or
//! missing; secret rotation; fingerprints with excluded pointers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hookgate::config::{Config, ProviderConfig};
use hookgate::secret::Secret;
use hookgate::signature::hmac::sign_sha256;
use hookgate::signature::SigningKey;

use crate::helpers::{spawn_app_with, TestApp};

const SECRET: &str = "provider-secret";
const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn providers(target: &str) -> Vec<ProviderConfig> {
    let text = format!(
        r#"
        [[providers]]
        name = "st"
        preset = "stripe"
        secrets = [{{ env = "UNUSED" }}]
        target = {{ url = "{target}" }}
        [[providers]]
        name = "gh"
        preset = "github"
        # The github preset queues by default; this suite checks signatures in sync mode.
        mode = "sync"
        secrets = [{{ env = "UNUSED" }}]
        target = {{ url = "{target}" }}
        [[providers]]
        name = "sw"
        preset = "standard-webhooks"
        secrets = [{{ env = "UNUSED" }}]
        target = {{ url = "{target}" }}
        [[providers]]
        name = "sl"
        preset = "slack"
        secrets = [{{ env = "UNUSED" }}]
        target = {{ url = "{target}" }}
        [[providers]]
        name = "sh"
        preset = "shopify"
        secrets = [{{ env = "UNUSED" }}]
        target = {{ url = "{target}" }}
        [[providers]]
        name = "hm"
        preset = "hmac"
        key = [{{ fields = ["/order", "/kind"] }}]
        secrets = [{{ env = "UNUSED" }}]
        signature = {{ header = "X-Sig", encoding = "base64", prefix = "hmac ", timestamp_header = "X-Ts", template = "{{timestamp}}|{{body}}" }}
        target = {{ url = "{target}" }}
        [[providers]]
        name = "nofp"
        preset = "none"
        fingerprint = "off"
        key = [{{ json = "/id" }}]
        target = {{ url = "{target}" }}
        "#
    );
    let mut providers = Config::from_toml(&text).expect("providers").providers;
    for p in &mut providers {
        let secret = if p.name == "sw" { STD_SECRET } else { SECRET };
        p.signing_keys = vec![SigningKey {
            secret: Secret::new(secret),
            not_after: None,
        }];
    }
    providers
}

async fn app() -> TestApp {
    spawn_app_with(|c| {
        let target = c.providers[0].target.url.clone();
        c.providers.extend(providers(&target));
    })
    .await
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A signed delivery for `provider` of `body` with key `id`, as the sender would send it.
fn signed(provider: &str, secret: &str, id: &str, body: &str, t: i64) -> Vec<(String, String)> {
    let ts = t.to_string();
    let h = |pairs: &[(&str, String)]| {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.clone()))
            .collect::<Vec<_>>()
    };
    let key = secret.as_bytes();
    match provider {
        "st" => h(&[(
            "Stripe-Signature",
            format!(
                "t={ts},v1={}",
                hex::encode(sign_sha256(key, &[ts.as_bytes(), b".", body.as_bytes()]))
            ),
        )]),
        "gh" => h(&[
            (
                "X-Hub-Signature-256",
                format!(
                    "sha256={}",
                    hex::encode(sign_sha256(key, &[body.as_bytes()]))
                ),
            ),
            ("X-GitHub-Delivery", id.into()),
        ]),
        "sw" => {
            let raw = hookgate::signature::standard::decode_secret(key).unwrap_or_default();
            let msg = format!("{id}.{ts}.{body}");
            h(&[
                ("webhook-id", id.into()),
                ("webhook-timestamp", ts.clone()),
                (
                    "webhook-signature",
                    format!("v1,{}", b64(&sign_sha256(&raw, &[msg.as_bytes()]))),
                ),
            ])
        }
        "sl" => h(&[
            (
                "X-Slack-Signature",
                format!(
                    "v0={}",
                    hex::encode(sign_sha256(key, &[format!("v0:{ts}:{body}").as_bytes()]))
                ),
            ),
            ("X-Slack-Request-Timestamp", ts.clone()),
        ]),
        "sh" => h(&[
            (
                "X-Shopify-Hmac-Sha256",
                b64(&sign_sha256(key, &[body.as_bytes()])),
            ),
            ("X-Shopify-Webhook-Id", id.into()),
        ]),
        "hm" => h(&[
            (
                "X-Sig",
                format!(
                    "hmac {}",
                    b64(&sign_sha256(key, &[format!("{ts}|{body}").as_bytes()]))
                ),
            ),
            ("X-Ts", ts.clone()),
        ]),
        other => panic!("no signer for {other}"),
    }
}

/// The body each provider's key is read from.
fn body(provider: &str, id: &str) -> String {
    match provider {
        "st" => format!(r#"{{"id":"{id}","object":"event","pending_webhooks":1}}"#),
        "sl" => format!(r#"{{"event_id":"{id}","type":"event_callback"}}"#),
        "hm" => format!(r#"{{"order":"{id}","kind":"paid","at":1}}"#),
        _ => format!(r#"{{"ref":"{id}"}}"#),
    }
}

async fn send(
    app: &TestApp,
    provider: &str,
    headers: &[(String, String)],
    body: String,
) -> crate::helpers::Answer {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    app.post(&format!("/webhooks/{provider}"), &headers, body)
        .await
}

const TIMESTAMPED: &[&str] = &["st", "sw", "sl", "hm"];

#[actix_web::test]
async fn every_preset_accepts_a_valid_signature_and_refuses_every_bad_one() {
    let app = app().await;
    for provider in ["st", "gh", "sw", "sl", "sh", "hm"] {
        let id = format!("evt_{provider}");
        let good_body = body(provider, &id);
        let good = signed(
            provider,
            if provider == "sw" { STD_SECRET } else { SECRET },
            &id,
            &good_body,
            now(),
        );

        let mut refusals = vec![
            (
                "tampered body",
                good.clone(),
                good_body.replace("evt_", "evt_x"),
                "bad_signature",
            ),
            (
                "wrong secret",
                signed(
                    provider,
                    if provider == "sw" {
                        "whsec_d3Jvbmc="
                    } else {
                        "wrong"
                    },
                    &id,
                    &good_body,
                    now(),
                ),
                good_body.clone(),
                "bad_signature",
            ),
            (
                "no signature",
                vec![],
                good_body.clone(),
                "missing_signature",
            ),
        ];
        if TIMESTAMPED.contains(&provider) {
            let secret = if provider == "sw" { STD_SECRET } else { SECRET };
            refusals.push((
                "stale",
                signed(provider, secret, &id, &good_body, now() - 600),
                good_body.clone(),
                "timestamp_out_of_tolerance",
            ));
            refusals.push((
                "future",
                signed(provider, secret, &id, &good_body, now() + 600),
                good_body.clone(),
                "timestamp_out_of_tolerance",
            ));
        }
        for (what, headers, body, code) in refusals {
            // Keep the key header where the preset reads it, so only the signature is wrong.
            let mut headers = headers;
            if what == "no signature" {
                headers = good
                    .iter()
                    .filter(|(n, _)| {
                        n.contains("Delivery") || n.contains("Webhook-Id") || n == "webhook-id"
                    })
                    .cloned()
                    .collect();
            }
            let answer = send(&app, provider, &headers, body).await;
            assert_eq!(answer.status, 401, "{provider} {what}: {answer:?}");
            assert!(answer.body.contains(code), "{provider} {what}: {answer:?}");
            assert!(
                !answer.body.contains("expected"),
                "never show the expected signature"
            );
        }
        assert_eq!(
            app.target.total(),
            0,
            "{provider}: nothing reached the target"
        );

        let ok = send(&app, provider, &good, good_body.clone()).await;
        assert_eq!(ok.status, 201, "{provider}: {ok:?}");
        assert_eq!(ok.path, "first_run", "{provider}");
        let again = send(&app, provider, &good, good_body).await;
        assert_eq!(
            again.path, "duplicate_done",
            "{provider}: the preset derives the same key"
        );
        assert_eq!(app.target.total(), 1, "{provider}");
        app.target.reset();
    }
    let rejected = app
        .log
        .lines()
        .into_iter()
        .filter(|l| l["msg"] == "webhook.rejected" && l["reason"] == "bad_signature")
        .count();
    assert!(rejected >= 12, "{rejected}");
    let text = serde_json::to_string(&app.log.lines()).unwrap();
    assert!(!text.contains(SECRET), "a secret reached the logs");
}

#[actix_web::test]
async fn a_rotated_out_secret_is_refused_after_not_after_and_both_work_before() {
    let future = SystemTime::now() + Duration::from_secs(3600);
    let past = SystemTime::now() - Duration::from_secs(1);
    for (not_after, old_accepted) in [(future, true), (past, false)] {
        let app = spawn_app_with(|c| {
            let target = c.providers[0].target.url.clone();
            let mut st = providers(&target).remove(0);
            st.signing_keys = vec![
                SigningKey {
                    secret: Secret::new("new-secret"),
                    not_after: None,
                },
                SigningKey {
                    secret: Secret::new("old-secret"),
                    not_after: Some(not_after),
                },
            ];
            c.providers.push(st);
        })
        .await;
        let b = body("st", "evt_new");
        assert_eq!(
            send(&app, "st", &signed("st", "new-secret", "", &b, now()), b)
                .await
                .status,
            201
        );
        let b = body("st", "evt_old");
        let old = send(&app, "st", &signed("st", "old-secret", "", &b, now()), b).await;
        assert_eq!(old.status == 201, old_accepted, "{old:?}");
        assert_eq!(app.target.total(), 1 + usize::from(old_accepted));
    }
}

#[actix_web::test]
async fn stripes_changing_pending_webhooks_is_not_a_mismatch_but_another_amount_is() {
    let app = app().await;
    let first = r#"{"id":"evt_fp","amount":10,"pending_webhooks":2}"#;
    let resent = r#"{ "pending_webhooks": 1, "amount": 10, "id": "evt_fp" }"#;
    let changed = r#"{"id":"evt_fp","amount":99,"pending_webhooks":1}"#;
    for (body, status, path) in [
        (first, 201, "first_run"),
        (resent, 201, "duplicate_done"),
        (changed, 422, "payload_mismatch"),
    ] {
        let answer = send(
            &app,
            "st",
            &signed("st", SECRET, "", body, now()),
            body.into(),
        )
        .await;
        assert_eq!(
            (answer.status, answer.path.as_str()),
            (status, path),
            "{body}"
        );
    }
    assert_eq!(app.target.total(), 1);
    let logged = app.log.events("webhook.payload_mismatch", "evt_fp");
    assert_eq!(logged.len(), 1);
    assert_ne!(
        logged[0]["stored_fingerprint"],
        logged[0]["incoming_fingerprint"]
    );
}

#[actix_web::test]
async fn with_fingerprints_off_another_body_under_the_same_key_is_a_duplicate() {
    let app = app().await;
    send(&app, "nofp", &[], r#"{"id":"k","v":1}"#.into()).await;
    let again = send(&app, "nofp", &[], r#"{"id":"k","v":2}"#.into()).await;
    assert_eq!(again.path, "duplicate_done");
    assert_eq!(app.target.total(), 1);
}
