//! The real `bootplane` binary in tests: `serve` on free loopback ports with a private
//! state dir (started until `/healthz` answers, killed on drop), its API and its CLI
//! (also inside a network namespace). The API speaks TLS: [`api_agent`] is the one
//! HTTP client for it, trusting only the state dir's CA (`tls/ca.crt`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::api::{claim, claims, sbcs};
use super::netns::Netns;

/// Two distinct free ports: both listeners are held until both are known, so the
/// kernel cannot hand out the same port twice (binding and dropping one at a time could).
pub fn two_free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

pub struct Bootplane {
    pub child: Option<Child>,
    /// The state dir.
    pub dir: PathBuf,
    /// Where the log and the test image catalog are written (the state dir unless
    /// started with [`Bootplane::start_in`]).
    aux: PathBuf,
    pub api: String,
    /// The HTTP client for `api` ([`api_agent`]; set once the CA exists).
    pub agent: ureq::Agent,
    pub api_port: u16,
    pub http_port: u16,
    pub token: String,
    pub extra: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

/// The URL of an API listening on `addr` (e.g. `127.0.0.1:9090`).
pub fn api_url(addr: &str) -> String {
    format!("https://{addr}")
}

/// An agent builder for the API of the bootplane with state dir `state_dir`: TLS
/// trusting only its CA, `<state_dir>/tls/ca.crt` (which must exist).
pub fn api_agent_builder(state_dir: &Path) -> ureq::AgentBuilder {
    api_agent_builder_with(state_dir, None)
}

/// [`api_agent_builder`] presenting the client certificate `(cert, key)` when given.
pub fn api_agent_builder_with(
    state_dir: &Path,
    client: Option<(&Path, &Path)>,
) -> ureq::AgentBuilder {
    let ca = state_dir.join("tls/ca.crt");
    let pem = std::fs::read(&ca).unwrap_or_else(|e| panic!("reading {}: {e}", ca.display()));
    let cfg = bootplane::tls::client_config(&pem, client).unwrap();
    ureq::AgentBuilder::new().tls_config(std::sync::Arc::new(cfg))
}

/// An agent for the API of the bootplane with state dir `state_dir` ([`api_agent_builder`]).
pub fn api_agent(state_dir: &Path) -> ureq::Agent {
    api_agent_builder(state_dir).build()
}

/// A TLS connection to the API on 127.0.0.1:`port` of the bootplane with state dir
/// `state_dir`, for tests that write HTTP by hand (`.sock` is the TCP socket).
pub type ApiStream = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// Open an [`ApiStream`] (the handshake happens on the first read or write).
pub fn api_tls_stream(state_dir: &Path, port: u16) -> ApiStream {
    let pem = std::fs::read(state_dir.join("tls/ca.crt")).unwrap();
    let cfg = bootplane::tls::client_config(&pem, None).unwrap();
    let conn = rustls::ClientConnection::new(
        std::sync::Arc::new(cfg),
        rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
    )
    .unwrap();
    let sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_bootplane")
}

impl Bootplane {
    /// Start with a fresh state dir and the `test` power driver.
    pub fn start(extra: &[&str]) -> Bootplane {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        Bootplane::start_with(dir.clone(), dir, tmp, extra)
    }

    /// Start with state dir `dir`, which the caller owns and which may not exist yet
    /// (`serve` creates it): the log and the image catalog go to a directory of their
    /// own, so nothing but bootplane creates or writes `dir`.
    pub fn start_in(dir: &Path, extra: &[&str]) -> Bootplane {
        let tmp = tempfile::tempdir().unwrap();
        let aux = tmp.path().to_path_buf();
        Bootplane::start_with(dir.to_path_buf(), aux, tmp, extra)
    }

    fn start_with(dir: PathBuf, aux: PathBuf, tmp: tempfile::TempDir, extra: &[&str]) -> Bootplane {
        let (api_port, http_port) = two_free_ports();
        let mut b = Bootplane {
            child: None,
            dir,
            aux,
            api: String::new(),
            agent: ureq::Agent::new(),
            api_port,
            http_port,
            token: String::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _tmp: Some(tmp),
        };
        b.spawn();
        b
    }

