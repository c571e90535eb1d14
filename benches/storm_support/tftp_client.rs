//! The simulated machines' TFTP client, driven by a few epoll threads instead of one
//! tokio task per transfer.
//!
//! The storm harness shares the machine's two cores with the server it measures, so
//! every microsecond it spends per DATA block is taken from the server under test
//! (real machines bring their own CPUs). As a tokio task, each lockstep block cost the
//! harness a task wake-up, a waker registration and one extra `recvfrom` that returned
//! EAGAIN (tokio only learns that a socket is drained by trying it). Here a thread
//! waits in a level-triggered `epoll_wait` over all its transfers' sockets and spends
//! exactly one `recv` and one `send` per block. The behaviour towards the server is the
//! same as before: RRQ with `blksize` and `tsize`, lockstep ACKs, a 1 s timeout
//! doubling to 8 s, 6 timeouts = failure, duplicates ACKed again. The TFTP bench's
//! storm uses it too, with `windowsize` (RFC 7440: one ACK per window; after a gap,
//! one ACK of the last block in order, so the sender resumes there).

use std::io;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bootplane::tftp::packet;

/// How often deadlines are checked (they are seconds long; this is their resolution).
const TICK: Duration = Duration::from_millis(20);
/// Sockets taken per epoll_wait.
const EVENTS: usize = 256;
const WAKE: u64 = u64::MAX;

/// One transfer handed to an engine: a socket already bound to the machine's leased
/// address (non-blocking), the server's port 69, and where the outcome goes.
pub struct Job {
    pub sock: UdpSocket,
    pub server: SocketAddrV4,
    pub file: String,
    pub blksize: usize,
    /// Offered when above 1 (lockstep otherwise, as PXE ROMs are).
    pub windowsize: u16,
    /// Consecutive timeouts before giving up.
    pub max_timeouts: u32,
    /// Whether the bytes of a DATA block are right for their file offset.
    pub check: Check,
    pub done: tokio::sync::oneshot::Sender<Outcome>,
}

/// Checks a block's bytes against what the file holds at their offset.
pub type Check = Arc<dyn Fn(usize, &[u8]) -> bool + Send + Sync>;

pub struct Outcome {
    pub result: Result<usize, String>,
    pub retransmits: u32,
}

struct Thread {
    tx: mpsc::Sender<Job>,
    wake: RawFd,
    handle: Option<JoinHandle<()>>,
}

/// The engine threads; dropping this stops them (transfers still running are abandoned:
/// their outcome channels close).
pub struct Engines {
    threads: Vec<Thread>,
    next: AtomicUsize,
}

impl Engines {
    pub fn start(n: usize) -> Engines {
        let threads = (0..n.max(1))
            .map(|i| {
                // SAFETY: plain syscalls; the fds are owned by this struct and the thread.
                let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                assert!(wake >= 0, "eventfd: {}", io::Error::last_os_error());
                let (tx, rx) = mpsc::channel();
                let handle = std::thread::Builder::new()
                    .name(format!("storm-tftp-{i}"))
                    .spawn(move || run(rx, wake))
                    .expect("starting a tftp client thread");
                Thread {
                    tx,
                    wake,
                    handle: Some(handle),
                }
            })
            .collect();
        Engines {
            threads,
            next: AtomicUsize::new(0),
        }
    }

    /// Hand a transfer to the next thread (round robin).
    pub fn submit(&self, job: Job) {
        let t = &self.threads[self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len()];
        if let Err(mpsc::SendError(job)) = t.tx.send(job) {
            let _ = job.done.send(Outcome {
                result: Err("tftp client thread is gone".into()),
                retransmits: 0,
            });
            return;
        }
        poke(t.wake);
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        for t in &mut self.threads {
            // closing the channel (replacing the sender) tells the thread to finish
            let (tx, _) = mpsc::channel();
            drop(std::mem::replace(&mut t.tx, tx));
            poke(t.wake);
            if let Some(h) = t.handle.take() {
                let _ = h.join();
            }
            unsafe { libc::close(t.wake) };
        }
    }
}

