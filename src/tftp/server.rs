//! The thin tokio socket layer: one listening socket that parses requests, and one
//! task per transfer (no threads) driving a [`Transfer`] with its own ephemeral
//! socket, or, in single-port mode, sharing the listening socket with packets routed
//! to it by peer address. A window of DATA goes out in one `sendmmsg(2)` whose iovecs
//! point straight into the cached/mapped file (no per-packet copy in user space).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::files::{to_netascii, FileData, FileError, FileStore};
use super::metrics::{ErrorKind, Metrics};
use super::packet::{self, ErrorCode, Mode, Packet, Request};
use super::transfer::{negotiate, Event, Limits, Outcome, Send, Transfer};
use super::TftpConfig;
use crate::shutdown::Shutdown;

/// Largest DATA packet (65464 + 4) plus slack; requests are far smaller.
const RECV_BUF: usize = 65536;
/// Messages per sendmmsg call.
const BATCH: usize = 64;

struct Shared {
    settings: TftpConfig,
    files: FileStore,
    metrics: Arc<Metrics>,
    permits: Arc<Semaphore>,
    /// Peers with a transfer in progress; in single-port mode with the channel that
    /// feeds their packets to the transfer task.
    active: Mutex<HashMap<SocketAddr, Option<mpsc::Sender<Bytes>>>>,
    local_ip: IpAddr,
}