    /// The image catalog's directory (`catalog.toml` and the files it lists).
    pub fn images_dir(&self) -> PathBuf {
        self.aux.join("images")
    }

    /// SIGHUP: the catalog and templates are read again.
    pub fn reload(&self) {
        let pid = self.child.as_ref().expect("running").id() as i32;
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    }

    /// A private image catalog with `os-image:latest` (small real files with their
    /// SHA-256), so boot configurations can become Ready.
    fn write_images(&self) -> PathBuf {
        let dir = self.aux.join("images");
        super::image::write_catalog(
            &dir,
            "os-image:latest",
            b"test kernel\n",
            b"test initrd\n",
            "quiet",
        );
        dir
    }

    pub fn spawn(&mut self) {
        let images = self.write_images();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.aux.join("log"))
            .unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--state-dir")
            .arg(&self.dir)
            .arg("--api-listen")
            .arg(format!("127.0.0.1:{}", self.api_port))
            .arg("--http-listen")
            .arg(format!("127.0.0.1:{}", self.http_port))
            .args(if self.extra.iter().any(|a| a == "--power-driver") {
                vec![]
            } else {
                vec!["--power-driver", "test"]
            })
            .arg("--set")
            .arg(format!(
                "boot.images_dir={:?}",
                images.display().to_string()
            ))
            // Private (absent unless a test creates it): the repo's `ignition/` must not
            // leak into every test's served configs. Tests pass their own `--set` after.
            .arg("--set")
            .arg(format!(
                "boot.ignition_templates={:?}",
                self.dir.join("ignition").display().to_string()
            ))
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawning bootplane"));
        // Plain HTTP only when a test asks for it (`--set api.tls=false`, loopback).
        let plain = self.extra.iter().any(|a| a == "api.tls=false");
        let addr = format!("127.0.0.1:{}", self.api_port);
        self.api = if plain {
            format!("http://{addr}")
        } else {
            api_url(&addr)
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Ready: every service started (the API answers /healthz before that).
            if plain {
                if ureq::get(&format!("{}/readyz", self.api)).call().is_ok() {
                    break;
                }
            // The CA is written before the listener binds.
            } else if self.dir.join("tls/ca.crt").exists() {
                self.agent = api_agent(&self.dir);
                if self
                    .agent
                    .get(&format!("{}/readyz", self.api))
                    .call()
                    .is_ok()
                {
                    break;
                }
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("bootplane exited early ({st}); log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "bootplane did not become healthy; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.token = std::fs::read_to_string(self.dir.join("api-token"))
            .unwrap()
            .trim()
            .to_string();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.aux.join("log")).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid; it is not reaped yet, so the pid is ours.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "bootplane did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Run the CLI against this instance. Returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        self.cli_stdin(args, None)
    }

    pub fn cli_stdin(&self, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
        self.cli_env(args, stdin, &[])
    }

    /// [`Bootplane::cli_stdin`] with extra environment variables (`EDITOR`).
    pub fn cli_env(
        &self,
        args: &[&str],
        stdin: Option<&str>,
        env: &[(&str, &str)],
    ) -> (i32, String, String) {
        use std::io::Write;
        let mut c = Command::new(bin())
            .args(args)
            .envs(env.iter().copied())
            .arg("--server")
            .arg(&self.api)
            .arg("--state-dir")
            .arg(&self.dir)
            // No client config of the machine's user applies (its context's token).
            .env("BOOTPLANE_CLIENT_CONFIG", "/dev/null")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(s) = stdin {
            c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        let out = c.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `bootplane_store_secrets_by_key{key="KEY"}` from `/metrics`, None when absent (or
    /// `/metrics` does not answer).
    pub fn secrets_by_key(&self, key: &str) -> Option<i64> {
        let text = self
            .req("GET", "/metrics")
            .call()
            .ok()?
            .into_string()
            .ok()?;
        let want = format!("bootplane_store_secrets_by_key{{key=\"{key}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(want.as_str()))
            .and_then(|v| v.trim().parse().ok())
    }

    pub fn req(&self, method: &str, path: &str) -> ureq::Request {
        self.agent
            .request(method, &format!("{}{}", self.api, path))
            .set("Authorization", &format!("Bearer {}", self.token))
    }

    /// (status, body as JSON).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let r = self.req(method, path);
        let res = match body {
            Some(b) => r
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => r.call(),
        };
        match res {
            Ok(r) => (
                r.status(),
                serde_json::from_str(&r.into_string().unwrap()).unwrap_or(Value::Null),
            ),
            Err(ureq::Error::Status(c, r)) => (
                c,
                serde_json::from_str(&r.into_string().unwrap()).unwrap_or(Value::Null),
            ),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    pub fn get(&self, path: &str) -> Value {
        let (c, v) = self.call("GET", path, None);
        assert_eq!(c, 200, "GET {path}: {v}");
        v
    }

    /// POST the Secret `secret`, then a claim `name` on `server` with that Secret as its
    /// Ignition; wait (up to `secs`) for the claim's boot configuration to be Ready and
    /// return its path.
    pub fn claim_ready_with_ignition(
        &self,
        name: &str,
        server: &str,
        secret: &Value,
        secs: u64,
    ) -> String {
        let (code, v) = self.call("POST", "/api/v1/namespaces/default/secrets", Some(secret));
        assert_eq!(code, 201, "{v}");
        let mut c = claim(name, None, Some(server));
        c["spec"]["ignitionSecretRef"] = serde_json::json!({"name": secret["metadata"]["name"]});
        assert_eq!(self.call("POST", &claims("default"), Some(&c)).0, 201);
        let sbc_path = format!("{}/{name}", sbcs("default"));
        self.wait_for(secs, "boot configuration Ready", || {
            (self.call("GET", &sbc_path, None).1["status"]["state"] == "Ready").then_some(())
        });
        sbc_path
    }

    /// The per-machine script URL of `server` with a Script token for its current boot,
    /// as the DHCP reply to its iPXE carries it (`http.sign_ignition_urls`): minted with
    /// the state dir's token key for the boot id the store holds now (the listener's
    /// index follows the store by watch: poll, see [`Bootplane::signed_script`]).
    pub fn signed_script_url(&self, server: &str) -> String {
        use bootplane::http::token::{Purpose, TokenSigner};
        let key = std::fs::read(self.dir.join("http-token-key")).unwrap();
        let s = self.get(&format!("{}/{server}", super::api::SERVERS));
        let boot = match s
            .pointer("/spec/bootConfigurationRef/name")
            .and_then(Value::as_str)
        {
            Some(n) => {
                let ns = s
                    .pointer("/spec/bootConfigurationRef/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let sbc = self.get(&format!("{}/{n}", sbcs(ns)));
                bootplane::controller::powerstate::claimed_boot_id(
                    &bootplane::model::views::read(&s),
                    &bootplane::model::views::read(&sbc),
                )
            }
            None => String::new(),
        };
        let t = TokenSigner::new(&key).mint(Purpose::Script, server, &boot, unix_now(), 600);
        format!(
            "http://127.0.0.1:{}/ipxe/script?server={server}&token={t}",
            self.http_port
        )
    }

    /// `server`'s own script fetched from `from` with a token
    /// ([`Bootplane::signed_script_url`]), once the listener serves it (200, with an
    /// Ignition URL): the script and the Ignition URL in it.
    pub fn signed_script(&self, from: &str, server: &str, secs: u64) -> (String, String) {
        self.wait_for(secs, "the machine's script with a token", || {
            let (code, script) = super::http::curl_get(from, &self.signed_script_url(server));
            let url = script
                .split_whitespace()
                .find_map(|w| w.strip_prefix("ignition.config.url="))?
                .to_string();
            (code == 200).then_some((script, url))
        })
    }

    /// Poll `f` until it returns Some, or panic after `secs`.
    pub fn wait_for<T>(&self, secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(t) = f() {
                return t;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out waiting for {what}; log tail:\n{}",
                    tail(&self.log(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Bootplane {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Run the bootplane CLI in `ns` against the API there (127.0.0.1:9090), with
/// `state_dir`; `stdin` is fed to it when given.
pub fn bootplane_cli(ns: &Netns, state_dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    bootplane_cli_at(ns, &api_url("127.0.0.1:9090"), state_dir, args, stdin)
}

/// [`bootplane_cli`] against the API at `api` (a URL reachable in `ns`).
pub fn bootplane_cli_at(
    ns: &Netns,
    api: &str,
    state_dir: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Output {
    use std::io::Write;
    let mut c = ns.cmd(env!("CARGO_BIN_EXE_bootplane"));
    c.args(args)
        .args(["--server", api, "--state-dir", state_dir.to_str().unwrap()])
        .env("BOOTPLANE_CLIENT_CONFIG", "/dev/null")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// `bootplane serve --config CONFIG` in `ns` (stderr to `log`, debug logging, no colour),
/// once its log says DHCP listens and it started: the namespace labs' bootplane.
pub fn serve_in(ns: &Netns, config: &Path, log: &Path) -> super::process::Proc {
    serve_in_with(
        ns,
        config,
        &[],
        log,
        &["dhcp server listening", "bootplane started"],
    )
}

/// [`serve_in`] with `extra` arguments after the config (`--set` overrides), once its
/// log holds every line of `ready`.
pub fn serve_in_with(
    ns: &Netns,
    config: &Path,
    extra: &[String],
    log: &Path,
    ready: &[&str],
) -> super::process::Proc {
    let file = std::fs::File::create(log).unwrap();
    let mut c = ns.cmd(env!("CARGO_BIN_EXE_bootplane"));
    c.args(["serve", "--config", config.to_str().unwrap()])
        .args(extra)
        .env("RUST_LOG", "info,bootplane=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
    let mut p = super::process::Proc::spawn(c);
    super::process::wait_for(
        Duration::from_secs(30),
        || {
            let l = super::process::read(log);
            ready.iter().all(|r| l.contains(r)) || p.child.try_wait().ok().flatten().is_some()
        },
        || format!("bootplane did not start: {}", super::process::read(log)),
    );
    if let Some(st) = p.child.try_wait().ok().flatten() {
        panic!("bootplane exited ({st}): {}", super::process::read(log));
    }
    p
}

/// `bootplane get KIND NAME -o json` through the CLI in `ns`; `None` when it fails.
pub fn get_json_in(ns: &Netns, state_dir: &Path, kind: &str, name: &str) -> Option<Value> {
    get_json_at(ns, &api_url("127.0.0.1:9090"), state_dir, kind, name)
}

/// [`get_json_in`] against the API at `api`.
pub fn get_json_at(
    ns: &Netns,
    api: &str,
    state_dir: &Path,
    kind: &str,
    name: &str,
) -> Option<Value> {
    let out = bootplane_cli_at(ns, api, state_dir, &["get", kind, name, "-o", "json"], None);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// A copy of the repo's iPXE templates (`ipxe/*.j2`) under `dir/ipxe-templates`, with
/// `overrides` (`(file name, text)`) written over them.
pub fn ipxe_templates(dir: &Path, overrides: &[(&str, &str)]) -> PathBuf {
    let t = dir.join("ipxe-templates");
    std::fs::create_dir_all(&t).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("ipxe");
    for e in std::fs::read_dir(&repo).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().ends_with(".j2") {
            std::fs::copy(e.path(), t.join(e.file_name())).unwrap();
        }
    }
    for (name, text) in overrides {
        std::fs::write(t.join(name), text).unwrap();
    }
    t
}
