//! sushy-tools' `sushy-emulator` (the pinned PyPI release scripts/test.sh installs into
//! /opt/bootplane-test-venv) as a test peer: a generated config file (fake driver with N
//! systems, or `--libvirt-uri`), a state directory per emulator, a free loopback port,
//! optional basic auth (an htpasswd file with bcrypt hashes made by the venv's bcrypt),
//! optional TLS (a self-signed certificate for its IP made with the `openssl` CLI),
//! optional listen address and command prefix (`ip netns exec NS`) for namespace tests.
//! Started and waited for until it answers (the service root); killed on drop; [`Sushy::kill`] and
//! [`Sushy::restart`] (same port, same state) for outage tests.
//!
//! What the fake driver does (sushy-tools 2.2.0, `resources/systems/fakedriver.py`):
//! power changes apply 1-11 s after the reset action; GET always reports
//! `BootSourceOverrideEnabled: Continuous`; there is no SessionService.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::run_cmd;

/// The virtualenv scripts/test.sh creates.
pub const VENV: &str = "/opt/bootplane-test-venv";

/// `bin/NAME` of the venv; fails (does not skip) when scripts/test.sh has not made it.
pub fn venv_bin(name: &str) -> PathBuf {
    let p = Path::new(VENV).join("bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/test.sh (it installs sushy-tools from scripts/test-python.txt into {VENV})",
        p.display()
    );
    p
}

/// One fake-driver system.
#[derive(Debug, Clone)]
pub struct FakeSystem {
    pub uuid: String,
    pub name: String,
    pub power_state: &'static str,
}

/// `n` fake systems with UUIDs unique per `group` (an emulator), all Off.
pub fn fake_systems(group: u32, n: usize) -> Vec<FakeSystem> {
    (0..n)
        .map(|i| FakeSystem {
            uuid: format!("{group:08x}-5e5e-4000-8000-{i:012x}"),
            name: format!("fake-{group}-{i}"),
            power_state: "Off",
        })
        .collect()
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Fake-driver systems (ignored with `libvirt_uri`).
    pub systems: Vec<FakeSystem>,
    /// Basic auth: the only accepted user and password.
    pub auth: Option<(String, String)>,
    /// Serve HTTPS with a self-signed certificate for its listen IP.
    pub tls: bool,
    /// The libvirt driver on this URI instead of the fake driver.
    pub libvirt_uri: Option<String>,
    /// Extra `NAME = value` Python lines for the config file.
    pub extra_config: Vec<String>,
    /// Listen here instead of 127.0.0.1 (e.g. an address inside a test namespace).
    pub listen_ip: Option<std::net::Ipv4Addr>,
    /// Run the emulator through this command (e.g. `ip netns exec NS`).
    pub prefix: Vec<String>,
    /// Listen on this port instead of a free one (e.g. the port a BMC database names).
    pub port: Option<u16>,
}

/// A running emulator.
pub struct Sushy {
    pub port: u16,
    /// `http(s)://IP:PORT` (127.0.0.1 unless `listen_ip`).
    pub base_url: String,
    /// The self-signed certificate (PEM) with `tls`.
    pub cert_pem: Option<Vec<u8>>,
    dir: tempfile::TempDir,
    child: Option<Child>,
    libvirt_uri: Option<String>,
    ip: std::net::Ipv4Addr,
    prefix: Vec<String>,
}

/// A free port below the kernel's ephemeral range ([`super::etcd::free_ports`]): a port
/// from bind(0), released until sushy binds it, can meanwhile be taken by another
/// emulator or an outgoing connection; sushy then exits and the readiness probe is
/// answered by whoever holds the port (a suite run's `find_system` found another test
/// emulator's systems there).
fn free_port() -> u16 {
    super::etcd::free_ports(1)[0]
}