impl Shared {
    fn active(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Option<mpsc::Sender<Bytes>>>> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A bound TFTP server.
pub struct Server {
    sock: Arc<UdpSocket>,
    shared: Arc<Shared>,
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
        )?;
        let sock = UdpSocket::bind(listen)
            .await
            .with_context(|| format!("binding tftp socket {listen}"))?;
        raise_nofile(settings.max_transfers as u64 + 256);
        let shared = Shared {
            permits: Arc::new(Semaphore::new(settings.max_transfers)),
            settings,
            files,
            metrics,
            active: Mutex::new(HashMap::new()),
            local_ip: listen.ip(),
        };
        Ok(Server {
            sock: Arc::new(sock),
            shared: Arc::new(shared),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Serve until shutdown. Transfers in flight get an ERROR and end on shutdown.
    pub async fn run(self, mut shutdown: Shutdown) -> anyhow::Result<()> {
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let (n, peer) = tokio::select! {
                _ = shutdown.recv() => break,
                r = self.sock.recv_from(&mut buf) => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!(error = %e, "tftp recv error");
                        self.shared.metrics.error(ErrorKind::Io);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                },
            };
            self.handle(&buf[..n], peer, &shutdown);
        }
        Ok(())
    }

    fn reply_error(&self, peer: SocketAddr, code: ErrorCode, msg: &str) {
        let _ = self.sock.try_send_to(&packet::error(code, msg), peer);
    }

    fn handle(&self, pkt: &[u8], peer: SocketAddr, shutdown: &Shutdown) {
        let m = &self.shared.metrics;
        if self.shared.settings.single_port {
            if let Some(Some(tx)) = self.shared.active().get(&peer) {
                // Full channel: the transfer is behind; dropping is what a full socket buffer does.
                let _ = tx.try_send(Bytes::copy_from_slice(pkt));
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
            Ok(Packet::Rrq(req)) => self.start(req, peer, shutdown),
            Ok(_) => m.error(ErrorKind::Unexpected),
        }
    }

    fn start(&self, req: Request, peer: SocketAddr, shutdown: &Shutdown) {
        let m = &self.shared.metrics;
        let mut active = self.shared.active();
        if active.contains_key(&peer) {
            // A retransmitted RRQ: the running transfer answers it by its own retransmission.
            return;
        }
        let Ok(permit) = self.shared.permits.clone().try_acquire_owned() else {
            // Silent drop: the client retransmits its RRQ and gets served when a slot frees.
            m.error(ErrorKind::Busy);
            return;
        };
        let link = if self.shared.settings.single_port {
            let (tx, rx) = mpsc::channel(64);
            active.insert(peer, Some(tx));
            LinkKind::Shared(self.sock.clone(), rx)
        } else {
            active.insert(peer, None);
            LinkKind::Own
        };
        drop(active);
        let shared = self.shared.clone();
        let sd = shutdown.child();
        tokio::spawn(async move {
            let _guard = ActiveGuard {
                shared: shared.clone(),
                peer,
                _permit: permit,
            };
            session(shared, link, peer, req, sd).await;
        });
    }
}

struct ActiveGuard {
    shared: Arc<Shared>,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.shared.active().remove(&self.peer);
    }
}

enum LinkKind {
    Own,
    Shared(Arc<UdpSocket>, mpsc::Receiver<Bytes>),
}

/// The transfer's path to its peer.
enum Link {
    Own(UdpSocket),
    Shared {
        sock: Arc<UdpSocket>,
        peer: SocketAddr,
        raw: RawAddr,
        rx: mpsc::Receiver<Bytes>,
    },
}

impl Link {
    async fn open(kind: LinkKind, local_ip: IpAddr, peer: SocketAddr) -> io::Result<Link> {
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
                let s = UdpSocket::bind(SocketAddr::new(bind_ip, 0)).await?;
                s.connect(peer).await?;
                Ok(Link::Own(s))
            }
            LinkKind::Shared(sock, rx) => Ok(Link::Shared {
                sock,
                peer,
                raw: RawAddr::new(&peer),
                rx,
            }),
        }
    }

    /// Path MTU towards the peer as the kernel knows it.
    fn path_mtu(&self, peer: SocketAddr) -> Option<u32> {
        match self {
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

    async fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Own(s) => s.recv(buf).await,
            Link::Shared { rx, .. } => match rx.recv().await {
                Some(b) => {
                    let n = b.len().min(buf.len());
                    buf[..n].copy_from_slice(&b[..n]);
                    Ok(n)
                }
                None => Err(io::Error::new(io::ErrorKind::BrokenPipe, "listener closed")),
            },
        }
    }

    async fn send(&self, pkt: &[u8]) -> io::Result<()> {
        let r = match self {
            Link::Own(s) => s.send(pkt).await,
            Link::Shared { sock, peer, .. } => sock.send_to(pkt, *peer).await,
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if transient(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Send DATA for blocks `first..=last` in batches of sendmmsg. Returns payload bytes.
    async fn send_blocks(
        &self,
        data: &[u8],
        t: &Transfer,
        first: u64,
        last: u64,
    ) -> io::Result<u64> {
        let (sock, raw) = match self {
            Link::Own(s) => (s, None),
            Link::Shared { sock, raw, .. } => (&**sock, Some(raw)),
        };
        let fd = sock.as_raw_fd();
        let mut bytes = 0u64;
        let mut b = first;
        let mut hdrs = [[0u8; 4]; BATCH];
        let mut slices: [&[u8]; BATCH] = [&[]; BATCH];
        while b <= last {
            let n = ((last - b + 1) as usize).min(BATCH);
            for i in 0..n {
                let blk = b + i as u64;
                hdrs[i] = packet::data_header(blk as u16);
                let r = t.block_range(blk);
                slices[i] = &data[r];
                bytes += slices[i].len() as u64;
            }
            let mut off = 0;
            while off < n {
                match sock
                    .async_io(Interest::WRITABLE, || {
                        sendmmsg(fd, raw, &hdrs[off..n], &slices[off..n])
                    })
                    .await
                {
                    Ok(sent) => off += sent.max(1),
                    // A transient local error (ENOBUFS, EPERM from a firewall, no route)
                    // loses this datagram like the network would; retransmission covers it.
                    Err(e) if transient(&e) => off += 1,
                    Err(e) => return Err(e),
                }
            }
            b += n as u64;
        }
        Ok(bytes)
    }
}

/// Send errors that mean "this datagram is lost" rather than "the peer is gone".
fn transient(e: &io::Error) -> bool {
    e.kind() != io::ErrorKind::ConnectionRefused
        && matches!(
            e.raw_os_error(),
            Some(
                libc::ENOBUFS
                    | libc::ENOMEM
                    | libc::EPERM
                    | libc::EHOSTUNREACH
                    | libc::ENETUNREACH
                    | libc::EMSGSIZE
            )
        )
}

/// A socket address in the kernel's layout, for sendmmsg on an unconnected socket.
struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

// The storage is plain bytes; it is only read by the kernel during sendmmsg.
unsafe impl std::marker::Send for RawAddr {}
unsafe impl Sync for RawAddr {}

impl RawAddr {
    fn new(a: &SocketAddr) -> RawAddr {
        // SAFETY: sockaddr_storage is plain old data; zero is a valid bit pattern.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        RawAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }
}

/// One sendmmsg(2) of header+payload pairs. Returns how many messages went out.
fn sendmmsg(
    fd: i32,
    dest: Option<&RawAddr>,
    hdrs: &[[u8; 4]],
    payloads: &[&[u8]],
) -> io::Result<usize> {
    let n = hdrs.len().min(payloads.len()).min(BATCH);
    let mut iov: [[libc::iovec; 2]; BATCH] = [[libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2]; BATCH];
    // SAFETY: mmsghdr is plain old data; zero is a valid bit pattern.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i][0] = libc::iovec {
            iov_base: hdrs[i].as_ptr() as *mut _,
            iov_len: 4,
        };
        iov[i][1] = libc::iovec {
            iov_base: payloads[i].as_ptr() as *mut _,
            iov_len: payloads[i].len(),
        };
        let h = &mut msgs[i].msg_hdr;
        h.msg_iov = iov[i].as_mut_ptr();
        h.msg_iovlen = 2;
        if let Some(d) = dest {
            h.msg_name = &d.storage as *const _ as *mut _;
            h.msg_namelen = d.len;
        }
    }
    // SAFETY: every pointer refers to memory borrowed for the duration of the call; the
    // kernel only reads iovecs and names.
    let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as u32, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn socket_mtu(fd: i32, v4: bool) -> Option<u32> {
    let (level, name) = if v4 {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given.
    let r = unsafe { libc::getsockopt(fd, level, name, &mut v as *mut _ as *mut _, &mut len) };
    (r == 0 && v > 0).then_some(v as u32)
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
        FileError::Io(_) => (ErrorKind::Io, ErrorCode::NotDefined),
    }
}

async fn session(
    shared: Arc<Shared>,
    kind: LinkKind,
    peer: SocketAddr,
    req: Request,
    mut shutdown: Shutdown,
) {
    let m = shared.metrics.clone();
    let link = match Link::open(kind, shared.local_ip, peer).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "tftp: cannot open transfer socket");
            m.error(ErrorKind::Io);
            return;
        }
    };
    let fail = |kind: ErrorKind, code: ErrorCode, msg: String| {
        let link = &link;
        let m = &m;
        async move {
            m.error(kind);
            tracing::debug!(%peer, code = code as u16, %msg, "tftp request refused");
            let _ = link.send(&packet::error(code, &msg)).await;
        }
    };
    let data = match shared.files.open(&req.filename) {
        Ok(d) => d,
        Err(e) => {
            let (kind, code) = file_error_kind(&e);
            return fail(kind, code, e.to_string()).await;
        }
    };
    let data = match req.mode {
        Mode::Octet => data,
        Mode::Netascii => {
            if data.len() as u64 > shared.settings.netascii_max_bytes {
                return fail(
                    ErrorKind::Io,
                    ErrorCode::NotDefined,
                    "file too large for netascii mode, use octet".into(),
                )
                .await;
            }
            FileData::Mem(Bytes::from(to_netascii(data.as_slice())))
        }
    };
    let s = &shared.settings;
    let overhead = if peer.is_ipv4() { 32 } else { 52 };
    let mtu_cap = link
        .path_mtu(peer)
        .map(|mtu| mtu.saturating_sub(overhead).clamp(8, 65464) as u16)
        .unwrap_or(65464);
    let limits = Limits {
        max_blksize: s.max_blksize.min(mtu_cap),
        max_windowsize: s.max_windowsize,
        initial_rto: Duration::from_millis(s.retransmit_initial_ms),
        min_rto: Duration::from_millis(s.retransmit_min_ms),
        max_rto: Duration::from_millis(s.retransmit_max_ms),
        max_retries: s.max_retries,
    };
    let neg = match negotiate(&req.options, data.len() as u64, &limits) {
        Ok(n) => n,
        Err((code, msg)) => return fail(ErrorKind::BadOption, code, msg).await,
    };
    let oack = packet::oack(&neg.oack);
    let mut t = Transfer::new(data.len() as u64, &neg, &limits);
    tracing::debug!(%peer, file = %req.filename, mode = %req.mode, blksize = neg.blksize, windowsize = neg.windowsize, "tftp transfer");

    m.transfers_started.inc();
    m.transfers_active.inc();
    let started = Instant::now();
    let mut link = link;
    let result = drive(&mut link, &mut t, &oack, data.as_slice(), &m, &mut shutdown).await;
    m.transfers_active.dec();
    match result {
        Ok(Outcome::Complete) => {
            m.transfers_completed.inc();
            m.duration_seconds.observe(started.elapsed().as_secs_f64());
        }
        Ok(Outcome::TimedOut) => {
            m.transfers_failed.inc();
            m.error(ErrorKind::Timeout);
        }
        Ok(Outcome::PeerError { code, message }) => {
            tracing::debug!(%peer, code, %message, "tftp client aborted");
            m.transfers_failed.inc();
            m.error(ErrorKind::PeerError);
        }
        Err(e) => {
            m.transfers_failed.inc();
            // The client went away (ICMP port unreachable) or a local socket error.
            if e.kind() == io::ErrorKind::ConnectionRefused {
                m.error(ErrorKind::PeerError);
            } else {
                tracing::debug!(%peer, error = %e, "tftp transfer socket error");
                m.error(ErrorKind::Io);
            }
        }
    }
}

