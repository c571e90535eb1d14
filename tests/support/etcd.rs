//! A real etcd cluster for the store-on-etcd tests (issue 21): N members of Debian's
//! `etcd` (package etcd-server, 3.4) on free loopback ports picked per cluster (so tests
//! run in parallel), data dirs and logs in a tempdir, every member in
//! `--initial-cluster`, elections tuned for tests. Members can be killed (SIGKILL) and
//! restarted on the same data dir and ports; every member is killed on drop, also on
//! panic, and dies with the test process (each is spawned through
//! `sys::die_with_parent` from a launcher thread the cluster owns).
//!
//! The flags, and why (docs/cluster.md repeats them for production):
//! - `--heartbeat-interval 50 --election-timeout 500`: a dead leader is replaced in
//!   about half a second (defaults 100/1000);
//! - `--pre-vote`: a member coming back after a kill does not force an election;
//! - `--max-txn-ops 10000`: one store transaction holds every write of a cascading
//!   deletion, which can be far more than the default 128 operations;
//! - `--auto-compaction-retention` is left at its default (off).
//!
//! [`EtcdCluster::start_in`] runs the members inside a network namespace on an address
//! of it (the namespace's loopback, or a bridge that appliances in other namespaces
//! reach): appliances running in namespaces cannot reach the host's 127.0.0.1.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::netns::{enter_thread, Netns};
use super::process::run_for;
use super::require::require;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Election timing the members run with (ms).
pub const HEARTBEAT_MS: u64 = 50;
pub const ELECTION_MS: u64 = 500;
/// Operations one transaction may hold.
pub const MAX_TXN_OPS: u32 = 10_000;

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A request to the launcher thread: spawn this command, answer with the child.
type Spawn = (Command, mpsc::Sender<std::io::Result<Child>>);

/// An etcd cluster on 127.0.0.1 (or on an address inside a namespace, see
/// [`EtcdCluster::start_in`]); every member is killed on drop.
pub struct EtcdCluster {
    members: Vec<Member>,
    /// The address every member listens on.
    host: String,
    /// The network namespace the members run in (None: this process's).
    netns: Option<String>,
    initial_cluster: String,
    token: String,
    launcher: Option<mpsc::Sender<Spawn>>,
    launcher_thread: Option<std::thread::JoinHandle<()>>,
    dir: tempfile::TempDir,
}

/// `n` distinct free loopback ports: every listener is held until all are known.
pub fn free_ports(n: usize) -> Vec<u16> {
    free_ports_on("127.0.0.1", n)
}

/// `n` distinct free ports on `host` (an address of the calling thread's namespace),
/// taken below the kernel's ephemeral range: a port from that range, released until
/// etcd binds it, can meanwhile become the source port of any outgoing connection
/// (seen: "bind: address already in use" in a suite run). Each is checked free by
/// binding it; a process-wide counter keeps parallel tests apart.
fn free_ports_on(host: &str, n: usize) -> Vec<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (low, span) = (10_000u32, ephemeral_low.saturating_sub(10_000).max(1000));
    let seed = std::process::id().wrapping_mul(7919);
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let p = low + (seed.wrapping_add(NEXT.fetch_add(1, Ordering::SeqCst) * 13)) % span;
        if let Ok(l) = TcpListener::bind((host, p as u16)) {
            held.push(l);
        }
    }
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// Run `f` in the namespace `netns` (on a thread of its own), or here when None.
fn in_netns<T: Send>(netns: Option<&str>, f: impl FnOnce() -> T + Send) -> T {
    match netns {
        None => f(),
        Some(name) => std::thread::scope(|s| {
            s.spawn(|| {
                enter_thread(name);
                f()
            })
            .join()
            .expect("namespace thread panicked")
        }),
    }
}

