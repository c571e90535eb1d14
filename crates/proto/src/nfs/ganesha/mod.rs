//! The default export backend: an nfs-ganesha server that bootplane runs and configures.
//!
//! Why ganesha rather than an NFSv3 server built into bootplane: enforcement by client
//! address is the point of export policies, and it has to hold for every NFS and MOUNT
//! call, for NFSv3 and NFSv4. nfs-ganesha (Debian `nfs-ganesha` + `nfs-ganesha-vfs`)
//! checks the client's export permissions per request, not only at MOUNT (a client
//! reading a file when its rule is removed fails on its next READ; tested), and is a
//! mature, widely deployed user-space server; a built-in server would have to
//! reimplement MOUNT, NFSv3, file-handle security and portmapper registration before it
//! could enforce anything, for no gain in the copy path (the provisioning job reads the
//! image sequentially; the server is not the bottleneck). No kernel nfsd is needed.
//!
//! How it is driven:
//! - Clients address an export by its name for NFSv3 and NFSv4 alike
//!   (`nfs://server/images/ubuntu/disk.img`): the name is the `Pseudo` path and
//!   `Mount_Path_Pseudo = true` makes the NFSv3 MOUNT use it too, so where the image
//!   lives on the appliance's disk is not part of the address.
//! - bootplane keeps an export table (`exports.json`, so a restart restores it) and
//!   renders the whole `ganesha.conf` from it: one `EXPORT` block per export with
//!   `Access_Type = None` and root squash, and one `CLIENT` block per rule in rule
//!   order (ganesha uses the first matching `CLIENT` block), so a client without a
//!   rule is denied.
//! - Every change writes the file atomically and sends SIGHUP. Debian's ganesha 4.3
//!   reloads exports on SIGHUP ("SIGHUP_HANDLER: ... initiating export list reload",
//!   then "Reread exports complete" in its log): added, changed and removed `EXPORT`
//!   blocks and `CLIENT` lists all take effect, checked with real clients in
//!   `tests/it/nfs_ganesha.rs`. bootplane waits for that log line, so a rule change has
//!   taken effect when `set_rules` returns. The DBus admin interface
//!   (`org.ganesha.nfsd.exportmgr`) needs a system bus, which an appliance (or a
//!   container) often lacks (ganesha logs "DBUS not initialized" here), so it is not used.
//! - Restart is the last resort: only when ganesha is not running, or when a reload is
//!   not confirmed in time or the log reports a config error during the reload. A
//!   restart drops NFS connections, but an unconfirmed reload could leave a revoked
//!   client with access, which is worse.
//! - ganesha registers with rpcbind over rpcbind's Unix socket in `/run`. With
//!   `private_run` (default) ganesha and the rpcbind bootplane starts run in their own
//!   mount namespace with a private tmpfs on `/run`, so they never collide with a host
//!   rpcbind's socket; `netns` runs both inside a named network namespace.
//! - rpcbind does not fail when port 111 is taken (by a host portmapper, say): it keeps
//!   running on IPv6 alone, ganesha registers with it, and clients asking port 111 on
//!   IPv4 reach the other portmapper and never find the server. So before starting it
//!   (`manage_rpcbind`), bootplane binds TCP and UDP `0.0.0.0:111` itself in the
//!   namespace ganesha will run in; when that fails the start fails with
//!   [`NfsError::PortInUse`] naming the port: logged at start by the supervisor, and
//!   export policies are reported `Error` (reason `PortInUse`), not `Applied`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt as _;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use super::rules::{RuleDiff, RuleTarget};
use super::{
    validate_export_name, validate_fs_path, write_atomic, Access, ExportBackend, ExportRule,
    Health, NfsError, Protocol,
};

/// `[nfs.ganesha]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct GaneshaConfig {
    /// Directory for ganesha.conf, the log, the pid file, recovery state and the export
    /// table. Default: `<state_dir>/ganesha`.
    pub dir: Option<PathBuf>,
    pub ganesha_bin: String,
    pub rpcbind_bin: String,
    /// Start rpcbind (`rpcbind -f -w`) next to ganesha. Turn off when the host runs one.
    pub manage_rpcbind: bool,
    /// Run in a private mount namespace with its own `/run` (see the module doc).
    pub private_run: bool,
    /// Run inside this named network namespace (`ip netns exec`).
    pub netns: Option<String>,
    pub nfs_port: u16,
    /// Protocol versions served at all (rules can narrow them per client).
    pub protocols: Vec<Protocol>,
    pub start_timeout_ms: u64,
    pub reload_timeout_ms: u64,
}

