//! The thin socket layer in front of the [`engine`](super::engine): one listening
//! socket (a tokio task) that parses requests, refuses what it must, and prepares each
//! read transfer (file, options, its own ephemeral socket, or in single-port mode the
//! listening socket with the peer's packets forwarded) before handing it to an engine
//! thread, which drives it to its end. DATA goes out with `sendmmsg(2)` whose iovecs
//! point straight into the cached file (no per-packet copy in user space), or into one
//! `pread` per batch for a file too large to cache.
//!
//! The listener task never blocks: preparing a transfer (opening, reading,
//! converting the file) runs on the blocking pool. Slots are bounded twice: at most
//! `max_transfers` in all, and at most `per_client_cap()` per client (IPv4 address or
//! IPv6 /64), so one source stalling its transfers cannot lock the others out.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::engine::{socket_mtu, Engines, Job, Link, RawAddr};
use super::files::{FileError, FileStore, Form};
use super::metrics::{ErrorKind, Metrics};
use super::packet::{self, ErrorCode, Mode, Packet, Request};
use super::transfer::{negotiate, Limits, Transfer};
use super::TftpConfig;
use crate::shutdown::Shutdown;

/// Largest datagram taken off the listening socket (any UDP payload fits; requests,
/// and in single-port mode the clients' ACKs and ERRORs, are far smaller).
const RECV_BUF: usize = 65536;
/// Datagrams per `recvmmsg` on the listening socket.
const RECV_BATCH: usize = 32;
/// Batches drained per wake-up before the listener yields to the runtime.
const DRAIN_BATCHES: usize = 16;

struct Shared {
    settings: TftpConfig,
    files: FileStore,
    metrics: Arc<Metrics>,
    permits: Arc<Semaphore>,
    /// Transfers one client may hold.
    per_client: usize,
    /// Transfers in progress. (Shared with the guards the engines hold, not through
    /// `Shared`: an engine thread must never own the last reference to the engines.)
    active: Arc<Mutex<Active>>,
    local_ip: IpAddr,
    engines: Engines,
}

/// Transfers in progress.
#[derive(Default)]
struct Active {
    /// Peers with a transfer, with the engine that runs it (in single-port mode the
    /// listener forwards their packets there).
    peers: HashMap<SocketAddr, usize>,
    /// Transfers per client (no entry for none).
    clients: HashMap<IpAddr, usize>,
}

impl Shared {
    fn active(&self) -> std::sync::MutexGuard<'_, Active> {
        lock(&self.active)
    }
}

/// A bound TFTP server.
pub struct Server {
    sock: Arc<UdpSocket>,
    shared: Arc<Shared>,
    preparers: Preparers,
}

