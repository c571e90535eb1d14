//! A single-member etcd (Debian's `etcd-server`, `/usr/bin/etcd`) for the DHCP lease
//! tests: on loopback with free ports, or inside a network namespace on an address of
//! it; a private data directory; killed on drop. Multi-member clusters are
//! `tests/support/etcd.rs`'s.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::netns::Netns;
use super::process::{read, wait_for, Proc};
use super::require::require_file;

pub struct Etcd {
    /// The client URL (`http://ADDR:PORT`).
    pub endpoint: String,
    proc: Proc,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// On 127.0.0.1, free ports.
    pub fn start() -> Etcd {
        // Below the ephemeral range, as the cluster's (see support::etcd::free_ports).
        let p = super::etcd::free_ports(2);
        let (client, peer) = (p[0], p[1]);
        Etcd::spawn(None, "127.0.0.1", client, peer)
    }

    /// Inside `ns`, on `addr` (an address of the namespace), ports 2379 and 2380.
    pub fn start_in(ns: &Netns, addr: &str) -> Etcd {
        Etcd::spawn(Some(ns), addr, 2379, 2380)
    }

    fn spawn(ns: Option<&Netns>, addr: &str, client: u16, peer: u16) -> Etcd {
        require_file("/usr/bin/etcd", "etcd-server");
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("http://{addr}:{client}");
        let peer_url = format!("http://{addr}:{peer}");
        let mut c = match ns {
            Some(ns) => ns.cmd("/usr/bin/etcd"),
            None => Command::new("/usr/bin/etcd"),
        };
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        c.args(["--name", "solo", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("solo={peer_url}")])
            .args([
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let e = Etcd {
            endpoint,
            proc: Proc::spawn(c),
            dir,
        };
        wait_for(
            Duration::from_secs(20),
            || e.ctl(ns, &["endpoint", "health"]).contains("is healthy"),
            || format!("etcd did not become healthy: {}", e.log()),
        );
        e
    }

    /// `etcdctl --endpoints ENDPOINT ARGS` (in `ns`): its stdout and stderr.
    pub fn ctl(&self, ns: Option<&Netns>, args: &[&str]) -> String {
        let mut c = match ns {
            Some(ns) => ns.cmd("etcdctl"),
            None => Command::new("etcdctl"),
        };
        c.args(["--endpoints", &self.endpoint, "--command-timeout", "5s"])
            .args(args);
        let o = super::process::run_for(&mut c, Duration::from_secs(30));
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    }

    /// Every key under `prefix` with its value.
    pub fn get_prefix(&self, ns: Option<&Netns>, prefix: &str) -> Vec<(String, String)> {
        let out = self.ctl(ns, &["get", "--prefix", prefix]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_string(), c[1].to_string()))
            .collect()
    }

    pub fn log(&self) -> String {
        read(&self.dir.path().join("etcd.log"))
    }

    /// Freeze it (SIGSTOP): connections stay open and requests time out, as with a
    /// member cut off by the network.
    pub fn pause(&self) {
        super::process::must("kill", &["-STOP", &self.proc.pid().to_string()]);
    }

    /// Thaw it (SIGCONT).
    pub fn resume(&self) {
        super::process::must("kill", &["-CONT", &self.proc.pid().to_string()]);
    }
}