fn poke(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// A transfer in progress.
struct Xfer {
    job: Job,
    /// The server's transfer port, once its first reply came (the socket is then connected).
    peer: Option<SocketAddr>,
    /// The last packet sent (the RRQ, then the last ACK), resent on timeout.
    last: Vec<u8>,
    blksize: usize,
    window: u16,
    /// Blocks received in order since the last ACK.
    in_window: u16,
    /// The block after which the last out-of-order resync ACK was sent.
    resynced_at: Option<u16>,
    expect: u16,
    got: usize,
    tsize: Option<usize>,
    timeouts: u32,
    timeout: Duration,
    deadline: Instant,
    retransmits: u32,
}

enum Step {
    Wait,
    Done(Result<usize, String>),
}

impl Xfer {
    fn send_last(&self) -> io::Result<()> {
        if self.peer.is_some() {
            self.job.sock.send(&self.last).map(|_| ())
        } else {
            self.job
                .sock
                .send_to(&self.last, self.job.server)
                .map(|_| ())
        }
    }

    fn progress(&mut self, now: Instant) {
        self.timeouts = 0;
        self.timeout = Duration::from_secs(1);
        self.deadline = now + self.timeout;
    }

    /// One datagram from `from`.
    fn on_packet(&mut self, pkt: &[u8], from: SocketAddr, now: Instant) -> Step {
        if from.ip() != *self.job.server.ip() || pkt.len() < 4 {
            return Step::Wait;
        }
        if let Some(p) = self.peer {
            if p != from {
                // Another TID: tell it off, as RFC 1350 says.
                let e = packet::error(packet::ErrorCode::UnknownTid, "unknown transfer id");
                let _ = self.job.sock.send_to(&e, from);
                return Step::Wait;
            }
        }
        let op = u16::from_be_bytes([pkt[0], pkt[1]]);
        match op {
            6 if self.peer.is_none() => {
                for (k, v) in oack_options(pkt) {
                    match k.as_str() {
                        "blksize" => self.blksize = v,
                        "tsize" => self.tsize = Some(v),
                        "windowsize" => self.window = (v as u16).max(1),
                        _ => {}
                    }
                }
                if let Err(e) = self.connect(from) {
                    return Step::Done(Err(e));
                }
                self.last.clear();
                self.last.extend_from_slice(&[0, 4, 0, 0]);
                self.progress(now);
                self.ack()
            }
            3 => {
                if self.peer.is_none() {
                    // No OACK: the server ignored the options.
                    if let Err(e) = self.connect(from) {
                        return Step::Done(Err(e));
                    }
                }
                let block = u16::from_be_bytes([pkt[2], pkt[3]]);
                if block == self.expect {
                    let data = &pkt[4..];
                    if !(self.job.check)(self.got, data) {
                        return Step::Done(Err(format!("corrupt data in block {block}")));
                    }
                    self.got += data.len();
                    self.last.clear();
                    self.last.extend_from_slice(&[0, 4, pkt[2], pkt[3]]);
                    self.expect = self.expect.wrapping_add(1);
                    self.progress(now);
                    self.in_window += 1;
                    let end = data.len() < self.blksize;
                    if end || self.in_window >= self.window {
                        self.in_window = 0;
                        if let Step::Done(r) = self.ack() {
                            return Step::Done(r);
                        }
                    }
                    if end {
                        return Step::Done(match self.tsize {
                            Some(t) if t != self.got => {
                                Err(format!("tsize {t} but got {}", self.got))
                            }
                            _ => Ok(self.got),
                        });
                    }
                    Step::Wait
                } else if self.window == 1 {
                    if block == self.expect.wrapping_sub(1) {
                        // Duplicate: our ACK was lost or late; ACK again.
                        return self.ack();
                    }
                    Step::Wait
                } else if self.resynced_at != Some(self.expect) {
                    // A gap or a duplicate in a window: ACK the last block in order,
                    // once, so the sender resumes after it.
                    self.resynced_at = Some(self.expect);
                    self.in_window = 0;
                    self.ack()
                } else {
                    Step::Wait
                }
            }
            5 => Step::Done(Err(format!(
                "error {}: {}",
                u16::from_be_bytes([pkt[2], pkt[3]]),
                String::from_utf8_lossy(&pkt[4..]).trim_end_matches('\0')
            ))),
            _ => Step::Wait,
        }
    }

    fn connect(&mut self, from: SocketAddr) -> Result<(), String> {
        self.peer = Some(from);
        self.job.sock.connect(from).map_err(|e| e.to_string())
    }

    fn ack(&self) -> Step {
        match self.send_last() {
            Ok(()) => Step::Wait,
            Err(e) => Step::Done(Err(e.to_string())),
        }
    }

    /// The deadline passed: resend or give up.
    fn on_timeout(&mut self, now: Instant) -> Step {
        self.timeouts += 1;
        if self.timeouts > self.job.max_timeouts {
            return Step::Done(Err(format!(
                "timed out at block {} ({} bytes)",
                self.expect, self.got
            )));
        }
        self.retransmits += 1;
        self.timeout = (self.timeout * 2).min(Duration::from_secs(8));
        self.deadline = now + self.timeout;
        self.ack()
    }
}

/// The options of an OACK packet, names lower-cased, values as numbers (0 if not one).
pub fn oack_options(pkt: &[u8]) -> impl Iterator<Item = (String, usize)> + '_ {
    let mut it = pkt.get(2..).unwrap_or_default().split(|b| *b == 0);
    std::iter::from_fn(move || {
        let (k, v) = (it.next()?, it.next()?);
        let v = String::from_utf8_lossy(v).parse().unwrap_or(0);
        Some((String::from_utf8_lossy(k).to_ascii_lowercase(), v))
    })
}

