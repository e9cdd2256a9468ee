//! A small W3C WebDriver client for the console's browser test: starts Debian's
//! `chromedriver` on a free port, opens one headless Chromium session with a fresh profile,
//! and offers the few commands the test needs (navigate, find by CSS, click, type, read
//! text, run a script, screenshot), each waiting on its condition under a deadline.
//! Dropping the [`Browser`] ends the session and the driver, even when a test panics.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

/// Debian's browser and its driver (packages `chromium` and `chromium-driver`).
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long a wait for the page may take: far above what a page of this node needs on a
/// loaded two-core machine, short enough that a broken page fails in seconds.
const WAIT: Duration = Duration::from_secs(15);

/// The W3C name of an element reference in a WebDriver answer.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Flags for headless Chromium on this machine: without the background-networking ones
/// Chromium dials out for updates and components, and the closed network refuses it.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
];

/// Whether the browser and driver are installed; the missing one otherwise.
pub fn missing() -> Option<&'static str> {
    [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .find(|path| !Path::new(path).exists())
}

/// Whether a browser test must be skipped: Chromium or its driver is missing, on a
/// developer's own machine (in CI, or as root, where `scripts/test.sh` installs them, a
/// missing one fails the test instead).
pub fn skip_without_browser() -> bool {
    let Some(missing) = missing() else {
        return false;
    };
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    assert!(
        !ci && !root,
        "{missing} is missing: scripts/test.sh installs chromium and chromium-driver as root"
    );
    eprintln!(
        "browser test skipped: {missing} is missing (apt-get install chromium chromium-driver)"
    );
    true
}

/// A WebDriver error answer (or a transport failure, with status 0).
#[derive(Debug)]
pub struct WdError {
    status: u16,
    error: String,
    message: String,
}

impl std::fmt::Display for WdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.error, self.message)
    }
}

/// One headless Chromium session through its own chromedriver.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    profile: PathBuf,
    client: awc::Client,
}

