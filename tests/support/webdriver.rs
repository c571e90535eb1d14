//! Debian's headless Chromium driven through Debian's `chromedriver` with the W3C
//! WebDriver protocol (plain JSON over HTTP with ureq: no extra crate), for the
//! dashboard's browser test and bench. Chromium runs with the flags this sandbox needs
//! (no sandbox, no GPU, no background networking) and a fresh profile; the session
//! accepts the appliance's self-signed API certificate. The driver and the browser are
//! killed on drop.
//!
//! Self-contained apart from [`super::require`] (benches include it with `#[path]`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// W3C's key for element references.
pub const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: tempfile::TempDir,
}

/// A failed WebDriver command: its error code and message.
#[derive(Debug)]
pub struct WdError(pub String);

impl Browser {
    /// Start chromedriver on a free port and a headless Chromium session with a
    /// `width`×`height` window.
    pub fn start(width: u32, height: u32) -> Browser {
        super::require::require_tools(&["chromium", "chromedriver"]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(120))
            .build();
        let deadline = Instant::now() + Duration::from_secs(20);
        while agent.get(&format!("{base}/status")).call().is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = tempfile::tempdir().unwrap();
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args},
        }}});
        let mut b = Browser {
            driver,
            base,
            session: String::new(),
            agent,
            _profile: profile,
        };
        let v = b.raw("POST", "/session", Some(caps)).expect("new session");
        b.session = v["sessionId"].as_str().expect("session id").to_string();
        b
    }

    fn raw(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, WdError> {
        let url = format!("{}{path}", self.base);
        let r = match body {
            Some(b) => self
                .agent
                .request(method, &url)
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => self.agent.request(method, &url).call(),
        };
        match r {
            Ok(resp) => {
                let text = resp.into_string().map_err(|e| WdError(e.to_string()))?;
                let v: Value = serde_json::from_str(&text).map_err(|e| WdError(e.to_string()))?;
                Ok(v["value"].clone())
            }
            Err(ureq::Error::Status(_, resp)) => {
                let v: Value = resp
                    .into_string()
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or(Value::Null);
                Err(WdError(format!(
                    "{}: {}",
                    v["value"]["error"].as_str().unwrap_or("?"),
                    v["value"]["message"].as_str().unwrap_or("?")
                )))
            }
            Err(e) => Err(WdError(e.to_string())),
        }
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, WdError> {
        self.raw(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({"url": url})))
            .unwrap_or_else(|e| panic!("navigating to {url}: {e:?}"));
    }

    /// Run `script` (a function body; `arguments` are `args`) and return its value.
    pub fn exec(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .unwrap_or_else(|e| panic!("script failed: {e:?}\n{script}"))
    }

    /// Run an async `script` (it calls `arguments[arguments.length-1](value)`).
    pub fn exec_async(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
        .unwrap_or_else(|e| panic!("async script failed: {e:?}\n{script}"))
    }

    /// The first element matching `css`, if any.
    pub fn find(&self, css: &str) -> Option<String> {
        self.cmd(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        )
        .ok()
        .and_then(|v| v[ELEMENT].as_str().map(String::from))
    }

    pub fn click(&self, el: &str) {
        self.cmd("POST", &format!("/element/{el}/click"), Some(json!({})))
            .unwrap_or_else(|e| panic!("click: {e:?}"));
    }

    pub fn type_into(&self, el: &str, text: &str) {
        self.cmd(
            "POST",
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .unwrap_or_else(|e| panic!("typing: {e:?}"));
    }

    /// Press keys at the focused element (WebDriver key codes, e.g. "\u{E015}" down).
    pub fn keys(&self, el: &str, keys: &str) {
        self.type_into(el, keys);
    }

    /// The text of the page's body.
    pub fn body_text(&self) -> String {
        self.exec("return document.body.innerText", json!([]))
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Save a PNG screenshot to `path`.
    pub fn screenshot(&self, path: &Path) {
        if let Ok(v) = self.cmd("GET", "/screenshot", None) {
            use base64::Engine as _;
            if let Some(b) = v
                .as_str()
                .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
            {
                let _ = std::fs::create_dir_all(path.parent().unwrap());
                let _ = std::fs::write(path, b);
            }
        }
    }

    /// Poll `f` until it returns Some (or panic after `secs`, naming `what`).
    pub fn wait<T>(&self, secs: u64, what: &str, mut f: impl FnMut(&Browser) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; page text:\n{}",
                    self.body_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.raw("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