/// An octet RRQ asking for `blksize` and `tsize`, and `windowsize` when above 1.
pub fn rrq(file: &str, blksize: usize, windowsize: u16) -> Vec<u8> {
    let mut p = vec![0, 1];
    let (b, w) = (blksize.to_string(), windowsize.to_string());
    let mut parts = vec![file, "octet", "blksize", &b, "tsize", "0"];
    if windowsize > 1 {
        parts.extend(["windowsize", &w]);
    }
    for part in parts {
        p.extend_from_slice(part.as_bytes());
        p.push(0);
    }
    p
}

fn epoll_add(ep: RawFd, fd: RawFd, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: a valid epoll fd and a live event struct.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One engine thread: its transfers in a slab indexed by epoll token.
fn run(rx: mpsc::Receiver<Job>, wake: RawFd) {
    // SAFETY: plain syscall; closed at the end of this function.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0, "epoll_create1: {}", io::Error::last_os_error());
    epoll_add(ep, wake, WAKE).expect("epoll_ctl on the eventfd");
    let mut slab: Vec<Option<Xfer>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut open = true;
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS];
    let mut buf = vec![0u8; 65536];
    let mut next_scan = Instant::now() + TICK;
    let finish = |x: Xfer, r: Result<usize, String>| {
        let _ = x.job.done.send(Outcome {
            result: r,
            retransmits: x.retransmits,
        });
    };
    while open {
        // SAFETY: `events` is a live buffer of EVENTS entries.
        let n = unsafe {
            libc::epoll_wait(
                ep,
                events.as_mut_ptr(),
                EVENTS as i32,
                TICK.as_millis() as i32,
            )
        };
        let now = Instant::now();
        for ev in &events[..n.max(0) as usize] {
            let token = ev.u64;
            if token == WAKE {
                let mut v = 0u64;
                unsafe { libc::read(wake, (&mut v as *mut u64).cast(), 8) };
                loop {
                    match rx.try_recv() {
                        Ok(job) => {
                            let fd = job.sock.as_raw_fd();
                            let idx = free.pop().unwrap_or_else(|| {
                                slab.push(None);
                                slab.len() - 1
                            });
                            let x = Xfer {
                                last: rrq(&job.file, job.blksize, job.windowsize),
                                job,
                                peer: None,
                                blksize: 512,
                                window: 1,
                                in_window: 0,
                                resynced_at: None,
                                expect: 1,
                                got: 0,
                                tsize: None,
                                timeouts: 0,
                                timeout: Duration::from_secs(1),
                                deadline: now + Duration::from_secs(1),
                                retransmits: 0,
                            };
                            let started = epoll_add(ep, fd, idx as u64)
                                .and_then(|()| x.send_last())
                                .map_err(|e| e.to_string());
                            match started {
                                Ok(()) => {
                                    slab[idx] = Some(x);
                                }
                                Err(e) => {
                                    free.push(idx);
                                    finish(x, Err(e));
                                }
                            }
                        }
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                }
                continue;
            }
            let idx = token as usize;
            let Some(x) = slab.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            let step = match x.job.sock.recv_from(&mut buf) {
                Ok((len, from)) => x.on_packet(&buf[..len], from, now),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Step::Wait,
                Err(e) => Step::Done(Err(format!("recv: {e}"))),
            };
            if let Step::Done(r) = step {
                // closing the socket (dropping the job) takes it out of the epoll set
                let x = slab[idx].take().expect("present");
                free.push(idx);
                finish(x, r);
            }
        }
        if now >= next_scan {
            next_scan = now + TICK;
            for (idx, entry) in slab.iter_mut().enumerate() {
                let step = match entry.as_mut() {
                    Some(x) if now >= x.deadline => x.on_timeout(now),
                    _ => continue,
                };
                if let Step::Done(r) = step {
                    let x = entry.take().expect("present");
                    free.push(idx);
                    finish(x, r);
                }
            }
        }
    }
    unsafe { libc::close(ep) };
}
