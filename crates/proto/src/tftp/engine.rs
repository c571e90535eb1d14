//! The transfer engine: a few threads (`tftp.workers`, one per core by default), each
//! running a level-triggered `epoll(7)` loop over the sockets of the transfers it
//! owns, with a lazy heap of retransmission deadlines. The listener ([`super::server`])
//! prepares a transfer (file, options, socket) and hands it over as a [`Job`]; the
//! engine drives it to its end with the pure [`Transfer`] machine and does the
//! accounting.
//!
//! Why not one tokio task per transfer (the first design, kept until the lockstep
//! storm was measured): firmware fetches its boot file in lockstep, one ACK per DATA
//! block, so a boot storm is hundreds of thousands of tiny wake-ups. A tokio task pays
//! for each one a waker and a run-queue hand-off, a `select!` over its socket, its
//! timer and the shutdown channel, and, because tokio's readiness is edge-triggered,
//! a second `recv` that returns EAGAIN. 1,000 lockstep clients of a 1 MiB file cost
//! that design 6.6 s of server CPU against dnsmasq's 4.7 s (`tftp_bench -- --storm-only
//! --storm-window 1`). Here one `epoll_wait` returns many ready transfers, each costs
//! one `recv` (level-triggered: a socket still holding a datagram is reported again)
//! and one `sendmmsg`, and nothing crosses threads.
//!
//! Timers: each transfer has a deadline (`now + rto` after every send) and at most one
//! live entry in the heap. Deadlines only move later while a transfer makes progress,
//! so the entry is re-pushed when it fires early instead of on every packet.
//!
//! Invariant: the engine never blocks. Every socket call passes `MSG_DONTWAIT`; a DATA
//! window that does not fit the socket's send buffer resumes on `EPOLLOUT`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::files::FileData;
use super::metrics::{ErrorKind, Metrics};
use super::packet::{self, ErrorCode, Packet};
use super::transfer::{Event, Outcome, Send, Step, Transfer};

/// Messages per sendmmsg call.
const BATCH: usize = 64;
/// Ready sockets taken per epoll_wait.
const EVENTS: usize = 256;
/// epoll token of the engine's wake-up eventfd (transfers use slot index + 1).
const WAKE: u64 = 0;

/// The transfer's path to its peer.
pub(super) enum Link {
    /// Its own socket on an ephemeral port, connected to the peer.
    Own(std::net::UdpSocket),
    /// The listening socket (single-port mode); the listener forwards the peer's
    /// packets with [`Engines::deliver`].
    Shared {
        sock: Arc<tokio::net::UdpSocket>,
        raw: RawAddr,
    },
}

impl Link {
    fn fd(&self) -> RawFd {
        match self {
            Link::Own(s) => s.as_raw_fd(),
            Link::Shared { sock, .. } => sock.as_raw_fd(),
        }
    }

    fn dest(&self) -> Option<&RawAddr> {
        match self {
            Link::Own(_) => None,
            Link::Shared { raw, .. } => Some(raw),
        }
    }