/// Drive one transfer to its end over `link`.
async fn drive(
    link: &mut Link,
    t: &mut Transfer,
    oack: &[u8],
    data: &[u8],
    m: &Metrics,
    shutdown: &mut Shutdown,
) -> io::Result<Outcome> {
    let mut buf = vec![0u8; 2048];
    let mut step = t.start(Instant::now());
    let mut deadline = tokio::time::Instant::now();
    // Both futures live across packets: a fresh shutdown receiver per packet would lock
    // the broadcast channel twice per packet (register, unregister), and a fresh timer
    // would insert into and remove from the timer wheel, for every transfer at once in a
    // boot storm. The timer is moved lazily: it only ever fires early (then it is re-armed
    // at the real deadline), and is pulled in only when the deadline moves earlier.
    let stop = shutdown.recv();
    tokio::pin!(stop);
    let timer = tokio::time::sleep_until(deadline);
    tokio::pin!(timer);
    loop {
        if let Some(send) = step.send.take() {
            match send {
                Send::Oack => link.send(oack).await?,
                Send::Blocks { first, last } => {
                    let n = link.send_blocks(data, t, first, last).await?;
                    m.bytes_sent.inc_by(n);
                }
            }
            if step.retransmitted > 0 {
                m.retransmits.inc_by(step.retransmitted);
            }
            deadline = tokio::time::Instant::now() + t.rto();
        }
        if let Some(o) = step.outcome.take() {
            return Ok(o);
        }
        if timer.deadline() > deadline {
            timer.as_mut().reset(deadline);
        }
        enum Got {
            Shutdown,
            Timeout,
            Packet(io::Result<usize>),
        }
        let got = tokio::select! {
            _ = &mut stop => Got::Shutdown,
            r = link.recv(&mut buf) => Got::Packet(r),
            _ = &mut timer => {
                if tokio::time::Instant::now() < deadline {
                    timer.as_mut().reset(deadline);
                    continue;
                }
                Got::Timeout
            }
        };
        let ev = match got {
            Got::Shutdown => {
                let _ = link
                    .send(&packet::error(
                        ErrorCode::NotDefined,
                        "server shutting down",
                    ))
                    .await;
                return Ok(Outcome::PeerError {
                    code: 0,
                    message: "server shutting down".into(),
                });
            }
            Got::Timeout => Event::Timeout,
            Got::Packet(r) => match packet::parse(&buf[..r?]) {
                Ok(Packet::Ack { block }) => Event::Ack(block),
                Ok(Packet::Error { code, message }) => Event::PeerError { code, message },
                Ok(_) => {
                    m.error(ErrorKind::Unexpected);
                    continue;
                }
                Err(_) => {
                    m.error(ErrorKind::Malformed);
                    continue;
                }
            },
        };
        step = t.on_event(ev, Instant::now());
    }
}
