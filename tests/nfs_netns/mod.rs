//! A network namespace for the NFS tests (nfs_ganesha, provision_nfs_flow, s390x_flow):
//! loopback up, and `local 127.0.0.N/32 src 127.0.0.N` routes for N = 2..4, so an NFS
//! client that connects to 127.0.0.N is seen by the server as 127.0.0.N (libnfs cannot
//! bind a source address). Deleted, with every process still in it, on drop.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub struct Netns(pub String);

impl Netns {
    /// `<prefix>-<pid>-<counter>`: unique per test.
    pub fn new(prefix: &str) -> Netns {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        run(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        for n in 2..=4 {
            let a = format!("127.0.0.{n}");
            ns.exec(&[
                "ip",
                "route",
                "add",
                "local",
                &format!("{a}/32"),
                "dev",
                "lo",
                "src",
                &a,
                "table",
                "local",
            ]);
        }
        ns
    }

    pub fn exec(&self, args: &[&str]) {
        let mut v = vec!["ip", "netns", "exec", &self.0];
        v.extend_from_slice(args);
        run(&v);
    }
}

impl Netns {
    /// Bind TCP and UDP `0.0.0.0:port` inside the namespace, as another service holding
    /// the port would (retried for up to 5 s while a previous holder lets go); the port
    /// stays taken while the returned sockets live.
    pub fn hold_port(&self, port: u16) -> (std::net::TcpListener, std::net::UdpSocket) {
        let path = format!("/run/netns/{}", self.0);
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd as _;
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: setns(2) with a valid namespace fd; it changes only this thread,
            // which ends once the sockets are bound.
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let t = std::net::TcpListener::bind(("0.0.0.0", port));
                let u = std::net::UdpSocket::bind(("0.0.0.0", port));
                match (t, u) {
                    (Ok(t), Ok(u)) => return (t, u),
                    (t, u) => assert!(
                        std::time::Instant::now() < deadline,
                        "cannot hold port {port} in {path}: {:?} {:?}",
                        t.err(),
                        u.err()
                    ),
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.0]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Run a command; panic with its stderr unless it succeeds.
pub fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fail (never skip) when a tool the test drives is not installed.
pub fn require_tools(tools: &[&str]) {
    for t in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false)
            || Path::new("/usr/sbin").join(t).is_file();
        assert!(
            found,
            "{t} is not installed (scripts/test.sh installs scripts/test-packages.txt)"
        );
    }
}