    /// Send one datagram now; a full socket buffer loses it like the network would.
    pub(super) fn send_now(&self, pkt: &[u8]) -> io::Result<()> {
        match sendmsg(self.fd(), self.dest(), &[], pkt) {
            Ok(_) => Ok(()),
            Err(e) if transient(&e) || e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A prepared transfer, handed from the listener to an engine.
pub(super) struct Job {
    pub link: Link,
    pub peer: SocketAddr,
    pub transfer: Transfer,
    pub data: FileData,
    pub oack: Vec<u8>,
    /// Released when the transfer ends (its `max_transfers` permit and its entry in
    /// the listener's table of active peers).
    pub guard: Box<dyn std::marker::Send>,
}

enum Msg {
    Start(Box<Job>),
    Packet(SocketAddr, Bytes),
    Stop,
}

struct Worker {
    tx: mpsc::Sender<Msg>,
    wake: Arc<OwnedFd>,
    /// Transfers assigned to this engine and not ended yet.
    load: Arc<AtomicUsize>,
}

/// A transfer's place on an engine: counted in that engine's load until dropped (the
/// transfer's guard holds it, so it ends with the transfer however that ends).
pub(super) struct Assigned {
    pub idx: usize,
    load: Arc<AtomicUsize>,
}

impl Drop for Assigned {
    fn drop(&mut self) {
        self.load.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Worker {
    fn send(&self, m: Msg) -> Result<(), Msg> {
        self.tx.send(m).map_err(|e| e.0)?;
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to the eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), &one as *const u64 as *const _, 8) };
        Ok(())
    }
}

/// The engine threads of one server.
pub(super) struct Engines {
    workers: Vec<Worker>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
}

impl Engines {
    /// Start `n` engine threads (at least one).
    pub(crate) fn start(n: usize, metrics: Arc<Metrics>) -> io::Result<Engines> {
        // Built up in place: on an error, Drop stops the threads already running.
        let mut engines = Engines {
            workers: Vec::new(),
            threads: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
        };
        for i in 0..n.max(1) {
            let (tx, rx) = mpsc::channel();
            // SAFETY: plain syscalls; each fd is owned right after it is checked.
            let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if wake < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `wake` is a valid fd just returned by eventfd, owned by nobody else.
            let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(wake) });
            // SAFETY: a plain syscall with no pointer arguments.
            let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if ep < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `ep` is a valid fd just returned by epoll_create1, owned by nobody else.
            let ep = unsafe { OwnedFd::from_raw_fd(ep) };
            epoll_ctl(
                &ep,
                libc::EPOLL_CTL_ADD,
                wake.as_raw_fd(),
                libc::EPOLLIN,
                WAKE,
            )?;
            let mut engine = Engine {
                ep,
                wake: wake.clone(),
                rx,
                slots: Vec::new(),
                free: Vec::new(),
                by_peer: HashMap::new(),
                timers: BinaryHeap::new(),
                generation: 0,
                m: metrics.clone(),
                buf: vec![0u8; 2048],
                file_buf: Vec::new(),
            };
            let t = std::thread::Builder::new()
                .name(format!("tftp-{i}"))
                .spawn(move || engine.run())?;
            engines.workers.push(Worker {
                tx,
                wake,
                load: Arc::default(),
            });
            engines
                .threads
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .push(t);
        }
        Ok(engines)
    }

    /// The engine a new transfer goes to: the one with the fewest transfers (a 64 MiB
    /// image and a burst of small files then spread evenly), ties taken in turn.
    pub(crate) fn pick(&self) -> Assigned {
        let n = self.workers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let idx = (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| self.workers[i].load.load(Ordering::Relaxed))
            .unwrap_or(0);
        let load = self.workers[idx].load.clone();
        load.fetch_add(1, Ordering::Relaxed);
        Assigned { idx, load }
    }

    /// Hand a prepared transfer to engine `idx`. Gives the job back if the engine has
    /// stopped (the server is shutting down).
    pub(crate) fn submit(&self, idx: usize, job: Box<Job>) -> Result<(), Box<Job>> {
        match self.workers[idx % self.workers.len()].send(Msg::Start(job)) {
            Ok(()) => Ok(()),
            Err(Msg::Start(job)) => Err(job),
            Err(_) => unreachable!("send gives back the message it was given"),
        }
    }

    /// Forward a packet that arrived on the listening port (single-port mode).
    pub(crate) fn deliver(&self, idx: usize, peer: SocketAddr, pkt: Bytes) {
        let _ = self.workers[idx % self.workers.len()].send(Msg::Packet(peer, pkt));
    }