impl Server {
    /// Bind `settings.listen` and open `settings.root`.
    pub async fn bind(settings: &TftpConfig, metrics: Arc<Metrics>) -> anyhow::Result<Server> {
        settings.validate()?;
        let settings = settings.clone();
        let listen = settings.listen;
        let files = FileStore::new(
            &settings.root,
            settings.small_file_max_bytes,
            settings.cache_max_bytes,
        )?
        .with_netascii_max(settings.netascii_max_bytes);
        let sock = UdpSocket::bind(listen)
            .await
            .with_context(|| format!("binding tftp socket {listen}"))?;
        if settings.listen_rcvbuf_bytes > 0 {
            if let Err(e) = crate::net::raise_rcvbuf(&sock, settings.listen_rcvbuf_bytes) {
                tracing::warn!(error = %e, "tftp: could not raise the listening socket's receive buffer");
            }
        }
        raise_nofile(settings.max_transfers as u64 + 256);
        let workers = match settings.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let engines =
            Engines::start(workers, metrics.clone()).context("starting tftp engine threads")?;
        let shared = Shared {
            engines,
            permits: Arc::new(Semaphore::new(settings.max_transfers)),
            per_client: settings.per_client_cap(),
            settings,
            files,
            metrics,
            active: Arc::default(),
            local_ip: listen.ip(),
        };
        let shared = Arc::new(shared);
        let preparers =
            Preparers::start(workers, &shared).context("starting tftp preparing threads")?;
        Ok(Server {
            sock: Arc::new(sock),
            shared,
            preparers,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Serve until shutdown. Transfers in flight get an ERROR and end on shutdown.
    ///
    /// The listener only takes datagrams off the socket (`recvmmsg`, a batch per call),
    /// parses them and queues each read request for the preparing threads: a power cut
    /// brings a rack back within milliseconds, and every request the kernel's buffer
    /// cannot hold costs its machine a retransmission timeout (a second or more).
    pub async fn run(self, mut shutdown: Shutdown) -> anyhow::Result<()> {
        let mut batch = crate::net::RecvBatch::new(RECV_BATCH, RECV_BUF);
        loop {
            tokio::select! {
                _ = shutdown.recv() => break,
                r = self.sock.readable() => if let Err(e) = r {
                    tracing::debug!(error = %e, "tftp readiness error");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                },
            }
            // Drain what is queued, a bounded number of batches per turn so the runtime's
            // other tasks are not starved by a flood (the listener yields only then: in
            // single-port mode every ACK comes through here).
            let mut drained = false;
            for _ in 0..DRAIN_BATCHES {
                match self
                    .sock
                    .try_io(tokio::io::Interest::READABLE, || batch.recv(&*self.sock))
                {
                    Ok(_) => {
                        for d in batch.datagrams() {
                            match d {
                                Some((pkt, peer)) => self.handle(pkt, peer),
                                None => self.shared.metrics.error(ErrorKind::Malformed),
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        drained = true;
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "tftp recv error");
                        self.shared.metrics.error(ErrorKind::Io);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        drained = true;
                        break;
                    }
                }
            }
            if !drained {
                tokio::task::yield_now().await;
            }
        }
        // The preparing threads end once their queue is closed and drained (what they
        // hand over after the stop gets the shutdown ERROR from the engine); then every
        // transfer in flight gets an ERROR and the engine threads end.
        let shared = self.shared.clone();
        let preparers = self.preparers;
        let _ = tokio::task::spawn_blocking(move || {
            preparers.stop();
            shared.engines.stop()
        })
        .await;
        Ok(())
    }

    fn reply_error(&self, peer: SocketAddr, code: ErrorCode, msg: &str) {
        let _ = self.sock.try_send_to(&packet::error(code, msg), peer);
    }

    fn handle(&self, pkt: &[u8], peer: SocketAddr) {
        let m = &self.shared.metrics;
        if self.shared.settings.single_port {
            let engine = self.shared.active().peers.get(&peer).copied();
            if let Some(e) = engine {
                self.shared
                    .engines
                    .deliver(e, peer, Bytes::copy_from_slice(pkt));
                return;
            }
        }
        match packet::parse(pkt) {
            Err(e) => match e.reply_code() {
                Some(code) => {
                    m.error(ErrorKind::IllegalOperation);
                    self.reply_error(peer, code, &e.to_string());
                }
                None => m.error(ErrorKind::Malformed),
            },
            Ok(Packet::Wrq(_)) => {
                m.error(ErrorKind::WriteRefused);
                self.reply_error(
                    peer,
                    ErrorCode::AccessViolation,
                    "write requests are not allowed",
                );
            }
            Ok(Packet::Rrq(req)) => self.start(req, peer),
            Ok(_) => m.error(ErrorKind::Unexpected),
        }
    }

    fn start(&self, req: Request, peer: SocketAddr) {
        let m = &self.shared.metrics;
        let mut active = self.shared.active();
        if active.peers.contains_key(&peer) {
            // A retransmitted RRQ: the running transfer answers it by its own retransmission.
            return;
        }
        let Ok(permit) = self.shared.permits.clone().try_acquire_owned() else {
            // Silent drop: the client retransmits its RRQ and gets served when a slot frees.
            m.error(ErrorKind::Busy);
            return;
        };
        // Counted by IPv4 address or IPv6 /64, as the HTTP listeners count sources.
        let client = crate::listen::source_key(peer.ip());
        let held = active.clients.get(&client).copied().unwrap_or(0);
        if held >= self.shared.per_client {
            // Silent drop too (the permit goes back): a client that behaves retransmits
            // its RRQ and gets served when one of its own transfers ends.
            m.error(ErrorKind::ClientBusy);
            return;
        }
        let assigned = self.shared.engines.pick();
        let engine = assigned.idx;
        active.peers.insert(peer, engine);
        active.clients.insert(client, held + 1);
        drop(active);
        let link = if self.shared.settings.single_port {
            LinkKind::Shared(self.sock.clone())
        } else {
            LinkKind::Own
        };
        let guard = ActiveGuard {
            active: self.shared.active.clone(),
            peer,
            client,
            _permit: permit,
            _assigned: assigned,
        };
        // Opening and reading the file blocks (and a conversion takes CPU): never on the
        // runtime, whose other tasks (the API's /healthz among them) it would stall, nor
        // on the listener, which must keep draining the socket.
        self.preparers.queue(Prepare {
            link,
            peer,
            req,
            guard: Box::new(guard),
            engine,
        });
    }
}

/// A read request waiting for a preparing thread.
struct Prepare {
    link: LinkKind,
    peer: SocketAddr,
    req: Request,
    guard: Box<dyn std::marker::Send>,
    engine: usize,
}

/// The threads that prepare transfers (open the file, negotiate, open the transfer's
/// socket) and hand them to their engines. A fixed pool with a queue rather than a
/// blocking-pool task per request: a burst of 1,000 requests made tokio start hundreds
/// of threads on two cores, which took the CPU the listener needed to drain the socket.
/// The queue needs no bound of its own: every entry holds one of the `max_transfers`
/// permits, so it never holds more than that.
struct Preparers {
    tx: Option<std::sync::mpsc::Sender<Prepare>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Preparers {
    fn start(n: usize, shared: &Arc<Shared>) -> io::Result<Preparers> {
        let (tx, rx) = std::sync::mpsc::channel::<Prepare>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let rx = rx.clone();
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tftp-prep-{i}"))
                    .spawn(move || loop {
                        let next = lock(&rx).recv();
                        let Ok(p) = next else { return };
                        let Prepare {
                            link,
                            peer,
                            req,
                            guard,
                            engine,
                        } = p;
                        if let Some(job) = prepare(&shared, link, peer, req, guard) {
                            if let Err(job) = shared.engines.submit(engine, job) {
                                let _ = job.link.send_now(&packet::error(
                                    ErrorCode::NotDefined,
                                    "server shutting down",
                                ));
                            }
                        }
                    })?,
            );
        }
        Ok(Preparers {
            tx: Some(tx),
            threads,
        })
    }

    fn queue(&self, p: Prepare) {
        if let Some(tx) = &self.tx {
            // Fails only after `stop`; the request (and its permit) is dropped and the
            // client retransmits to whoever serves next.
            let _ = tx.send(p);
        }
    }

    /// Close the queue and wait for the threads to finish what it held.
    fn stop(mut self) {
        self.tx = None;
        for t in std::mem::take(&mut self.threads) {
            let _ = t.join();
        }
    }
}

/// Default receive buffer of the listening socket (`[tftp] listen_rcvbuf_bytes`): a power cut brings a rack's machines back
/// within milliseconds, and their RRQs (about 1 KiB of buffer each) arrive faster than
/// they can be prepared. The kernel default (about 200 KiB) dropped a third of a burst
/// of 1,000, and each dropped RRQ cost its machine a 1 s timeout; 4 MiB holds 4,000.
pub(super) const LISTEN_RCVBUF: usize = 4 << 20;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Held by a transfer until it ends: its `max_transfers` permit, its entry among
/// the active peers, its count against its client and its place in its engine's load.
struct ActiveGuard {
    active: Arc<Mutex<Active>>,
    peer: SocketAddr,
    client: IpAddr,
    _permit: OwnedSemaphorePermit,
    _assigned: super::engine::Assigned,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut a = lock(&self.active);
        a.peers.remove(&self.peer);
        if let Some(n) = a.clients.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                a.clients.remove(&self.client);
            }
        }
    }
}