impl Browser {
    /// Starts chromedriver on a free port and a session with a fresh profile under `dir`.
    pub async fn start(dir: &Path) -> Browser {
        let port = free_port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).expect("driver log");
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start chromedriver");
        let client = awc::Client::builder()
            .timeout(Duration::from_secs(60))
            .finish();
        let profile = dir.join(format!("chromium-profile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            profile,
            client,
        };
        let deadline = Instant::now() + WAIT;
        loop {
            let ready = browser.call("GET", "/status", None).await;
            if ready.is_ok_and(|v| v["ready"] == true) {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut args: Vec<String> = FLAGS.iter().map(|f| (*f).to_owned()).collect();
        args.push(format!("--user-data-dir={}", browser.profile.display()));
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        }}});
        let session = browser
            .call("POST", "/session", Some(capabilities))
            .await
            .expect("a Chromium session");
        browser.session = session["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        browser
    }

    /// One WebDriver command; `path` is absolute (`/status`, `/session`).
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, WdError> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let method = awc::http::Method::from_bytes(method.as_bytes()).expect("method");
        let request = self.client.request(method, url);
        let sent = match body {
            Some(body) => request.send_json(&body).await,
            None => request.send().await,
        };
        let mut response = sent.map_err(|e| WdError {
            status: 0,
            error: "transport".into(),
            message: e.to_string(),
        })?;
        let status = response.status().as_u16();
        let answer: Value = response.json().limit(64 << 20).await.map_err(|e| WdError {
            status,
            error: "bad answer".into(),
            message: e.to_string(),
        })?;
        let value = answer["value"].clone();
        if status >= 400 {
            return Err(WdError {
                status,
                error: value["error"].as_str().unwrap_or_default().to_owned(),
                message: value["message"].as_str().unwrap_or_default().to_owned(),
            });
        }
        Ok(value)
    }

    /// A command of this session (`/url`, `/element`, ...).
    async fn session_call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, WdError> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
            .await
    }

    /// Opens `url` and waits for its load.
    pub async fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })))
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Every element `css` matches now, as WebDriver ids.
    async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .session_call(
                "POST",
                "/elements",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e}"));
        found
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Runs `action` on the first element `css` matches, waiting until one exists and the
    /// action succeeds: the console re-renders views, so an element found a moment ago can
    /// be gone (stale) or not yet clickable.
    async fn on_element(
        &self,
        css: &str,
        what: &str,
        method: &str,
        suffix: &str,
        body: Value,
    ) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let last = match self.find_all(css).await.first() {
                Some(id) => {
                    let path = format!("/element/{id}{suffix}");
                    let body = (method == "POST").then(|| body.clone());
                    match self.session_call(method, &path, body).await {
                        Ok(value) => return value,
                        Err(e) => format!("{e}"),
                    }
                }
                None => "no such element".to_owned(),
            };
            if Instant::now() >= deadline {
                self.fail(&format!("{what} {css}: {last}")).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element `css` matches (waiting for it).
    pub async fn click(&self, css: &str) {
        self.on_element(css, "click", "POST", "/click", json!({}))
            .await;
    }

    /// Replaces the text of the input `css` matches with `text`.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "clear", "POST", "/clear", json!({}))
            .await;
        self.on_element(css, "type into", "POST", "/value", json!({ "text": text }))
            .await;
    }

    /// How many elements `css` matches now.
    pub async fn count(&self, css: &str) -> usize {
        self.find_all(css).await.len()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
        .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// Waits until the text of the first element `css` matches holds `wanted`; that text.
    pub async fn wait_text(&self, css: &str, wanted: &str) -> String {
        self.wait_until(&format!("{css} to show {wanted:?}"), || async {
            let text = self.first_text(css).await;
            text.contains(wanted).then_some(text)
        })
        .await
    }

    /// Waits until `css` matches exactly `n` elements.
    pub async fn wait_count(&self, css: &str, n: usize) {
        self.wait_until(&format!("{n} of {css}"), || async {
            (self.count(css).await == n).then_some(())
        })
        .await;
    }

    /// The text of the first element `css` matches now, or "" (never waits).
    async fn first_text(&self, css: &str) -> String {
        let Some(id) = self.find_all(css).await.into_iter().next() else {
            return String::new();
        };
        match self
            .session_call("GET", &format!("/element/{id}/text"), None)
            .await
        {
            Ok(text) => text.as_str().unwrap_or_default().to_owned(),
            Err(_) => String::new(),
        }
    }

    /// Polls `check` until it answers `Some`, failing the test (with a screenshot of the
    /// page) at the deadline.
    pub async fn wait_until<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if Instant::now() >= deadline {
                self.fail(&format!("timed out waiting for {what}")).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of an open `alert()`/`confirm()` dialog, if one is open.
    pub async fn alert_text(&self) -> Option<String> {
        self.session_call("GET", "/alert/text", None)
            .await
            .ok()
            .map(|v| v.as_str().unwrap_or_default().to_owned())
    }

    /// Saves a PNG of the viewport at `path`.
    pub async fn screenshot(&self, path: &Path) {
        let png = self
            .session_call("GET", "/screenshot", None)
            .await
            .expect("screenshot");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap_or_default())
            .expect("screenshot is base64");
        std::fs::write(path, bytes).expect("write screenshot");
    }

    /// Fails the test with `message`, the page's text and a screenshot beside the profile.
    async fn fail(&self, message: &str) -> ! {
        let shot = self.profile.with_extension("failure.png");
        if let Ok(png) = self.session_call("GET", "/screenshot", None).await {
            if let Ok(bytes) =
                base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap_or_default())
            {
                let _ = std::fs::write(&shot, bytes);
            }
        }
        let body = self
            .session_call(
                "POST",
                "/execute/sync",
                Some(json!({ "script": "return document.body.innerText", "args": [] })),
            )
            .await
            .ok();
        panic!(
            "{message}\nthe page said: {}\nscreenshot: {}",
            body.as_ref().and_then(Value::as_str).unwrap_or("?"),
            shot.display()
        );
    }
}

impl Drop for Browser {
    /// Ends the session (chromedriver then closes Chromium) with a plain blocking request,
    /// since a drop cannot await, then stops the driver and removes the profile.
    fn drop(&mut self) {
        if !self.session.is_empty() {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let request = format!(
                    "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n",
                    self.session, self.port
                );
                if stream.write_all(request.as_bytes()).is_ok() {
                    let _ = stream.read_to_end(&mut Vec::new());
                }
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// A port nothing listens on now (the driver binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
