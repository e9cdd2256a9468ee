//! `hookgate send PROVIDER [FILE|-]`: a test event signed the way the provider's sender
//! signs it — its configured scheme and first current secret — and posted to this node,
//! as `stripe trigger` or the Svix CLI do. It reads the config and nothing else; what it
//! sends passes the same checks as a real sender's, so a forged event still cannot.

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context as _;
use serde_json::{json, Value};

use crate::config::provider::effective_key;
use crate::config::Config;
use crate::key::KeySource;
use crate::provider::Provider;

/// What `hookgate send` was asked.
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// The provider's name, as in `[[providers]]`.
    pub provider: String,
    /// The body to send: a file, or `-` for stdin. Default: a small JSON test event whose
    /// key fields hold the event id.
    pub file: Option<PathBuf>,
    /// The event id: the value of the provider's key headers, and of its key fields in the
    /// default body. Default: a fresh random id. Send the same id twice to see
    /// `duplicate_done`.
    #[arg(long)]
    pub id: Option<String>,
    /// Where to post. Default: `http://<server.listen>/webhooks/<provider>`.
    #[arg(long)]
    pub url: Option<String>,
}

/// Sends one signed event and prints the answer; an answer other than 2xx is an error.
pub async fn send(config: &Config, args: SendArgs) -> anyhow::Result<()> {
    let entry = config
        .provider(&args.provider)
        .with_context(|| format!("no provider {:?} in the config", args.provider))?;
    let provider =
        Provider::from_config(entry, config.sender_horizon(entry)).map_err(anyhow::Error::msg)?;
    let id = args
        .id
        .unwrap_or_else(|| format!("evt_hookgate_{:016x}", fastrand::u64(..)));
    let sources = effective_key(entry);
    let body = match &args.file {
        None => default_body(&id, &sources).to_string().into_bytes(),
        Some(path) if path.as_os_str() == "-" => {
            let mut body = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut body)
                .context("reading the body from stdin")?;
            body
        }
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    };
    let url = args.url.unwrap_or_else(|| {
        format!(
            "{}/webhooks/{}",
            base_url(&config.server.listen),
            entry.name
        )
    });
    let mut request = awc::Client::new()
        .post(&url)
        .insert_header(("Content-Type", "application/json"));
    for source in &sources {
        if let KeySource::Header { header } = source {
            request = request.insert_header((header.as_str(), id.as_str()));
        }
    }
    for (name, value) in provider.verifier.sign(&body, &id, SystemTime::now()) {
        request = request.insert_header((name, value));
    }
    let mut answer = request
        .send_body(body)
        .await
        .map_err(|e| anyhow::anyhow!("posting to {url}: {e}"))?;
    let status = answer.status();
    out!("HTTP {status}")?;
    for name in ["hookgate-path", "hookgate-attempt", "retry-after"] {
        if let Some(value) = answer.headers().get(name).and_then(|v| v.to_str().ok()) {
            out!("{name}: {value}")?;
        }
    }
    let text = answer.body().await.unwrap_or_default();
    out!("\n{}", String::from_utf8_lossy(&text))?;
    anyhow::ensure!(status.is_success(), "{url} answered {status}");
    Ok(())
}

/// `http://host:port` for a node listening on `listen`; an unspecified address (`0.0.0.0`,
/// `[::]`) is reached on loopback.
fn base_url(listen: &str) -> String {
    let host = match listen.rsplit_once(':') {
        Some(("0.0.0.0", port)) => format!("127.0.0.1:{port}"),
        Some(("[::]", port)) => format!("[::1]:{port}"),
        _ => listen.to_owned(),
    };
    format!("http://{host}")
}

/// A test event: `{"id", "type": "hookgate.test"}`, with `id` also written at every JSON
/// pointer the key reads (objects made along the way), so the key is `id`. Nothing in it
/// depends on the clock: sending one id twice sends the same bytes, as a sender's retry does.
fn default_body(id: &str, sources: &[KeySource]) -> Value {
    let mut body = json!({ "id": id, "type": "hookgate.test" });
    let pointers = sources.iter().flat_map(|s| match s {
        KeySource::Json { json } => std::slice::from_ref(json),
        KeySource::Fields { fields } => fields.as_slice(),
        KeySource::Header { .. } => &[],
    });
    for pointer in pointers {
        set_if_absent(&mut body, pointer, id);
    }
    body
}

/// Writes `value` at the RFC 6901 `pointer` unless something is there already.
fn set_if_absent(body: &mut Value, pointer: &str, value: &str) {
    let mut node = body;
    let segments: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, path)) = segments.split_last() else {
        return;
    };
    for segment in path {
        let Some(object) = node.as_object_mut() else {
            return;
        };
        node = object.entry(segment.clone()).or_insert_with(|| json!({}));
    }
    if let Some(object) = node.as_object_mut() {
        object.entry(last.clone()).or_insert_with(|| json!(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_body_carries_the_id_at_every_key_pointer() {
        let sources = vec![
            KeySource::Json {
                json: "/event_id".into(),
            },
            KeySource::Fields {
                fields: vec!["/order/id".into(), "/type".into()],
            },
        ];
        let body = default_body("evt_9", &sources);
        assert_eq!(body["id"], "evt_9");
        assert_eq!(body["event_id"], "evt_9");
        assert_eq!(body["order"]["id"], "evt_9");
        assert_eq!(body["type"], "hookgate.test", "what is there stays");
    }

    #[test]
    fn the_default_body_is_a_function_of_the_id_alone() {
        // A sender resends the same bytes; two sends of one id a second apart must not
        // differ (a clock field made the second one a payload_mismatch).
        assert_eq!(
            default_body("evt_9", &[]),
            json!({ "id": "evt_9", "type": "hookgate.test" })
        );
    }

    #[test]
    fn an_unspecified_listen_address_is_reached_on_loopback() {
        assert_eq!(base_url("0.0.0.0:8080"), "http://127.0.0.1:8080");
        assert_eq!(base_url("[::]:80"), "http://[::1]:80");
        assert_eq!(base_url("127.0.0.1:9"), "http://127.0.0.1:9");
    }
}