impl Default for GaneshaConfig {
    fn default() -> Self {
        GaneshaConfig {
            dir: None,
            ganesha_bin: "ganesha.nfsd".into(),
            rpcbind_bin: "rpcbind".into(),
            manage_rpcbind: true,
            private_run: true,
            netns: None,
            nfs_port: 2049,
            protocols: vec![Protocol::Nfs3, Protocol::Nfs4],
            start_timeout_ms: 20_000,
            reload_timeout_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct ExportTable {
    next_id: u32,
    exports: BTreeMap<String, ExportEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct ExportEntry {
    id: u32,
    fs_path: PathBuf,
    rules: Vec<ExportRule>,
}

struct Inner {
    table: ExportTable,
    child: Option<Child>,
    /// The child's pid, which is also its process group id (tokio forgets the pid once
    /// the child has been reaped, but rpcbind may still live in the group).
    pgid: Option<u32>,
    /// Why the last run ended, for health reporting.
    last_exit: Option<String>,
}

/// A ganesha server managed by bootplane. Create with [`Ganesha::new`], then
/// [`Ganesha::start`]; [`Ganesha::stop`] (or dropping it) ends the processes.
pub struct Ganesha {
    cfg: GaneshaConfig,
    dir: PathBuf,
    inner: Mutex<Inner>,
}

impl Ganesha {
    /// Loads the export table from `<dir>/exports.json` when it exists. Does not start
    /// the server.
    pub fn new(cfg: GaneshaConfig, state_dir: &Path) -> anyhow::Result<Ganesha> {
        use anyhow::Context as _;
        let dir = cfg.dir.clone().unwrap_or_else(|| state_dir.join("ganesha"));
        if cfg.protocols.is_empty() {
            anyhow::bail!("nfs.ganesha.protocols must not be empty");
        }
        let dir_s = dir.to_str().context("ganesha dir is not UTF-8")?;
        super::validate_path_chars(dir_s)
            .map_err(|why| anyhow::anyhow!("ganesha dir {dir_s:?} {why}"))?;
        std::fs::create_dir_all(dir.join("recovery"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        let table_path = dir.join("exports.json");
        let table = match std::fs::read(&table_path) {
            Ok(b) => serde_json::from_slice(&b)
                .with_context(|| format!("parsing {}", table_path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ExportTable {
                next_id: 1,
                exports: BTreeMap::new(),
            },
            Err(e) => return Err(e).with_context(|| format!("reading {}", table_path.display())),
        };
        Ok(Ganesha {
            cfg,
            dir,
            inner: Mutex::new(Inner {
                table,
                child: None,
                pgid: None,
                last_exit: None,
            }),
        })
    }

    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.join("ganesha.conf")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("ganesha.log")
    }

    /// Start ganesha (and rpcbind) unless running; resolves once ganesha reports
    /// "NFS SERVER INITIALIZED".
    pub async fn start(&self) -> Result<(), NfsError> {
        let mut inner = self.inner.lock().await;
        self.start_locked(&mut inner).await
    }

    /// Stop ganesha and rpcbind (SIGTERM to the process group, SIGKILL after 5 s).
    pub async fn stop(&self) {
        let mut inner = self.inner.lock().await;
        stop_child(&mut inner).await;
    }

    /// Run until shutdown: start, restart (with backoff) if ganesha dies, stop at the end.
    pub(crate) async fn supervise(&self, mut shutdown: crate::shutdown::Shutdown) {
        let mut backoff = Duration::from_secs(1);
        loop {
            if let Err(e) = self.start().await {
                tracing::error!(error = %e, "starting nfs-ganesha");
            }
            tokio::select! {
                _ = shutdown.recv() => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            if self.health().await.is_ok() {
                backoff = Duration::from_secs(1);
            } else {
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
        self.stop().await;
    }

    async fn start_locked(&self, inner: &mut Inner) -> Result<(), NfsError> {
        if child_running(inner) {
            return Ok(());
        }
        self.kill_stale().await;
        if self.cfg.manage_rpcbind {
            if let Err(why) = self.portmapper_port_free().await {
                inner.last_exit = Some(why.clone());
                return Err(NfsError::PortInUse(why));
            }
        }
        self.write_config(&inner.table)?;
        let log = self.log_path();
        // ganesha appends forever; keep one old generation across restarts.
        if file_len(&log) > 16 << 20 {
            let _ = std::fs::rename(&log, log.with_extension("log.1"));
        }
        let offset = file_len(&log);
        let mut cmd = self.command();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        // If bootplane dies, ganesha dies with it: exports must not outlive the process
        // that revokes them (rpcbind, its child, is cleaned up by `kill_stale` on the
        // next start).
        crate::sys::die_with_parent(cmd.as_std_mut());
        let mut child = cmd
            .spawn()
            .map_err(|e| NfsError::Down(format!("spawning {}: {e}", self.cfg.ganesha_bin)))?;
        let pid = child.id();
        let stderr = child.stderr.take();
        let deadline = Instant::now() + Duration::from_millis(self.cfg.start_timeout_ms);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                // What it wrote before exiting. rpcbind (in the background) may hold the
                // pipe open, so read what is there for up to a second, not until EOF.
                let mut raw = Vec::new();
                if let Some(mut s) = stderr {
                    use tokio::io::AsyncReadExt as _;
                    let until = tokio::time::Instant::now() + Duration::from_secs(1);
                    let mut buf = [0u8; 4096];
                    while raw.len() < 16 << 10 {
                        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
                            Ok(Ok(n)) if n > 0 => raw.extend_from_slice(&buf[..n]),
                            _ => break,
                        }
                    }
                }
                let err = String::from_utf8_lossy(&raw);
                kill_group(pid, libc::SIGKILL);
                let why = format!(
                    "ganesha exited during startup ({status}): {} {}",
                    err.trim(),
                    tail_problems(&log, offset)
                );
                inner.last_exit = Some(why.clone());
                return Err(NfsError::Down(why));
            }
            let text = read_from(&log, offset);
            if text.contains("NFS SERVER INITIALIZED") {
                break;
            }
            if Instant::now() > deadline {
                kill_group(pid, libc::SIGKILL);
                let _ = child.wait().await;
                let why = format!(
                    "ganesha did not finish starting within {} ms; log {}: {}",
                    self.cfg.start_timeout_ms,
                    log.display(),
                    tail_problems(&log, offset)
                );
                inner.last_exit = Some(why.clone());
                return Err(NfsError::Down(why));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tracing::info!(
            pid = child.id(),
            exports = inner.table.exports.len(),
            "nfs-ganesha started"
        );
        inner.pgid = pid;
        inner.child = Some(child);
        inner.last_exit = None;
        Ok(())
    }

    /// Whether the rpcbind we are about to start can have port 111 (TCP and UDP, IPv4) in
    /// ganesha's network namespace. A portmapper we just killed may take a moment to let
    /// go, so a taken port is retried for up to 2 s before it is reported.
    async fn portmapper_port_free(&self) -> Result<(), String> {
        let netns = self.cfg.netns.clone();
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let ns = netns.clone();
            let r = tokio::task::spawn_blocking(move || probe_port(ns.as_deref(), PORTMAPPER_PORT))
                .await
                .unwrap_or_else(|e| Err(format!("port probe failed: {e}")));
            match r {
                Ok(()) => return Ok(()),
                Err(detail) if Instant::now() >= deadline => {
                    let place = match &netns {
                        Some(ns) => format!(" in network namespace {ns}"),
                        None => String::new(),
                    };
                    return Err(format!(
                        "port {PORTMAPPER_PORT} (portmapper) is already in use{place} ({detail}): the rpcbind bootplane starts could not bind it and NFS clients would not find the server; stop the other portmapper, or set nfs.ganesha.manage_rpcbind = false to register with it"
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// A ganesha left running by an earlier bootplane process that was killed (its pid
    /// file is in our dir and its command line names our config): kill its process group
    /// (rpcbind included) so the new one can bind its ports and no stale rule survives.
    async fn kill_stale(&self) {
        let Ok(pid) = std::fs::read_to_string(self.dir.join("ganesha.pid")) else {
            return;
        };
        let Ok(pid) = pid.trim().parse::<i32>() else {
            return;
        };
        if pid <= 1 {
            return;
        }
        let conf = self.config_path().display().to_string();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline)
            .split('\0')
            .any(|a| a == conf)
        {
            // ganesha itself is gone (it dies with bootplane), but the rpcbind it started
            // stays in its process group with stale registrations: a new rpcbind could
            // not bind, and clients would be sent to ports nobody listens on.
            let stale = group_members(pid, "rpcbind");
            for &p in &stale {
                tracing::warn!(pid = p, "killing rpcbind left over from an earlier run");
                // SAFETY: kill(2) on a process verified to be an rpcbind in our old group.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                }
            }
            // Gone (and its port 111 free) before the new one starts.
            let deadline = Instant::now() + Duration::from_secs(5);
            while stale.iter().any(|&p| is_live(p)) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            return;
        }
        tracing::warn!(pid, "killing nfs-ganesha left over from an earlier run");
        // SAFETY: kill(2) on a process (group) verified above to be our ganesha.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while is_live(pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn command(&self) -> Command {
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = &self.cfg.netns {
            argv.extend(["ip", "netns", "exec", ns.as_str()].map(String::from));
        }
        if self.cfg.private_run {
            argv.extend(["unshare", "--mount", "--propagation", "private", "--"].map(String::from));
        }
        let mut script = String::from("set -e\n");
        if self.cfg.private_run {
            script.push_str("mount -t tmpfs -o mode=0755 bootplane-run /run\n");
        }
        script.push_str("mkdir -p /run/ganesha\n");
        if self.cfg.manage_rpcbind {
            // -w: warm start; -f: foreground (so it stays in our process group).
            script.push_str("\"$1\" -f -w &\ni=0\nwhile [ ! -S /run/rpcbind.sock ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n");
        }
        script.push_str("exec \"$2\" -F -f \"$3\" -L \"$4\" -p \"$5\" -N NIV_EVENT\n");
        argv.extend([
            "sh".to_string(),
            "-c".to_string(),
            script,
            "bootplane-ganesha".to_string(),
        ]);
        argv.push(self.cfg.rpcbind_bin.clone());
        argv.push(self.cfg.ganesha_bin.clone());
        argv.push(self.config_path().display().to_string());
        argv.push(self.log_path().display().to_string());
        argv.push(self.dir.join("ganesha.pid").display().to_string());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd
    }

    fn write_config(&self, table: &ExportTable) -> Result<(), NfsError> {
        let text = render_config(&self.cfg, &self.dir, table);
        write_atomic(&self.config_path(), text.as_bytes())
    }

    fn save_table(&self, table: &ExportTable) -> Result<(), NfsError> {
        let json = serde_json::to_vec_pretty(table).map_err(NfsError::backend)?;
        write_atomic(&self.dir.join("exports.json"), &json)
    }

    /// Persist the table, rewrite ganesha.conf and make ganesha apply it.
    async fn apply(&self, inner: &mut Inner) -> Result<(), NfsError> {
        self.save_table(&inner.table)?;
        self.write_config(&inner.table)?;
        if !child_running(inner) {
            // Not started (or died): starting it reads the new config.
            return self.start_locked(inner).await;
        }
        match self.reload(inner).await {
            Ok(()) => Ok(()),
            Err(why) => {
                tracing::warn!(reason = %why, "nfs-ganesha export reload not confirmed; restarting it so the new rules are in force");
                stop_child(inner).await;
                self.start_locked(inner).await
            }
        }
    }

    /// SIGHUP and wait for "Reread exports complete" in the log.
    async fn reload(&self, inner: &mut Inner) -> Result<(), String> {
        let log = self.log_path();
        let offset = file_len(&log);
        let pid = inner
            .child
            .as_ref()
            .and_then(|c| c.id())
            .ok_or("ganesha has no pid")?;
        // SAFETY: plain kill(2) on our own child.
        if unsafe { libc::kill(pid as i32, libc::SIGHUP) } != 0 {
            return Err(format!(
                "sending SIGHUP to ganesha: {}",
                std::io::Error::last_os_error()
            ));
        }
        let deadline = Instant::now() + Duration::from_millis(self.cfg.reload_timeout_ms);
        loop {
            let text = read_from(&log, offset);
            if let Some(problem) = reload_problem(&text) {
                return Err(format!("ganesha reported during reload: {problem}"));
            }
            if text.contains("Reread exports complete") {
                return Ok(());
            }
            if !child_running(inner) {
                return Err("ganesha exited during reload".into());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no \"Reread exports complete\" in {} within {} ms",
                    log.display(),
                    self.cfg.reload_timeout_ms
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        if let Ok(inner) = self.inner.try_lock() {
            kill_group(inner.pgid, libc::SIGKILL);
        }
    }
}

/// The portmapper's well-known port.
const PORTMAPPER_PORT: u16 = 111;

/// Bind TCP and UDP `0.0.0.0:port` (and let go at once) in network namespace `netns`
/// (`/run/netns/NAME`, as `ip netns` names it) or in ours. `Err` names what was in use;
/// any other failure (no permission to bind a low port, say) cannot tell, so it passes.
fn probe_port(netns: Option<&str>, port: u16) -> Result<(), String> {
    let netns = netns.map(|n| PathBuf::from("/run/netns").join(n));
    // A thread of its own: entering a namespace changes the calling thread for good.
    let t = std::thread::Builder::new()
        .name("nfs-port-probe".into())
        .spawn(move || -> Result<(), String> {
            if let Some(p) = &netns {
                use std::os::fd::AsRawFd as _;
                // Not there (or not enterable): ganesha's own start reports that.
                let Ok(f) = std::fs::File::open(p) else {
                    tracing::debug!(netns = %p.display(), "cannot open the namespace to probe the portmapper port");
                    return Ok(());
                };
                // SAFETY: setns(2) with a valid namespace fd, on this short-lived thread,
                // which only binds two sockets and ends.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    tracing::debug!(netns = %p.display(), error = %std::io::Error::last_os_error(), "cannot enter the namespace to probe the portmapper port");
                    return Ok(());
                }
            }
            let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
            let in_use = |proto: &str, r: std::io::Result<()>| match r {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    Err(format!("{proto} {addr}: {e}"))
                }
                Err(e) => {
                    tracing::debug!(proto, %addr, error = %e, "cannot probe the portmapper port");
                    Ok(())
                }
                Ok(()) => Ok(()),
            };
            // TcpListener sets SO_REUSEADDR, as rpcbind does: only a listener conflicts.
            in_use("tcp", std::net::TcpListener::bind(addr).map(drop))?;
            in_use("udp", std::net::UdpSocket::bind(addr).map(drop))
        })
        .map_err(|e| format!("spawning the port probe: {e}"))?;
    t.join()
        .unwrap_or_else(|_| Err("the port probe panicked".into()))
}

fn child_running(inner: &mut Inner) -> bool {
    let Some(c) = inner.child.as_mut() else {
        return false;
    };
    match c.try_wait() {
        Ok(None) => true,
        Ok(Some(status)) => {
            kill_group(inner.pgid.take(), libc::SIGKILL); // rpcbind too
            inner.last_exit = Some(format!("ganesha exited ({status})"));
            inner.child = None;
            false
        }
        Err(e) => {
            inner.last_exit = Some(format!("checking ganesha: {e}"));
            false
        }
    }
}

async fn stop_child(inner: &mut Inner) {
    let pgid = inner.pgid.take();
    let Some(mut c) = inner.child.take() else {
        kill_group(pgid, libc::SIGKILL);
        return;
    };
    kill_group(pgid, libc::SIGTERM);
    if tokio::time::timeout(Duration::from_secs(5), c.wait())
        .await
        .is_err()
    {
        kill_group(pgid, libc::SIGKILL);
        let _ = c.wait().await;
    }
    kill_group(pgid, libc::SIGKILL);
    inner.last_exit = Some("stopped by bootplane".into());
}

fn kill_group(pid: Option<u32>, sig: i32) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) on the process group we created with process_group(0).
        unsafe {
            libc::kill(-(pid as i32), sig);
        }
    }
}

/// Processes in process group `pgid` whose command name is `comm`.
fn group_members(pgid: i32, comm: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                return false;
            };
            // pid (comm) state ppid pgrp ...
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let name = head.split_once('(').map(|(_, n)| n).unwrap_or("");
            let pgrp = rest
                .split_whitespace()
                .nth(2)
                .and_then(|x| x.parse::<i32>().ok());
            name == comm && pgrp == Some(pgid)
        })
        .collect()
}

/// Running (not a zombie).
fn is_live(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// Log text from `offset` (bounded to 1 MiB).
fn read_from(p: &Path, offset: u64) -> String {
    let Ok(mut f) = std::fs::File::open(p) else {
        return String::new();
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(1 << 20).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The CRIT/MAJ/FATAL lines logged since `offset` (for error messages).
fn tail_problems(p: &Path, offset: u64) -> String {
    let text = read_from(p, offset);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| is_problem_line(l) && !is_benign(l))
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

fn is_problem_line(l: &str) -> bool {
    l.contains(" :CRIT :") || l.contains(" :MAJ :") || l.contains(" :FATAL :")
}

/// CRIT lines ganesha always logs without DBus or Kerberos; not our problem.
fn is_benign(l: &str) -> bool {
    l.contains(":DBUS :")
        || l.contains("krb5")
        || l.contains("keytab")
        || l.contains("credentials for principal")
}

/// A config error logged while re-reading exports.
fn reload_problem(text: &str) -> Option<String> {
    text.lines()
        .find(|l| {
            is_problem_line(l)
                && !is_benign(l)
                && (l.contains(":CONFIG :") || l.contains(":EXPORT :"))
        })
        .map(|l| l.to_string())
}

fn protocols_list(p: &[Protocol]) -> String {
    let v: Vec<&str> = p
        .iter()
        .map(|p| match p {
            Protocol::Nfs3 => "3",
            Protocol::Nfs4 => "4",
        })
        .collect();
    v.join(", ")
}

/// Render the complete ganesha.conf for `table` (pure).
fn render_config(cfg: &GaneshaConfig, dir: &Path, table: &ExportTable) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Written by bootplane; edits are overwritten on the next export change."
    );
    let _ = writeln!(out, "NFS_CORE_PARAM {{\n    NFS_Port = {};\n    Protocols = {};\n    Enable_NLM = false;\n    Enable_RQUOTA = false;\n    Mount_Path_Pseudo = true;\n}}", cfg.nfs_port, protocols_list(&cfg.protocols));
    let _ = writeln!(
        out,
        "NFSv4 {{\n    Graceless = true;\n    RecoveryRoot = \"{}\";\n}}",
        dir.join("recovery").display()
    );
    let _ = writeln!(out, "NFS_KRB5 {{\n    Active_krb5 = false;\n}}");
    // Deny by default: a client that matches no CLIENT block gets nothing.
    let _ = writeln!(
        out,
        "EXPORT_DEFAULTS {{\n    Access_Type = None;\n    Squash = Root_Squash;\n}}"
    );
    for (name, e) in &table.exports {
        let _ = writeln!(out, "EXPORT {{");
        let _ = writeln!(out, "    Export_Id = {};", e.id);
        let _ = writeln!(out, "    Path = \"{}\";", e.fs_path.display());
        let _ = writeln!(out, "    Pseudo = \"{name}\";");
        let _ = writeln!(out, "    Access_Type = None;");
        let _ = writeln!(out, "    Squash = Root_Squash;");
        let _ = writeln!(out, "    Protocols = {};", protocols_list(&cfg.protocols));
        let _ = writeln!(out, "    SecType = sys;");
        let _ = writeln!(out, "    FSAL {{\n        Name = VFS;\n    }}");
        for r in &e.rules {
            let protos: Vec<Protocol> = if r.protocols.is_empty() {
                cfg.protocols.clone()
            } else {
                r.protocols
                    .iter()
                    .copied()
                    .filter(|p| cfg.protocols.contains(p))
                    .collect()
            };
            if protos.is_empty() && r.access != Access::None {
                continue; // the rule only names protocols this server does not serve
            }
            let access = match r.access {
                Access::Ro => "RO",
                Access::Rw => "RW",
                Access::None => "None",
            };
            let _ = writeln!(out, "    CLIENT {{");
            let _ = writeln!(out, "        # rule index {}", r.index);
            let _ = writeln!(out, "        Clients = {};", r.client);
            let _ = writeln!(out, "        Access_Type = {access};");
            if !protos.is_empty() {
                let _ = writeln!(out, "        Protocols = {};", protocols_list(&protos));
            }
            let _ = writeln!(
                out,
                "        Squash = {};",
                if r.superuser {
                    "No_Root_Squash"
                } else {
                    "Root_Squash"
                }
            );
            let _ = writeln!(out, "    }}");
        }
        let _ = writeln!(out, "}}");
    }
    out
}

/// An export of the table, with the table locked.
pub(super) struct OpenExport<'a> {
    ganesha: &'a Ganesha,
    inner: tokio::sync::MutexGuard<'a, Inner>,
    export: &'a str,
}

impl Ganesha {
    async fn open<'a>(&'a self, export: &'a str) -> Result<OpenExport<'a>, NfsError> {
        let mut open = OpenExport {
            ganesha: self,
            inner: self.inner.lock().await,
            export,
        };
        open.entry()?;
        Ok(open)
    }
}

impl OpenExport<'_> {
    fn entry(&mut self) -> Result<&mut ExportEntry, NfsError> {
        let export = self.export;
        self.inner
            .table
            .exports
            .get_mut(export)
            .ok_or_else(|| NfsError::UnknownExport(export.into()))
    }
}

/// The table records each export's rules; a change rewrites ganesha.conf and reloads.
impl RuleTarget for OpenExport<'_> {
    type Applied = ExportRule;

    async fn in_force(&mut self) -> Result<Vec<ExportRule>, NfsError> {
        Ok(self.entry()?.rules.clone())
    }

    fn same(desired: &ExportRule, applied: &ExportRule) -> bool {
        desired == applied
    }

    async fn unchanged(&mut self, _rules: &[ExportRule]) -> Result<(), NfsError> {
        if child_running(&mut self.inner) {
            Ok(())
        } else {
            self.ganesha.start_locked(&mut self.inner).await
        }
    }

    async fn change(
        &mut self,
        rules: &[ExportRule],
        _diff: &RuleDiff<'_, ExportRule>,
    ) -> Result<(), NfsError> {
        self.entry()?.rules = rules.to_vec();
        self.ganesha.apply(&mut self.inner).await
    }
}

impl ExportBackend for Ganesha {
    fn name(&self) -> &'static str {
        "ganesha"
    }

    fn ensure_export<'a>(
        &'a self,
        export: &'a str,
        fs_path: &'a Path,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        async move {
            validate_export_name(export)?;
            validate_fs_path(export, fs_path)?;
            let mut inner = self.inner.lock().await;
            if let Some(e) = inner.table.exports.get(export) {
                if e.fs_path == fs_path {
                    return if child_running(&mut inner) {
                        Ok(())
                    } else {
                        self.start_locked(&mut inner).await
                    };
                }
            }
            if let Some((other, _)) = inner
                .table
                .exports
                .iter()
                .find(|(n, e)| n.as_str() != export && e.fs_path == fs_path)
            {
                return Err(NfsError::InvalidExport(
                    export.into(),
                    format!("{} is already exported as {other}", fs_path.display()),
                ));
            }
            let id = match inner.table.exports.get(export) {
                Some(e) => e.id,
                None => {
                    let id = inner.table.next_id.max(1);
                    inner.table.next_id = id + 1;
                    id
                }
            };
            let rules = inner
                .table
                .exports
                .get(export)
                .map(|e| e.rules.clone())
                .unwrap_or_default();
            inner.table.exports.insert(
                export.to_string(),
                ExportEntry {
                    id,
                    fs_path: fs_path.to_path_buf(),
                    rules,
                },
            );
            self.apply(&mut inner).await
        }
        .boxed()
    }

    fn set_rules<'a>(
        &'a self,
        export: &'a str,
        rules: Vec<ExportRule>,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        super::rules::set_rules(rules, self.open(export)).boxed()
    }

    fn remove_export<'a>(&'a self, export: &'a str) -> BoxFuture<'a, Result<(), NfsError>> {
        async move {
            let mut inner = self.inner.lock().await;
            if inner.table.exports.remove(export).is_none() {
                return Ok(());
            }
            self.apply(&mut inner).await
        }
        .boxed()
    }

    fn run(&self, shutdown: crate::shutdown::Shutdown) -> BoxFuture<'_, ()> {
        self.supervise(shutdown).boxed()
    }

    fn health(&self) -> BoxFuture<'_, Result<Health, NfsError>> {
        async move {
            let mut inner = self.inner.lock().await;
            if child_running(&mut inner) {
                let pid = inner.child.as_ref().and_then(|c| c.id()).unwrap_or(0);
                Ok(Health {
                    backend: "ganesha",
                    detail: format!(
                        "nfs-ganesha pid {pid}, {} exports",
                        inner.table.exports.len()
                    ),
                })
            } else {
                let why = inner
                    .last_exit
                    .clone()
                    .unwrap_or_else(|| "not started".into());
                Err(NfsError::Down(format!(
                    "nfs-ganesha is not running: {why} (log {})",
                    self.log_path().display()
                )))
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests;