enum LinkKind {
    Own,
    Shared(Arc<UdpSocket>),
}

fn open_link(kind: LinkKind, local_ip: IpAddr, peer: SocketAddr) -> io::Result<Link> {
    match kind {
        LinkKind::Own => {
            let bind_ip = match (local_ip, peer.ip()) {
                (ip, p) if ip.is_unspecified() || ip.is_ipv4() != p.is_ipv4() => {
                    if p.is_ipv4() {
                        IpAddr::from([0u8; 4])
                    } else {
                        IpAddr::from([0u16; 8])
                    }
                }
                (ip, _) => ip,
            };
            let s = std::net::UdpSocket::bind(SocketAddr::new(bind_ip, 0))?;
            s.connect(peer)?;
            Ok(Link::Own(s))
        }
        LinkKind::Shared(sock) => Ok(Link::Shared {
            sock,
            raw: RawAddr::new(&peer),
        }),
    }
}

/// Path MTU towards the peer as the kernel knows it.
fn path_mtu(link: &Link, peer: SocketAddr) -> Option<u32> {
    match link {
        Link::Own(s) => socket_mtu(s.as_raw_fd(), peer.is_ipv4()),
        Link::Shared { .. } => {
            let any: SocketAddr = if peer.is_ipv4() {
                "0.0.0.0:0".parse().ok()?
            } else {
                "[::]:0".parse().ok()?
            };
            let s = std::net::UdpSocket::bind(any).ok()?;
            s.connect(peer).ok()?;
            socket_mtu(s.as_raw_fd(), peer.is_ipv4())
        }
    }
}