fn py_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// An htpasswd line `user:bcrypt-hash` (cost 4: checked on every request).
fn htpasswd_line(user: &str, password: &str) -> String {
    let py = venv_bin("python3");
    let out = run_cmd(
        Command::new(py).args([
            "-c",
            "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
            password,
        ]),
        60,
    );
    assert!(
        out.status.success(),
        "bcrypt: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    format!("{user}:{}", String::from_utf8_lossy(&out.stdout).trim())
}

/// A self-signed certificate for `ip` in `dir` (not a CA: usable as a server
/// certificate and, configured as the only root, as its own trust anchor).
pub fn self_signed(dir: &Path, ip: std::net::Ipv4Addr) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = run_cmd(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={ip}"),
            ])
            .args([
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-addext",
                &format!("subjectAltName=IP:{ip}"),
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
        60,
    );
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

impl Sushy {
    /// Start an emulator on a free loopback port and wait until it accepts connections.
    pub fn start(opts: Options) -> Sushy {
        let dir = tempfile::Builder::new().prefix("sushy-").tempdir().unwrap();
        let port = opts.port.unwrap_or_else(free_port);
        let ip = opts.listen_ip.unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let mut cfg = String::new();
        cfg += &format!("SUSHY_EMULATOR_LISTEN_IP = '{ip}'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\n");
        cfg += &format!(
            "SUSHY_EMULATOR_STATE_DIR = {}\n",
            py_str(state.to_str().unwrap())
        );
        if opts.libvirt_uri.is_none() {
            cfg += "SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_FAKE_SYSTEMS = [\n";
            for (i, s) in opts.systems.iter().enumerate() {
                cfg += &format!(
                    "  {{'uuid': {}, 'name': {}, 'power_state': '{}', 'nics': [{{'mac': '52:54:00:{:02x}:{:02x}:{:02x}', 'ip': '192.0.2.1'}}]}},\n",
                    py_str(&s.uuid), py_str(&s.name), s.power_state, (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff
                );
            }
            cfg += "]\n";
        }
        if let Some((user, password)) = &opts.auth {
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, htpasswd_line(user, password) + "\n").unwrap();
            cfg += &format!(
                "SUSHY_EMULATOR_AUTH_FILE = {}\n",
                py_str(file.to_str().unwrap())
            );
        }
        let mut cert_pem = None;
        if opts.tls {
            let (cert, key) = self_signed(dir.path(), ip);
            cfg += &format!(
                "SUSHY_EMULATOR_SSL_CERT = {}\n",
                py_str(cert.to_str().unwrap())
            );
            cfg += &format!(
                "SUSHY_EMULATOR_SSL_KEY = {}\n",
                py_str(key.to_str().unwrap())
            );
            cert_pem = Some(std::fs::read(cert).unwrap());
        }
        if let Some(uri) = &opts.libvirt_uri {
            cfg += &format!("SUSHY_EMULATOR_LIBVIRT_URI = {}\n", py_str(uri));
        }
        for line in &opts.extra_config {
            cfg += line;
            cfg += "\n";
        }
        std::fs::write(dir.path().join("emulator.conf"), cfg).unwrap();
        let scheme = if opts.tls { "https" } else { "http" };
        let base_url = format!("{scheme}://{ip}:{port}");
        let mut s = Sushy {
            port,
            base_url,
            cert_pem,
            dir,
            child: None,
            libvirt_uri: opts.libvirt_uri,
            ip,
            prefix: opts.prefix,
        };
        s.spawn();
        s
    }

    /// The emulator's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("emulator.log"))
            .unwrap();
        let emulator = venv_bin("sushy-emulator");
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(emulator);
                c
            }
            None => Command::new(emulator),
        };
        cmd.arg("--config")
            .arg(self.dir.path().join("emulator.conf"));
        if let Some(uri) = &self.libvirt_uri {
            cmd.args(["--libvirt-uri", uri]);
        }
        cmd.current_dir(self.dir.path())
            .env("TMPDIR", self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("starting sushy-emulator (run scripts/test.sh): {e}")),
        );
        self.wait_listening(Duration::from_secs(30));
    }

    fn wait_listening(&mut self, limit: Duration) {
        let addr: SocketAddr = (self.ip, self.port).into();
        let start = Instant::now();
        loop {
            if self.answers(&addr) {
                // An emulator that could not bind exits at once: whoever answered was
                // another process on the port.
                std::thread::sleep(Duration::from_millis(300));
                if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                    panic!(
                        "sushy-emulator exited ({status}) while port {} answered (another process holds it):\n{}",
                        self.port,
                        self.log()
                    );
                }
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "sushy-emulator exited ({status}) before listening:\n{}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < limit,
                "sushy-emulator not listening on {} after {limit:?}:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// It accepts a connection and, over plain HTTP, answers `GET /redfish/v1/` (the
    /// service root needs no credentials); over TLS accepting is enough (the tests make
    /// the handshake).
    fn answers(&self, addr: &SocketAddr) -> bool {
        let Ok(mut c) = TcpStream::connect_timeout(addr, Duration::from_millis(200)) else {
            return false;
        };
        if self.base_url.starts_with("https://") {
            return true;
        }
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        let mut head = [0u8; 12];
        c.write_all(b"GET /redfish/v1/ HTTP/1.0\r\n\r\n").is_ok()
            && c.read_exact(&mut head).is_ok()
            && head.starts_with(b"HTTP/1.")
            && &head[9..12] == b"200"
    }

    /// SIGKILL the emulator (its state directory stays).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same port with the same state (after [`Sushy::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        let _ = writeln!(
            std::fs::OpenOptions::new()
                .append(true)
                .open(self.dir.path().join("emulator.log"))
                .unwrap(),
            "--- restart ---"
        );
        self.spawn();
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        self.kill();
    }
}