    /// End every transfer with an ERROR and wait for the threads.
    pub(crate) fn stop(&self) {
        for w in &self.workers {
            let _ = w.send(Msg::Stop);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Slot {
    generation: u64,
    link: Link,
    peer: SocketAddr,
    t: Transfer,
    data: FileData,
    oack: Vec<u8>,
    /// When the transfer times out unless a packet moves it.
    deadline: Instant,
    /// The deadline of this slot's live heap entry, if any.
    timer_at: Option<Instant>,
    /// Blocks of the current window not sent yet (the send buffer was full).
    pending: Option<(u64, u64)>,
    /// EPOLLOUT is armed for `pending`.
    want_write: bool,
    started: Instant,
    _guard: Box<dyn std::marker::Send>,
}

struct Engine {
    ep: OwnedFd,
    wake: Arc<OwnedFd>,
    rx: mpsc::Receiver<Msg>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Single-port transfers by peer.
    by_peer: HashMap<SocketAddr, usize>,
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    generation: u64,
    m: Arc<Metrics>,
    buf: Vec<u8>,
    /// Blocks of a large file read for one `sendmmsg` (grown to the largest batch).
    file_buf: Vec<u8>,
}

impl Engine {
    fn run(&mut self) {
        // SAFETY: epoll_event is plain old data.
        let mut events: Vec<libc::epoll_event> = vec![unsafe { std::mem::zeroed() }; EVENTS];
        loop {
            let timeout = match self.timers.peek() {
                None => -1,
                Some(Reverse((at, _, _))) => {
                    let d = at.saturating_duration_since(Instant::now());
                    // round up: waking a little late is fine, early is a wasted turn
                    d.as_micros().div_ceil(1000).min(60_000) as i32
                }
            };
            // SAFETY: events has room for EVENTS entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.as_raw_fd(),
                    events.as_mut_ptr(),
                    EVENTS as i32,
                    timeout,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "tftp engine: epoll_wait failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for ev in &events[..n as usize] {
                let (token, flags) = (ev.u64, ev.events);
                if token == WAKE {
                    if !self.inbox() {
                        return;
                    }
                    continue;
                }
                let i = (token - 1) as usize;
                if flags & libc::EPOLLOUT as u32 != 0 {
                    self.flush(i);
                }
                if flags & (libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0 {
                    self.readable(i);
                }
            }
            self.expire();
        }
    }

    /// Take the queued messages. False once told to stop.
    fn inbox(&mut self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 (resets the eventfd counter).
        unsafe { libc::read(self.wake.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
        loop {
            let msg = match self.rx.try_recv() {
                Ok(m) => m,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.stop_all();
                    return false;
                }
            };
            match msg {
                Msg::Start(job) => self.start(*job),
                Msg::Packet(peer, pkt) => {
                    if let Some(&i) = self.by_peer.get(&peer) {
                        self.packet(i, &pkt);
                    }
                }
                Msg::Stop => {
                    self.stop_all();
                    return false;
                }
            }
        }
    }

    fn start(&mut self, job: Job) {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        if let Link::Own(s) = &job.link {
            if let Err(e) = epoll_ctl(
                &self.ep,
                libc::EPOLL_CTL_ADD,
                s.as_raw_fd(),
                libc::EPOLLIN,
                i as u64 + 1,
            ) {
                tracing::warn!(peer = %job.peer, error = %e, "tftp: cannot watch transfer socket");
                self.m.error(ErrorKind::Io);
                self.free.push(i);
                return;
            }
        } else {
            self.by_peer.insert(job.peer, i);
        }
        self.generation += 1;
        let now = Instant::now();
        self.slots[i] = Some(Slot {
            generation: self.generation,
            link: job.link,
            peer: job.peer,
            t: job.transfer,
            data: job.data,
            oack: job.oack,
            deadline: now,
            timer_at: None,
            pending: None,
            want_write: false,
            started: now,
            _guard: job.guard,
        });
        self.m.transfers_started.inc();
        self.m.transfers_active.inc();
        let step = self.slots[i].as_mut().map(|s| s.t.start(now));
        if let Some(step) = step {
            self.apply(i, step, now);
        }
    }

    fn readable(&mut self, i: usize) {
        let Some(slot) = self.slots.get(i).and_then(Option::as_ref) else {
            return;
        };
        let fd = slot.link.fd();
        // SAFETY: buf is valid for writes of its length.
        let r = unsafe {
            libc::recv(
                fd,
                self.buf.as_mut_ptr() as *mut _,
                self.buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                self.finish(i, Err(e));
            }
            return;
        }
        let buf = std::mem::take(&mut self.buf);
        self.packet(i, &buf[..r as usize]);
        self.buf = buf;
    }

    fn packet(&mut self, i: usize, pkt: &[u8]) {
        let ev = match packet::parse(pkt) {
            Ok(Packet::Ack { block }) => Event::Ack(block),
            Ok(Packet::Error { code, message }) => Event::PeerError { code, message },
            Ok(_) => return self.m.error(ErrorKind::Unexpected),
            Err(_) => return self.m.error(ErrorKind::Malformed),
        };
        let now = Instant::now();
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let step = slot.t.on_event(ev, now);
        self.apply(i, step, now);
    }

    /// Perform a step of slot `i`'s machine.
    fn apply(&mut self, i: usize, step: Step, now: Instant) {
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if let Some(send) = step.send {
            slot.pending = None;
            match send {
                Send::Oack => {
                    if let Err(e) = slot.link.send_now(&slot.oack) {
                        return self.finish(i, Err(e));
                    }
                }
                Send::Blocks { first, last } => slot.pending = Some((first, last)),
            }
            if step.retransmitted > 0 {
                self.m.retransmits.inc_by(step.retransmitted);
            }
            slot.deadline = now + slot.t.rto();
            if slot.timer_at.is_none_or(|at| at > slot.deadline) {
                slot.timer_at = Some(slot.deadline);
                self.timers
                    .push(Reverse((slot.deadline, i, slot.generation)));
            }
            if slot.pending.is_some() {
                self.flush(i);
            }
        }
        if let Some(o) = step.outcome {
            if o == Outcome::TooSlow {
                if let Some(Some(slot)) = self.slots.get(i) {
                    let _ = slot
                        .link
                        .send_now(&packet::error(ErrorCode::NotDefined, "transfer too slow"));
                }
            }
            self.finish(i, Ok(o));
        }
    }

    /// Send the pending blocks of slot `i` until done or the send buffer is full.
    /// Blocks of a file in memory are sent from it; of a large file, read with one
    /// `pread` per batch into the engine's buffer (see [`super::files`]: no mapping).
    fn flush(&mut self, i: usize) {
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let mut result = Ok(());
        if let Some((mut b, last)) = slot.pending {
            let mut hdrs = [[0u8; 4]; BATCH];
            let mut bytes = 0u64;
            while b <= last {
                let n = ((last - b + 1) as usize).min(BATCH);
                let mut slices: [&[u8]; BATCH] = [&[]; BATCH];
                let (data, at): (&[u8], usize) = match slot.data.bytes() {
                    Some(d) => (d, 0),
                    None => {
                        let at = slot.t.block_range(b).start;
                        let end = slot.t.block_range(b + n as u64 - 1).end;
                        if self.file_buf.len() < end - at {
                            self.file_buf.resize(end - at, 0);
                        }
                        let buf = &mut self.file_buf[..end - at];
                        if let Err(e) = slot.data.read_at(buf, at as u64) {
                            let _ = slot.link.send_now(&packet::error(
                                ErrorCode::NotDefined,
                                "file changed while being sent",
                            ));
                            result = Err(io::Error::new(
                                e.kind(),
                                format!("reading the file being sent: {e}"),
                            ));
                            break;
                        }
                        (&*buf, at)
                    }
                };
                for k in 0..n {
                    let blk = b + k as u64;
                    hdrs[k] = packet::data_header(blk as u16);
                    let r = slot.t.block_range(blk);
                    slices[k] = &data[r.start - at..r.end - at];
                }
                match sendmmsg(slot.link.fd(), slot.link.dest(), &hdrs[..n], &slices[..n]) {
                    Ok(sent) => {
                        let sent = sent.max(1);
                        bytes += slices[..sent].iter().map(|s| s.len() as u64).sum::<u64>();
                        b += sent as u64;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // A transient local error (ENOBUFS, EPERM from a firewall, no route)
                    // loses this datagram like the network would; retransmission covers it.
                    Err(e) if transient(&e) => b += 1,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            self.m.bytes_sent.inc_by(bytes);
            slot.pending = (b <= last).then_some((b, last));
        }
        if let Err(e) = result {
            return self.finish(i, Err(e));
        }
        // Only an own socket waits for EPOLLOUT; the shared one is the listener's, and
        // a full buffer there loses the datagram (retransmission covers it).
        let want = slot.pending.is_some();
        if let Link::Own(s) = &slot.link {
            if want != slot.want_write {
                let ev = if want {
                    libc::EPOLLIN | libc::EPOLLOUT
                } else {
                    libc::EPOLLIN
                };
                if epoll_ctl(
                    &self.ep,
                    libc::EPOLL_CTL_MOD,
                    s.as_raw_fd(),
                    ev,
                    i as u64 + 1,
                )
                .is_ok()
                {
                    slot.want_write = want;
                }
            }
        } else if want {
            slot.pending = None;
        }
    }

    /// Fire the deadlines that are due.
    fn expire(&mut self) {
        let now = Instant::now();
        while let Some(&Reverse((at, i, generation))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            if slot.generation != generation || slot.timer_at != Some(at) {
                continue; // stale entry
            }
            if slot.deadline > now {
                slot.timer_at = Some(slot.deadline);
                self.timers.push(Reverse((slot.deadline, i, generation)));
                continue;
            }
            slot.timer_at = None;
            let step = slot.t.on_event(Event::Timeout, now);
            self.apply(i, step, now);
        }
    }

    fn stop_all(&mut self) {
        for i in 0..self.slots.len() {
            if let Some(slot) = &self.slots[i] {
                let _ = slot.link.send_now(&packet::error(
                    ErrorCode::NotDefined,
                    "server shutting down",
                ));
                self.finish(
                    i,
                    Ok(Outcome::PeerError {
                        code: 0,
                        message: "server shutting down".into(),
                    }),
                );
            }
        }
        // Transfers handed over after the stop get the same answer.
        while let Ok(msg) = self.rx.try_recv() {
            if let Msg::Start(job) = msg {
                let _ = job.link.send_now(&packet::error(
                    ErrorCode::NotDefined,
                    "server shutting down",
                ));
            }
        }
    }

    /// End slot `i`: account its outcome and release it (closing an own socket takes
    /// it out of the epoll set).
    fn finish(&mut self, i: usize, result: io::Result<Outcome>) {
        let Some(slot) = self.slots.get_mut(i).and_then(Option::take) else {
            return;
        };
        self.free.push(i);
        if matches!(slot.link, Link::Shared { .. }) {
            self.by_peer.remove(&slot.peer);
        }
        account(&self.m, slot.peer, slot.started, result);
    }
}

/// Count how a transfer ended, then that it is no longer active: whoever sees the active
/// gauge drop sees the outcome counted already.
fn account(m: &Metrics, peer: SocketAddr, started: Instant, result: io::Result<Outcome>) {
    match result {
        Ok(Outcome::Complete) => {
            m.transfers_completed.inc();
            m.duration_seconds.observe(started.elapsed().as_secs_f64());
        }
        Ok(Outcome::TimedOut) => {
            m.transfers_failed.inc();
            m.error(ErrorKind::Timeout);
        }
        Ok(Outcome::TooSlow) => {
            tracing::debug!(%peer, "tftp transfer ended: below the minimum rate");
            m.transfers_failed.inc();
            m.error(ErrorKind::TooSlow);
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
    m.transfers_active.dec();
}

fn epoll_ctl(ep: &OwnedFd, op: i32, fd: RawFd, events: i32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: events as u32,
        u64: token,
    };
    // SAFETY: ev is a valid epoll_event for the duration of the call.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Send errors that mean "this datagram is lost" rather than "the peer is gone".
pub(super) fn transient(e: &io::Error) -> bool {
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
pub(super) struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

// SAFETY: the storage is plain bytes with no pointers; it is only read by the kernel
// during sendmmsg, so moving or sharing it between threads is sound.
unsafe impl std::marker::Send for RawAddr {}
// SAFETY: as for Send: no interior mutability, no pointers.
unsafe impl Sync for RawAddr {}

impl RawAddr {
    pub(super) fn new(a: &SocketAddr) -> RawAddr {
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

/// One non-blocking sendmmsg(2) of DATA header + payload pairs. Returns how many
/// messages went out.
fn sendmmsg(
    fd: RawFd,
    dest: Option<&RawAddr>,
    hdrs: &[[u8; 4]],
    payloads: &[&[u8]],
) -> io::Result<usize> {
    let n = hdrs.len().min(payloads.len()).min(BATCH);
    if n == 1 {
        // Lockstep (one block per ACK) is the common case in a boot storm: one
        // sendmsg without clearing the batch arrays.
        return sendmsg(fd, dest, &hdrs[0], payloads[0]);
    }
    let mut iov: [[libc::iovec; 2]; BATCH] = [[libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2]; BATCH];
    // SAFETY: mmsghdr is plain old data; zero is a valid bit pattern.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        let h = &hdrs[i];
        iov[i][0] = libc::iovec {
            iov_base: h.as_ptr() as *mut _,
            iov_len: h.len(),
        };
        iov[i][1] = libc::iovec {
            iov_base: payloads[i].as_ptr() as *mut _,
            iov_len: payloads[i].len(),
        };
        let m = &mut msgs[i].msg_hdr;
        m.msg_iov = iov[i].as_mut_ptr();
        m.msg_iovlen = 2;
        if let Some(d) = dest {
            m.msg_name = &d.storage as *const _ as *mut _;
            m.msg_namelen = d.len;
        }
    }
    // SAFETY: every pointer refers to memory borrowed for the duration of the call; the
    // kernel only reads iovecs and names.
    let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// One non-blocking sendmsg(2) of a header (possibly empty) and a payload. Returns 1.
fn sendmsg(fd: RawFd, dest: Option<&RawAddr>, hdr: &[u8], payload: &[u8]) -> io::Result<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: hdr.as_ptr() as *mut _,
            iov_len: hdr.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut _,
            iov_len: payload.len(),
        },
    ];
    // SAFETY: msghdr is plain old data; zero is a valid bit pattern.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.as_mut_ptr();
    m.msg_iovlen = 2;
    if let Some(d) = dest {
        m.msg_name = &d.storage as *const _ as *mut _;
        m.msg_namelen = d.len;
    }
    // SAFETY: the iovecs and the name are borrowed for the duration of the call; the
    // kernel only reads them.
    let r = unsafe { libc::sendmsg(fd, &m, libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(1)
    }
}

/// Path MTU towards the peer of a connected socket, as the kernel knows it.
pub(super) fn socket_mtu(fd: RawFd, v4: bool) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_transfers_go_to_the_least_loaded_engine() {
        let e = Engines::start(3, Arc::new(Metrics::default())).unwrap();
        // three picks fill the three engines, one each
        let a: Vec<Assigned> = (0..3).map(|_| e.pick()).collect();
        let mut idx: Vec<usize> = a.iter().map(|x| x.idx).collect();
        idx.sort();
        assert_eq!(idx, [0, 1, 2]);
        // a long transfer keeps engine a[0] busy; the others' transfers end
        let busy = a[0].idx;
        let mut a = a.into_iter();
        let long = a.next().unwrap();
        drop(a);
        for _ in 0..4 {
            let x = e.pick();
            assert_ne!(
                x.idx, busy,
                "a loaded engine was picked while others were idle"
            );
            let y = e.pick();
            assert_ne!(y.idx, busy);
            assert_ne!(x.idx, y.idx);
        }
        drop(long);
        let loads: Vec<usize> = e
            .workers
            .iter()
            .map(|w| w.load.load(Ordering::Relaxed))
            .collect();
        assert_eq!(
            loads,
            [0, 0, 0],
            "every ended transfer left its engine's count"
        );
        e.stop();
    }
}
