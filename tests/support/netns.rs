//! Network namespaces for the integration tests: one [`Netns`] type with a name unique
//! per test (`bp-<tag>-<pid>-<counter>`), loopback up, helpers to run commands in it,
//! veth pairs and bridges between namespaces, and cleanup on drop (every process still
//! in the namespace is killed, then the namespace is deleted), which also runs when the
//! test panics, since the guard is dropped while unwinding.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::process::must;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace, deleted (with every process still in it) on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A new namespace `bp-<tag>-<pid>-<counter>` (unique per test, also across test
    /// binaries running at once) with loopback up.
    pub fn new(tag: &str) -> Netns {
        let name = format!(
            "bp-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        must("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// As [`Netns::new`], plus `local 127.0.0.N/32 src 127.0.0.N` routes for N = 2..4,
    /// so a client that connects to 127.0.0.N is seen by the server as 127.0.0.N (for
    /// clients that cannot bind a source address, such as libnfs's).
    pub fn with_loopback_sources(tag: &str) -> Netns {
        let ns = Netns::new(tag);
        for n in 2..=4 {
            let a = format!("127.0.0.{n}");
            ns.ip(&[
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

    /// `ip -n NS ARGS...`; panics unless it succeeds; returns its stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", &self.name];
        a.extend_from_slice(args);
        must("ip", &a)
    }

    /// Run `args` inside the namespace; panics unless it succeeds.
    pub fn exec(&self, args: &[&str]) {
        let mut a = vec!["netns", "exec", &self.name];
        a.extend_from_slice(args);
        must("ip", &a);
    }

    /// A command that runs `program` inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Add a bridge `dev` with address `cidr` in this namespace, and set it up.
    pub fn bridge(&self, dev: &str, cidr: &str) {
        self.ip(&["link", "add", dev, "type", "bridge"]);
        self.ip(&["addr", "add", cidr, "dev", dev]);
        self.ip(&["link", "set", dev, "up"]);
    }

    /// Run `f` on a new thread inside this namespace (threads it starts stay there
    /// too) and return its result; the rest of the process stays where it is.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let name = self.name.clone();
        std::thread::spawn(move || {
            enter_thread(&name);
            f()
        })
        .join()
        .expect("namespace thread panicked")
    }

    /// Bind TCP and UDP `0.0.0.0:port` inside the namespace, as another service holding
    /// the port would (retried for up to 5 s while a previous holder lets go); the port
    /// stays taken while the returned sockets live.
    pub fn hold_port(&self, port: u16) -> (std::net::TcpListener, std::net::UdpSocket) {
        let name = self.name.clone();
        self.run(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let t = std::net::TcpListener::bind(("0.0.0.0", port));
                let u = std::net::UdpSocket::bind(("0.0.0.0", port));
                match (t, u) {
                    (Ok(t), Ok(u)) => return (t, u),
                    (t, u) => assert!(
                        std::time::Instant::now() < deadline,
                        "cannot hold port {port} in {name}: {:?} {:?}",
                        t.err(),
                        u.err()
                    ),
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    }
}

/// Move the calling thread into the network namespace `name`: sockets it (and threads
/// it starts later) opens are in that namespace; other threads are not affected.
pub fn enter_thread(name: &str) {
    use std::os::fd::AsRawFd as _;
    let path = format!("/run/netns/{name}");
    let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
    // SAFETY: setns(2) with a valid namespace fd (open for the call); it changes only
    // the calling thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill whatever still runs in the namespace (again, for up to 5 s, while
        // processes fork or take time to die), then delete it.
        for _ in 0..50 {
            let pids: Vec<String> = Command::new("ip")
                .args(["netns", "pids", &self.name])
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            if pids.is_empty() {
                break;
            }
            for p in &pids {
                let _ = Command::new("kill").args(["-9", p]).status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Two new namespaces (tags `server_tag`, `client_tag`) joined by a veth, `vs` in the
/// server namespace with `server_cidr` and `vc` in the client's, both up.
pub fn veth_pair(server_tag: &str, client_tag: &str, server_cidr: &str) -> (Netns, Netns) {
    let server = Netns::new(server_tag);
    let client = Netns::new(client_tag);
    must(
        "ip",
        &[
            "link",
            "add",
            "vs",
            "netns",
            &server.name,
            "type",
            "veth",
            "peer",
            "name",
            "vc",
            "netns",
            &client.name,
        ],
    );
    server.ip(&["addr", "add", server_cidr, "dev", "vs"]);
    server.ip(&["link", "set", "vs", "up"]);
    client.ip(&["link", "set", "vc", "up"]);
    (server, client)
}

/// The MAC address of `dev` in `ns`.
pub fn mac_of(ns: &Netns, dev: &str) -> String {
    let out = ns.ip(&["-o", "link", "show", dev]);
    let i = out.find("link/ether ").expect("link/ether in ip output") + 11;
    out[i..i + 17].to_string()
}
