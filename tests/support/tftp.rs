//! TFTP test helpers: an in-process server on its own runtime thread (optionally
//! inside a network namespace), deterministic test files, bounded client runs and raw
//! request packets.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bootplane::shutdown::Coordinator;
use bootplane::tftp::{Metrics, Server, TftpConfig};

use super::data::pattern;
use super::netns::enter_thread;
use super::process::run_for;

/// A running server; dropping it shuts it down.
pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics: Arc<Metrics>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start a server on `listen` (port 0 for any) serving `root`, optionally inside the
/// network namespace `netns` (the runtime thread joins it before creating sockets).
pub fn start_server(
    listen: &str,
    root: &Path,
    mut settings: TftpConfig,
    netns: Option<&str>,
) -> TestServer {
    settings.listen = listen.parse().unwrap();
    settings.root = root.to_path_buf();
    let netns = netns.map(str::to_string);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        if let Some(ns) = netns {
            enter_thread(&ns);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let metrics = Arc::new(Metrics::default());
            let server = Server::bind(&settings, metrics.clone())
                .await
                .expect("binding test server");
            ready_tx
                .send((server.local_addr().unwrap(), metrics))
                .unwrap();
            let coord = Coordinator::new();
            let h = coord.handle();
            let run = tokio::spawn(server.run(h));
            let _ = stop_rx.await;
            coord.drain(Duration::from_secs(5)).await;
            let _ = run.await;
        });
    });
    let (addr, metrics) = ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server did not start");
    TestServer {
        addr,
        metrics,
        stop: Some(stop_tx),
        thread: Some(thread),
    }
}

/// Write `files` (name, len) with pattern content into `dir`.
pub fn write_files(dir: &Path, files: &[(&str, usize)]) {
    for (i, (name, len)) in files.iter().enumerate() {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, pattern(*len, i as u64 + 1)).unwrap();
    }
}

/// Output of a finished client.
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Run a client command with a hard time limit (killed and reported on expiry).
pub fn run_client(cmd: &mut Command, limit: Duration) -> Run {
    let start = Instant::now();
    let out = run_for(cmd, limit);
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    }
}

pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn out_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(name.replace('/', "_"))
}

/// A request packet (`op` 1 = RRQ, 2 = WRQ) for `name` in `mode` with `opts`.
pub fn req(op: u8, name: &str, mode: &str, opts: &[(&str, &str)]) -> Vec<u8> {
    let mut v = vec![0, op];
    for p in [name, mode]
        .iter()
        .copied()
        .chain(opts.iter().flat_map(|(a, b)| [*a, *b]))
    {
        v.extend_from_slice(p.as_bytes());
        v.push(0);
    }
    v
}

/// The next datagram on `s` and its sender, or None when the read timeout passes.
pub fn recv(s: &UdpSocket) -> Option<(Vec<u8>, SocketAddr)> {
    let mut b = vec![0u8; 70000];
    s.recv_from(&mut b).ok().map(|(n, a)| (b[..n].to_vec(), a))
}
