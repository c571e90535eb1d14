//! Shared helpers for the DHCP integration tests: network namespaces with a veth
//! between them (unique names, removed by Drop even on failure), the real
//! `bootplane serve` binary inside one of them, and bounded command runs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Fail (never skip) when a tool the test needs is missing.
pub fn require(tool: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{tool} is not installed (scripts/test.sh installs scripts/test-packages.txt)"
    );
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    out
}

pub fn must(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!(
            "bpd{tag}{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        must("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NS ARGS...`
    pub fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", &self.name];
        a.extend_from_slice(args);
        must("ip", &a)
    }

    /// A command to run inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill whatever still runs in the namespace, then delete it.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    pub fn spawn(mut c: Command) -> Proc {
        let child = c.spawn().expect("spawning process");
        Proc { child }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Run the bootplane CLI in `ns` against the API there (127.0.0.1:9090), with
/// `state_dir`; `stdin` is fed to it when given.
pub fn bootplane_cli(ns: &Netns, state_dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut c = ns.cmd(env!("CARGO_BIN_EXE_bootplane"));
    c.args(args)
        .args([
            "--server",
            "http://127.0.0.1:9090",
            "--state-dir",
            state_dir.to_str().unwrap(),
        ])
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

/// A command's stdout and stderr, joined (for assertion messages).
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Two namespaces joined by a veth: `vs` (server side, 10.199.X.1/24) and `vc` (client side).
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

pub struct Lab {
    pub server: Netns,
    pub client: Netns,
    pub dir: tempfile::TempDir,
    pub net: u8,
}

impl Lab {
    pub fn new(net: u8) -> Lab {
        let (server, client) = veth_pair("s", "c", &format!("10.199.{net}.1/24"));
        Lab {
            server,
            client,
            dir: tempfile::tempdir().unwrap(),
            net,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn addr(&self, last: u8) -> String {
        format!("10.199.{}.{last}", self.net)
    }

    /// The bootplane CLI in the server namespace, against its API and state directory.
    pub fn cli(&self, args: &[&str], stdin: Option<&str>) -> Output {
        bootplane_cli(&self.server, &self.path("state"), args, stdin)
    }

    /// Start `bootplane serve` in the server namespace with `args` and a config
    /// file holding `config` (plus state_dir); waits until DHCP listens.
    pub fn start_bootplane(&self, config: &str, args: &[&str], log_name: &str) -> Proc {
        let cfg = self.path("bootplane.toml");
        let state = self.path("state");
        std::fs::write(
            &cfg,
            format!("state_dir = \"{}\"\n{config}", state.display()),
        )
        .unwrap();
        let log = std::fs::File::create(self.path(log_name)).unwrap();
        let mut c = self.server.cmd(env!("CARGO_BIN_EXE_bootplane"));
        c.args(["serve", "--config", cfg.to_str().unwrap()])
            .args(args)
            .env("RUST_LOG", "info,bootplane=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log);
        let p = Proc::spawn(c);
        wait_for(
            Duration::from_secs(15),
            || read(&self.path(log_name)).contains("dhcp server listening"),
            || format!("bootplane did not start: {}", read(&self.path(log_name))),
        );
        p
    }

    /// A client-side hook script for dhclient/udhcpc: logs `<reason> <ip>` and
    /// configures the address (so unicast renewals reach it).
    pub fn client_script(&self) -> PathBuf {
        let p = self.path("client-script.sh");
        let log = self.path("client-script.log");
        let text = format!(
            "#!/bin/sh\n\
             ip=\"${{new_ip_address:-$ip}}\"\n\
             reason=\"${{reason:-$1}}\"\n\
             echo \"$reason $ip\" >> {log}\n\
             case \"$reason\" in\n\
               BOUND|RENEW|REBIND|REBOOT|bound|renew) ip addr replace \"$ip/24\" dev \"$interface\" ;;\n\
             esac\n\
             exit 0\n",
            log = log.display()
        );
        std::fs::write(&p, text).unwrap();
        must("chmod", &["+x", p.to_str().unwrap()]);
        p
    }

    pub fn script_log(&self) -> String {
        read(&self.path("client-script.log"))
    }

    pub fn lease_log(&self) -> String {
        read(&self.path("state/dhcp-leases.log"))
    }
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Poll `cond` every 50 ms until it holds or `limit` passes (then panic with `msg()`).
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool, msg: impl Fn() -> String) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?}: {}", msg());
}

/// Run a command with a hard time limit (via coreutils `timeout`).
pub fn run_bounded(mut c: Command, secs: u32) -> Output {
    let prog = c.get_program().to_owned();
    let args: Vec<_> = c.get_args().map(|a| a.to_owned()).collect();
    let mut t = Command::new("timeout");
    t.arg("-s")
        .arg("KILL")
        .arg(secs.to_string())
        .arg(prog)
        .args(args);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => t.env(k, v),
            None => t.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        t.current_dir(d);
    }
    let _ = &mut c;
    t.output().expect("running bounded command")
}

/// The MAC address of `dev` in `ns`.
pub fn mac_of(ns: &Netns, dev: &str) -> String {
    let out = ns.ip(&["-o", "link", "show", dev]);
    let i = out.find("link/ether ").expect("link/ether in ip output") + 11;
    out[i..i + 17].to_string()
}