/// Raise the soft open-file limit towards `want` (one socket per transfer).
fn raise_nofile(want: u64) {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn file_error_kind(e: &FileError) -> (ErrorKind, ErrorCode) {
    match e {
        FileError::NotFound => (ErrorKind::NotFound, ErrorCode::FileNotFound),
        FileError::Refused(_) => (ErrorKind::AccessViolation, ErrorCode::AccessViolation),
        FileError::Io(_) | FileError::TooLargeForNetascii => (ErrorKind::Io, ErrorCode::NotDefined),
    }
}

/// How long a transfer runs before `min_rate_bytes_per_sec` applies.
const RATE_GRACE: Duration = Duration::from_secs(10);

/// Open the file, negotiate the options and open the transfer's socket. Refusals are
/// answered here (from the transfer's socket, as RFC 1350 has it) and give `None`.
/// Blocks (file I/O): runs on the blocking pool.
fn prepare(
    shared: &Shared,
    kind: LinkKind,
    peer: SocketAddr,
    req: Request,
    guard: Box<dyn std::marker::Send>,
) -> Option<Box<Job>> {
    let m = &shared.metrics;
    let link = match open_link(kind, shared.local_ip, peer) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "tftp: cannot open transfer socket");
            m.error(ErrorKind::Io);
            return None;
        }
    };
    let fail = |kind: ErrorKind, code: ErrorCode, msg: String| {
        m.error(kind);
        tracing::debug!(%peer, code = code as u16, %msg, "tftp request refused");
        let _ = link.send_now(&packet::error(code, &msg));
        None
    };
    let form = match req.mode {
        Mode::Octet => Form::Octet,
        Mode::Netascii => Form::Netascii,
    };
    let data = match shared.files.open_as(&req.filename, form) {
        Ok(d) => d,
        Err(e) => {
            let (kind, code) = file_error_kind(&e);
            return fail(kind, code, e.to_string());
        }
    };
    let s = &shared.settings;
    let overhead = if peer.is_ipv4() { 32 } else { 52 };
    let mtu_cap = path_mtu(&link, peer)
        .map(|mtu| mtu.saturating_sub(overhead).clamp(8, 65464) as u16)
        .unwrap_or(65464);
    let limits = Limits {
        max_blksize: s.max_blksize.min(mtu_cap),
        max_windowsize: s.max_windowsize,
        initial_rto: Duration::from_millis(s.retransmit_initial_ms),
        min_rto: Duration::from_millis(s.retransmit_min_ms),
        max_rto: Duration::from_millis(s.retransmit_max_ms),
        max_retries: s.max_retries,
        max_timeout: Duration::from_secs(s.max_timeout_secs),
        min_rate: s.min_rate_bytes_per_sec,
        rate_grace: RATE_GRACE,
    };
    let neg = match negotiate(&req.options, data.len() as u64, &limits) {
        Ok(n) => n,
        Err((code, msg)) => return fail(ErrorKind::BadOption, code, msg),
    };
    tracing::debug!(%peer, file = %req.filename, mode = %req.mode, blksize = neg.blksize, windowsize = neg.windowsize, "tftp transfer");
    Some(Box::new(Job {
        transfer: Transfer::new(data.len() as u64, &neg, &limits),
        oack: packet::oack(&neg.oack),
        link,
        peer,
        data,
        guard,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_listening_socket_holds_a_burst_of_requests() {
        let root = tempfile::tempdir().unwrap();
        let cfg = TftpConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            root: root.path().to_path_buf(),
            workers: 1,
            ..Default::default()
        };
        let server = Server::bind(&cfg, Arc::new(Metrics::default()))
            .await
            .unwrap();
        let got =
            nix::sys::socket::getsockopt(&*server.sock, nix::sys::socket::sockopt::RcvBuf).unwrap();
        // the kernel reports twice what was set (its bookkeeping share); tests run as root
        assert!(
            got >= LISTEN_RCVBUF,
            "receive buffer {got} < {LISTEN_RCVBUF}"
        );
    }
}
