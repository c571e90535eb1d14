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