impl EtcdCluster {
    /// Start `n` members and wait (up to 30 s) until each answers healthy.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_on(n, None, "127.0.0.1")
    }

    /// Start `n` members inside `ns`, listening on `host` (an address of `ns`: its
    /// 127.0.0.1 for appliances in `ns` itself, or a bridge's address that appliances
    /// in other namespaces reach), and wait until each answers healthy. The members
    /// stay in `ns`; health checks and `etcdctl` run there too.
    pub fn start_in(n: usize, ns: &Netns, host: &str) -> EtcdCluster {
        EtcdCluster::start_on(n, Some(ns.name.clone()), host)
    }

    fn start_on(n: usize, netns: Option<String>, host: &str) -> EtcdCluster {
        assert!(n >= 1, "a cluster needs at least one member");
        require("etcd");
        let dir = tempfile::tempdir().unwrap();
        let ports = in_netns(netns.as_deref(), || free_ports_on(host, 2 * n));
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://{host}:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "bp-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let (tx, rx) = mpsc::channel::<Spawn>();
        // The members' parent-death signal follows this thread: it lives as long as the
        // cluster (until the sender is dropped), so a restart from any test thread is safe.
        // In a namespace, the thread enters it first: the members it spawns start there.
        let launcher_ns = netns.clone();
        let launcher_thread = std::thread::Builder::new()
            .name("etcd-launcher".into())
            .spawn(move || {
                if let Some(name) = &launcher_ns {
                    enter_thread(name);
                }
                for (mut cmd, reply) in rx {
                    bootplane::sys::die_with_parent(&mut cmd);
                    let _ = reply.send(cmd.spawn());
                }
            })
            .unwrap();
        let mut c = EtcdCluster {
            members,
            host: host.to_string(),
            netns,
            initial_cluster,
            token,
            launcher: Some(tx),
            launcher_thread: Some(launcher_thread),
            dir,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_healthy(Duration::from_secs(30));
        c
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        assert!(m.child.is_none(), "member {} is already running", m.name);
        let client = format!("http://{}:{}", self.host, m.client_port);
        let peer = format!("http://{}:{}", self.host, m.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .unwrap();
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .arg("--pre-vote")
            .args(["--max-txn-ops", &MAX_TXN_OPS.to_string()])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let (tx, rx) = mpsc::channel();
        self.launcher
            .as_ref()
            .unwrap()
            .send((cmd, tx))
            .expect("etcd launcher thread is gone");
        let child = rx
            .recv()
            .expect("etcd launcher thread is gone")
            .unwrap_or_else(|e| panic!("spawning etcd (apt-get install etcd-server): {e}"));
        self.members[i].child = Some(child);
    }

    /// The members' client URLs, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}:{}", self.host, m.client_port))
            .collect()
    }

    /// The secrets-at-rest key file every appliance on this cluster must share
    /// (`[store] encryption_key_file`: an appliance with a key of its own could not open
    /// the Secrets another sealed), written 0600 with a random key on first use.
    pub fn key_file(&self) -> PathBuf {
        use base64::Engine as _;
        use std::os::unix::fs::PermissionsExt as _;
        let p = self.dir.path().join("secrets.key");
        if !p.exists() {
            let secret: [u8; 32] = rand::random();
            let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
            std::fs::write(
                &p,
                format!("[[keys]]\nname = \"cluster\"\nsecret = \"{b64}\"\n"),
            )
            .unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        p
    }

    /// The client URLs as one comma-separated list (etcdctl's `--endpoints`).
    pub fn endpoints_csv(&self) -> String {
        self.endpoints().join(",")
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The running members' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(|c| c.id()))
            .collect()
    }

    /// Whether member `i` is running (started and not killed).
    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].child.is_some()
    }

    /// SIGKILL member `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        let m = &mut self.members[i];
        let mut c = m
            .child
            .take()
            .unwrap_or_else(|| panic!("member {} is not running", m.name));
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Start member `i` again on its data dir and ports (it rejoins the cluster).
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
    }

    /// Whether the member at client port `port` answers `/health` with true within 2 s
    /// (it has a leader and can serve a quorum read).
    fn member_healthy(host: &str, port: u16) -> bool {
        let r = ureq::get(&format!("http://{host}:{port}/health"))
            .timeout(Duration::from_secs(2))
            .call();
        match r {
            Ok(r) => r
                .into_string()
                .is_ok_and(|b| b.replace(' ', "").contains("\"health\":\"true\"")),
            Err(_) => false,
        }
    }

    /// The member etcd's Raft currently follows as leader, as the running members
    /// report it (`/v3/maintenance/status`); None while there is none or they disagree.
    pub fn leader(&self) -> Option<usize> {
        let host = self.host.as_str();
        let status = |port: u16| -> Option<(String, String)> {
            let body = ureq::post(&format!("http://{host}:{port}/v3/maintenance/status"))
                .timeout(Duration::from_secs(2))
                .send_string("{}")
                .ok()?
                .into_string()
                .ok()?;
            let v: serde_json::Value = serde_json::from_str(&body).ok()?;
            let member = v["header"]["member_id"].as_str()?.to_string();
            let leader = v["leader"].as_str()?.to_string();
            (leader != "0").then_some((member, leader))
        };
        let ports: Vec<u16> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client_port)
            .collect();
        let ids = in_netns(self.netns.as_deref(), || {
            ports.iter().map(|p| status(*p)).collect::<Option<Vec<_>>>()
        })?;
        let leader = &ids.first()?.1;
        if ids.iter().any(|(_, l)| l != leader) {
            return None;
        }
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].child.is_some())
            .collect();
        ids.iter()
            .position(|(m, _)| m == leader)
            .map(|p| running[p])
    }

    /// Whether every running member answers healthy now.
    pub fn healthy(&self) -> bool {
        let ports: Vec<u16> = self
            .members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.client_port)
            .collect();
        let host = self.host.as_str();
        in_netns(self.netns.as_deref(), || {
            ports.iter().all(|p| Self::member_healthy(host, *p))
        })
    }

    /// Wait until every running member answers healthy; panics (with the members'
    /// logs) after `limit`, or when a member has exited.
    pub fn wait_healthy(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            for m in &mut self.members {
                if let Some(st) = m.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                    panic!(
                        "etcd member {} exited ({st}); log:\n{}",
                        m.name,
                        std::fs::read_to_string(&m.log).unwrap_or_default()
                    );
                }
            }
            if self.healthy() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd cluster not healthy within {limit:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `etcdctl --endpoints=<every member> ARGS` (API v3, 2 s per command, 10 s at
    /// most); the caller checks the status.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        require("etcdctl");
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcdctl"]);
                c
            }
            None => Command::new("etcdctl"),
        };
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints_csv()))
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .args(args);
        run_for(&mut c, Duration::from_secs(10))
    }

    /// `etcdctl put KEY VALUE`: whether the cluster took it.
    pub fn put(&self, key: &str, value: &str) -> Result<(), String> {
        let o = self.etcdctl(&["put", key, value]);
        if o.status.success() {
            Ok(())
        } else {
            Err(super::process::text(&o))
        }
    }

    /// `etcdctl get KEY` (a linearizable read): the value, None when absent.
    pub fn get(&self, key: &str) -> Result<Option<String>, String> {
        let o = self.etcdctl(&["get", key, "--print-value-only"]);
        if !o.status.success() {
            return Err(super::process::text(&o));
        }
        let out = String::from_utf8_lossy(&o.stdout);
        Ok(out.lines().next().map(str::to_string))
    }

    /// Every member's log, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let l = std::fs::read_to_string(&m.log).unwrap_or_default();
                format!("--- {} ---\n{}", m.name, super::bootplane::tail(&l, 30))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The tempdir holding the data dirs and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // Closing the channel ends the launcher thread.
        self.launcher.take();
        if let Some(t) = self.launcher_thread.take() {
            let _ = t.join();
        }
    }
}
