//! Micro-benchmarks of the pure hot paths: key derivation, a target's filter, signature
//! verification, shard routing, the done cache, and sealing at rest.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use criterion::{criterion_group, criterion_main, Criterion};
use hookgate::canonical::{Body, Fingerprinter};
use hookgate::claim::StoredResult;
use hookgate::filter::{Condition, Filter, Scalar};
use hookgate::key::{EventId, KeyDeriver, KeySource};
use hookgate::seal::{Column, Keyring, Place, KEY_BYTES};
use hookgate::secret::Secret;
use hookgate::shard::cache::{CachedDone, DoneCache};
use hookgate::shard::dispatcher::shard_for;
use hookgate::signature::hmac::sign_sha256;
use hookgate::signature::{Scheme, SigningKey, Verifier};

const BODY: &[u8] = br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2023-10-16","created":1700000000,"data":{"object":{"id":"ch_3NG8","amount":2000,"currency":"usd"}},"pending_webhooks":1,"type":"charge.succeeded"}"#;

fn keys(c: &mut Criterion) {
    let headers = HeaderMap::new();
    let json = KeyDeriver::new(vec![KeySource::Json { json: "/id".into() }]);
    c.bench_function("key/json_pointer", |b| {
        b.iter(|| json.derive(&headers, &Body::new(black_box(BODY))))
    });
    let fields = KeyDeriver::new(vec![KeySource::Fields {
        fields: vec!["/data/object/id".into(), "/type".into(), "/created".into()],
    }]);
    c.bench_function("key/fields_hash", |b| {
        b.iter(|| fields.derive(&headers, &Body::new(black_box(BODY))))
    });
    // Every delivery's payload fingerprint, duplicates included.
    let fingerprints = Fingerprinter::new(true, Vec::new());
    c.bench_function("fingerprint/json_body", |b| {
        b.iter(|| fingerprints.fingerprint(&Body::new(black_box(BODY))))
    });
    // A target's filter on a body the key derivation has already parsed (ingest shares one
    // parse): one pointer looked up and compared with a list of eight.
    let filter = Filter {
        all: vec![Condition {
            json: Some("/type".into()),
            one_of: Some(
                (0..8)
                    .map(|i| Scalar::Str(format!("invoice.kind{i}")))
                    .chain([Scalar::Str("charge.succeeded".into())])
                    .collect(),
            ),
            ..Condition::default()
        }],
    };
    let parsed = Body::new(BODY);
    let _ = json.derive(&headers, &parsed);
    c.bench_function("filter/pointer_in_list", |b| {
        b.iter(|| filter.accepts(black_box(&headers), black_box(&parsed)))
    });
}

fn signatures(c: &mut Criterion) {
    let secret = "whsec_bench";
    let now = std::time::SystemTime::now();
    let t = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let sig = hex::encode(sign_sha256(secret.as_bytes(), &[t.as_bytes(), b".", BODY]));
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static("stripe-signature"),
        HeaderValue::from_str(&format!("t={t},v1={sig}")).unwrap(),
    );
    let verifier = Verifier::new(
        Scheme::Stripe,
        vec![SigningKey {
            secret: Secret::new(secret),
            not_after: None,
        }],
        Duration::from_secs(300),
    );
    c.bench_function("signature/stripe_verify", |b| {
        b.iter(|| verifier.verify(&headers, black_box(BODY), now))
    });

    // A valid request with a 1 MB body, beside the costliest requests an attacker can
    // send with the same body: the most candidates a header may list (all the right
    // length, all wrong), and 20,000 empty candidates. Each should cost about one HMAC of
    // the body, or nothing at all.
    let big = vec![b'x'; 1 << 20];
    let big_sig = hex::encode(sign_sha256(secret.as_bytes(), &[t.as_bytes(), b".", &big]));
    let stripe = |value: String| {
        let mut h = HeaderMap::new();
        h.insert(
            HeaderName::from_static("stripe-signature"),
            HeaderValue::from_str(&value).unwrap(),
        );
        h
    };
    let valid = stripe(format!("t={t},v1={big_sig}"));
    let most = stripe(format!(
        "t={t}{}",
        format!(",v1={}", "0".repeat(64)).repeat(hookgate::signature::MAX_CANDIDATES)
    ));
    let flood = stripe(format!("t={t}{}", ",v1=".repeat(20_000)));
    let mut group = c.benchmark_group("signature/stripe_1mb");
    group.sample_size(20);
    group.bench_function("valid", |b| {
        b.iter(|| verifier.verify(&valid, black_box(&big), now))
    });
    group.bench_function("rejected_most_candidates", |b| {
        b.iter(|| verifier.verify(&most, black_box(&big), now))
    });
    group.bench_function("rejected_20000_empty", |b| {
        b.iter(|| verifier.verify(&flood, black_box(&big), now))
    });
    group.finish();
}

fn routing_and_cache(c: &mut Criterion) {
    let id = EventId::new("stripe", "evt_1NG8Du2eZvKYlo2CUI79vXWy");
    c.bench_function("shard/route", |b| b.iter(|| shard_for(black_box(&id), 8)));
    let cache = DoneCache::default();
    let mut writer = cache.writer(100_000, usize::MAX);
    for i in 0..100_000 {
        writer.insert(
            EventId::new("stripe", format!("evt_{i}")),
            CachedDone {
                attempts: 1,
                fingerprint: None,
                result: Arc::new(StoredResult {
                    status: 200,
                    content_type: None,
                    body: Vec::new(),
                }),
            },
        );
    }
    let hit = EventId::new("stripe", "evt_5000");
    let miss = EventId::new("stripe", "evt_missing");
    c.bench_function("cache/hit", |b| {
        b.iter(|| cache.lookup(black_box(&hit), None).is_some())
    });
    c.bench_function("cache/miss", |b| {
        b.iter(|| cache.lookup(black_box(&miss), None).is_some())
    });
}

/// Encryption at rest: a 1 KiB and a 64 KiB body sealed and opened for its place, and a
/// keyed fingerprint (what a first run adds when `[store.encryption]` has a key).
fn sealing(c: &mut Criterion) {
    let keys = Keyring::new(&[("2026-12".into(), [7; KEY_BYTES])]).expect("a keyring");
    let place = Place {
        scope: "stripe",
        key: "evt_1NG8Du2eZvKYlo2CUI79vXWy",
        column: Column::Payload,
    };
    for (name, size) in [("1KiB", 1024), ("64KiB", 65536)] {
        let plain = vec![b'x'; size];
        c.bench_function(&format!("seal/{name}"), |b| {
            b.iter(|| keys.seal(&place, black_box(&plain)))
        });
        let sealed = keys.seal(&place, &plain);
        c.bench_function(&format!("open/{name}"), |b| {
            b.iter(|| keys.open(&place, black_box(&sealed)).is_ok())
        });
    }
    let keyed = Fingerprinter::new(true, Vec::new()).keyed(Some(Arc::new(keys)));
    c.bench_function("fingerprint/json_body_keyed", |b| {
        b.iter(|| keyed.fingerprint(&Body::new(black_box(BODY))))
    });
}

criterion_group!(benches, keys, signatures, routing_and_cache, sealing);
criterion_main!(benches);
