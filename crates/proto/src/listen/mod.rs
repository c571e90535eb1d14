//! Connection admission shared by the two HTTP listeners (the boot listener,
//! [`crate::http::server`], and the API listener, [`router`]): a global connection
//! limit, a per-source share of it, an idle timeout and a header read timeout, so that
//! one client cannot lock others out however many connections it opens.
//!
//! - **Admission** ([`Admission::admit`], at accept): a source (an IPv4 address, or an
//!   IPv6 /64, the block one host usually controls) may hold `max_per_source`
//!   connections. At that share its next connection replaces its own oldest *idle*
//!   connection; when all of them are busy the new one is refused (closed at once,
//!   counted). When the global limit is reached a new client is still let in: the
//!   oldest idle connection of the source holding the most connections is closed to
//!   make room (as nginx reuses keep-alive connections when `worker_connections` run
//!   out, but chosen per source so a client with one connection is the last to lose
//!   it). Only when no connection at all is idle (or slow, below) is the new one refused.
//! - **Slow busy connections** ([`SlowRate`], the boot listener only): a response that
//!   has been sent for longer than its grace at an average below the slow rate (a
//!   client that reads a download a few bytes at a time, or not at all) may be evicted
//!   like an idle connection. Candidates are ranked by the number of connections their
//!   source holds first, then idle before slow, then the oldest idle or the slowest
//!   busy one: a few sources holding every slot with downloads they do not read can no
//!   longer lock a booting machine out. The connection reports its bytes sent on its
//!   [`Slot`] (one relaxed store per write call); the rate is computed by the evictor.
//! - **Idle vs busy**: a connection is *busy* from a complete request head until its
//!   response has been written (a watch stream is busy for as long as it runs), and
//!   only then may it be evicted or time out; before the first byte of a request it is
//!   idle (`idle_timeout`), and from that byte until the head is complete it is reading
//!   a head (`header_read_timeout`, and it may be evicted too). Busy connections still
//!   count against their source's share.
//! - **Cost**: the table (a mutex) is touched at accept and at close only. Per request
//!   a connection does two atomic updates on its own [`Slot`] (busy, idle) and one
//!   when a head starts (a paced response one more at its start and a relaxed store
//!   per write call); the timer ([`Watchdog`]) is one lazily moved `Sleep` per
//!   connection. Eviction scans the table only when a limit is reached.

pub mod router;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// The limits one listener admits connections under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections one source (IPv4 address, IPv6 /64) may hold at once.
    pub max_per_source: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout: Duration,
    /// How long a connection may wait for a request's first byte (after the accept and
    /// between keep-alive requests).
    pub idle_timeout: Duration,
}

impl Limits {
    /// The same limits with the counts at least 1 and the share at most the total.
    pub fn normalized(mut self) -> Limits {
        self.max_connections = self.max_connections.max(1);
        self.max_per_source = self.max_per_source.clamp(1, self.max_connections);
        self
    }
}

/// When a busy connection counts as slow enough to be evicted for a new one (see the
/// module doc): its response has run longer than `grace` and sent fewer than
/// `bytes_per_sec` times the time since then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlowRate {
    pub bytes_per_sec: u64,
    pub grace: Duration,
}

impl SlowRate {
    /// Whether `sent` bytes in `elapsed` fall below the rate: `elapsed` is past the
    /// grace and `sent` is less than the rate times the time past it (the grace is an
    /// allowance, as TFTP's `min_rate_bytes_per_sec` has it). O(1), integer only.
    pub(crate) fn behind(&self, sent: u64, elapsed: Duration) -> bool {
        let Some(past) = elapsed.checked_sub(self.grace) else {
            return false;
        };
        if past.is_zero() || self.bytes_per_sec == 0 {
            return false;
        }
        (sent as u128) * 1000 < (self.bytes_per_sec as u128) * past.as_millis()
    }
}

/// Connection counters of one listener (cheap clones over shared atomics).
#[derive(Clone, Debug, Default)]
pub struct ConnMetrics {
    /// Connections currently admitted.
    pub open: Gauge,
    /// Closed at accept: the listener was full and no connection was idle.
    pub rejected: Counter,
    /// Closed at accept: the source held its share and none of it was idle.
    pub refused_per_source: Counter,
    /// Idle (or slow busy) connections closed to make room for a new one.
    pub evicted: Counter,
    /// Closed by the idle or the header read timeout.
    pub timed_out: Counter,
}

impl ConnMetrics {
    /// Add the counters to `r` (a listener's prefixed sub-registry) as
    /// `connections_open`, `connections_rejected`, `connections_refused_per_source`,
    /// `connections_evicted` and `connections_timed_out`.
    pub fn register(&self, r: &mut Registry) {
        r.register("connections_open", "Open connections", self.open.clone());
        r.register(
            "connections_rejected",
            "Connections closed at once because max_connections was reached and none was idle",
            self.rejected.clone(),
        );
        r.register(
            "connections_refused_per_source",
            "Connections closed at once because their source held its share and none of it was idle",
            self.refused_per_source.clone(),
        );
        r.register(
            "connections_evicted",
            "Idle (or slow busy) connections closed to make room for a new one",
            self.evicted.clone(),
        );
        r.register(
            "connections_timed_out",
            "Connections closed by the idle or header read timeout",
            self.timed_out.clone(),
        );
    }
}

/// Why [`Admission::admit`] refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("connection limit reached and no connection is idle")]
    Full,
    #[error("the source holds its share of connections and none is idle")]
    PerSource,
}

/// Why a [`Watchdog`] ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Expiry {
    #[error("no request within the idle timeout")]
    Idle,
    #[error("request head not completed within the header read timeout")]
    Header,
    #[error("closed to make room for a new connection")]
    Evicted,
}

/// The connection table of one listener, shared by all its accept loops (clone it).
#[derive(Clone)]
pub struct Admission {
    shared: Arc<Shared>,
}

struct Shared {
    limits: Limits,
    /// Busy connections below this rate are evictable (None: never).
    slow: Option<SlowRate>,
    metrics: ConnMetrics,
    table: Mutex<Table>,
    /// Time base of the slots' timestamps.
    base: Instant,
    /// Milliseconds since `base` of the last refusal logged: one line a second.
    last_warn: AtomicU64,
    name: &'static str,
}

#[derive(Default)]
struct Table {
    total: usize,
    sources: HashMap<IpAddr, Vec<Arc<Slot>>>,
}

/// The part of an admitted connection the table and the evictor see.
pub(crate) struct Slot {
    /// Phase (top two bits) and, when idle or reading a head, since when (ms after
    /// `base`);
    /// when busy, the number of requests in progress (HTTP/2 may have several).
    state: AtomicU64,
    /// Woken when the connection is evicted (or, for the API listener, goes idle).
    waker: AtomicWaker,
    source: IpAddr,
    /// The table's time base for `state`'s timestamps.
    base: Instant,
    /// Index in its source's list; `usize::MAX` once out of the table. Changed under
    /// the table lock only.
    pos: AtomicUsize,
    /// When the response being sent began (ms after `base`, plus one; 0: none).
    paced_since: AtomicU64,
    /// Body bytes of that response handed to the socket so far.
    sent: AtomicU64,
}

const PHASE: u64 = 3 << 62;
const IDLE: u64 = 0;
const HEAD: u64 = 1 << 62;
const BUSY: u64 = 2 << 62;
const CLOSED: u64 = 3 << 62;
const VALUE: u64 = !PHASE;

/// Milliseconds since `base` (the table's creation), as slots store them.
fn ms_since(base: Instant) -> u64 {
    (Instant::now().saturating_duration_since(base).as_millis() as u64) & VALUE
}

/// The key a connection is counted under: an IPv4 address, or an IPv6 /64.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

impl Slot {
    fn new(source: IpAddr, base: Instant) -> Slot {
        Slot {
            state: AtomicU64::new(IDLE | ms_since(base)),
            waker: AtomicWaker::new(),
            source,
            base,
            pos: AtomicUsize::new(usize::MAX),
            paced_since: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// A response starts being sent: from now its average rate may make the
    /// connection evictable (with a [`SlowRate`]). Cleared by [`Slot::end`].
    pub(crate) fn pace_start(&self) {
        self.sent.store(0, Ordering::Relaxed);
        self.paced_since
            .store(ms_since(self.base) + 1, Ordering::Release);
    }

    /// `total` bytes of the current response have been handed to the socket.
    pub(crate) fn pace_sent(&self, total: u64) {
        self.sent.store(total, Ordering::Relaxed);
    }

    /// The current response's average rate in bytes/s when it is behind `slow`.
    fn slow_rate(&self, slow: &SlowRate, now_ms: u64) -> Option<u64> {
        let since = self.paced_since.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let elapsed = now_ms.saturating_sub(since - 1);
        let sent = self.sent.load(Ordering::Relaxed);
        slow.behind(sent, Duration::from_millis(elapsed))
            .then(|| sent.saturating_mul(1000) / elapsed.max(1))
    }

    /// The first bytes of a request head arrived (no-op unless idle).
    pub(crate) fn head_started(&self) {
        let s = self.state.load(Ordering::Relaxed);
        if s & PHASE == IDLE {
            let _ = self.state.compare_exchange(
                s,
                HEAD | ms_since(self.base),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// A request head is complete: the connection is busy until [`Slot::end`].
    /// False if it was evicted (the caller closes it instead of answering).
    pub(crate) fn begin(&self) -> bool {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            let next = match s & PHASE {
                CLOSED => return false,
                BUSY => s + 1,
                _ => BUSY | 1,
            };
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(x) => s = x,
            }
        }
    }

    /// A response has been written: idle again once no other request is in progress.
    pub(crate) fn end(&self) {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            let next = match s & PHASE {
                BUSY if s & VALUE > 1 => s - 1,
                BUSY => IDLE | ms_since(self.base),
                _ => return,
            };
            self.paced_since.store(0, Ordering::Relaxed);
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(x) => s = x,
            }
        }
    }

    /// Wake the connection's [`Watchdog`] (after a change made outside its task).
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// The instant a state's timestamp stands for.
    fn at(&self, state: u64) -> Instant {
        self.base + Duration::from_millis(state & VALUE)
    }

    /// Idle or reading a head: (state, since when in ms), else None.
    fn evictable_since(&self) -> Option<(u64, u64)> {
        let s = self.state.load(Ordering::Acquire);
        matches!(s & PHASE, IDLE | HEAD).then_some((s, s & VALUE))
    }
}

impl Admission {
    /// A table for one listener; `name` labels its log lines.
    pub fn new(name: &'static str, limits: Limits, metrics: ConnMetrics) -> Admission {
        Admission::with_slow(name, limits, metrics, None)
    }

    /// [`Admission::new`] where busy connections below `slow` are evictable too.
    pub(crate) fn with_slow(
        name: &'static str,
        limits: Limits,
        metrics: ConnMetrics,
        slow: Option<SlowRate>,
    ) -> Admission {
        Admission {
            shared: Arc::new(Shared {
                limits: limits.normalized(),
                slow,
                metrics,
                table: Mutex::new(Table::default()),
                base: Instant::now(),
                last_warn: AtomicU64::new(0),
                name,
            }),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    pub fn metrics(&self) -> &ConnMetrics {
        &self.shared.metrics
    }

    /// Admit a connection from `peer`, making room by evicting an idle connection when
    /// a limit is reached (see the module doc). The connection leaves the table when
    /// the returned [`Conn`] is dropped.
    pub(crate) fn admit(&self, peer: IpAddr) -> Result<Conn, Refused> {
        let sh = &*self.shared;
        let source = source_key(peer);
        let slot = Arc::new(Slot::new(source, sh.base));
        let mut t = sh.table.lock().unwrap_or_else(|e| e.into_inner());
        let held = t.sources.get(&source).map_or(0, Vec::len);
        let slow = sh.slow.as_ref().map(|s| (s, ms_since(sh.base)));
        if held >= sh.limits.max_per_source {
            if !t.evict(Some(source), slow, &sh.metrics) {
                sh.metrics.refused_per_source.inc();
                return Err(Refused::PerSource);
            }
        } else if t.total >= sh.limits.max_connections && !t.evict(None, slow, &sh.metrics) {
            sh.metrics.rejected.inc();
            return Err(Refused::Full);
        }
        let list = t.sources.entry(source).or_default();
        slot.pos.store(list.len(), Ordering::Relaxed);
        list.push(slot.clone());
        t.total += 1;
        sh.metrics.open.inc();
        drop(t);
        Ok(Conn {
            shared: self.shared.clone(),
            slot,
        })
    }

    /// Accept the next connection on `listener` that [`Admission::admit`] lets in;
    /// refused ones are closed at once (and logged at most once a second). Accept
    /// errors (EMFILE and friends) back off briefly instead of spinning. Cancel-safe.
    pub(crate) async fn accept(&self, listener: &TcpListener) -> (TcpStream, SocketAddr, Conn) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(listener = self.shared.name, error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.admit(peer.ip()) {
                Ok(conn) => return (stream, peer, conn),
                Err(why) => {
                    drop(stream);
                    self.warn_refused(peer, why);
                }
            }
        }
    }

    fn warn_refused(&self, peer: SocketAddr, why: Refused) {
        let sh = &*self.shared;
        let now = ms_since(sh.base);
        let last = sh.last_warn.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && sh
                .last_warn
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                listener = sh.name,
                client = %peer.ip(),
                max = sh.limits.max_connections,
                max_per_source = sh.limits.max_per_source,
                rejected = sh.metrics.rejected.get(),
                refused_per_source = sh.metrics.refused_per_source.get(),
                "closing a new connection: {why} (one line a second at most)"
            );
        }
    }
}

/// An eviction candidate's rank: the connections its source holds (more goes first),
/// its class (0 idle or reading a head, 1 slow busy: lower first), then since when it
/// is idle or its rate (lower first).
type Rank = (usize, u8, u64);

impl Table {
    /// Evict a connection of `only`, or (None) of the source holding the most
    /// connections that has a candidate: an idle one (the oldest), else a busy one
    /// behind `slow` at `now` (ms after the base; the slowest). False if there is none.
    fn evict(
        &mut self,
        only: Option<IpAddr>,
        slow: Option<(&SlowRate, u64)>,
        metrics: &ConnMetrics,
    ) -> bool {
        // A candidate may change phase between the scan and the swap: scan again then.
        for _ in 0..8 {
            let mut best: Option<(Rank, u64, Arc<Slot>)> = None;
            let mut consider = |held: usize, list: &Vec<Arc<Slot>>| {
                for slot in list {
                    let (state, key) = match slot.evictable_since() {
                        Some((state, since)) => (state, (held, 0, since)),
                        None => {
                            let Some((sl, now)) = slow else {
                                continue;
                            };
                            let state = slot.state.load(Ordering::Acquire);
                            if state & PHASE != BUSY {
                                continue;
                            }
                            let Some(rate) = slot.slow_rate(sl, now) else {
                                continue;
                            };
                            (state, (held, 1, rate))
                        }
                    };
                    let better = match &best {
                        None => true,
                        Some(((h, c, o), _, _)) => {
                            key.0 > *h || (key.0 == *h && (key.1, key.2) < (*c, *o))
                        }
                    };
                    if better {
                        best = Some((key, state, slot.clone()));
                    }
                }
            };
            match only {
                Some(src) => {
                    if let Some(list) = self.sources.get(&src) {
                        consider(list.len(), list);
                    }
                }
                None => {
                    for list in self.sources.values() {
                        consider(list.len(), list);
                    }
                }
            }
            let Some((_, state, slot)) = best else {
                return false;
            };
            if slot
                .state
                .compare_exchange(state, CLOSED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.remove(&slot);
                metrics.open.dec();
                metrics.evicted.inc();
                slot.waker.wake();
                return true;
            }
        }
        false
    }

    /// Take `slot` out of the table; false if it was not in it.
    fn remove(&mut self, slot: &Slot) -> bool {
        let pos = slot.pos.swap(usize::MAX, Ordering::Relaxed);
        if pos == usize::MAX {
            return false;
        }
        let Some(list) = self.sources.get_mut(&slot.source) else {
            return false;
        };
        list.swap_remove(pos);
        if let Some(moved) = list.get(pos) {
            moved.pos.store(pos, Ordering::Relaxed);
        }
        if list.is_empty() {
            self.sources.remove(&slot.source);
        }
        self.total -= 1;
        true
    }
}

/// An admitted connection: holds its place in the table until dropped.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    slot: Arc<Slot>,
}

impl Conn {
    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// The timer that ends this connection when it is idle or slow too long, or evicted.
    pub(crate) fn watchdog(&self) -> Watchdog {
        Watchdog {
            slot: self.slot.clone(),
            idle: self.shared.limits.idle_timeout,
            header: self.shared.limits.header_read_timeout,
            timed_out: self.shared.metrics.timed_out.clone(),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut t = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        if t.remove(&self.slot) {
            self.shared.metrics.open.dec();
        }
    }
}

/// Resolves when the connection has waited too long for a request's first byte
/// (idle), for the rest of its head (header), or was evicted. Never while busy. Poll
/// it whenever the connection's task wakes (e.g. in the same `select!` as the
/// connection's reads): a head that starts moves the deadline earlier, and the timer
/// is re-armed on that poll. Changes made on another task must call [`Slot::wake`].
pub(crate) struct Watchdog {
    slot: Arc<Slot>,
    idle: Duration,
    header: Duration,
    timed_out: Counter,
    sleep: Pin<Box<Sleep>>,
    /// The instant `sleep` is set to (None: not yet set).
    armed: Option<Instant>,
}

impl Future for Watchdog {
    type Output = Expiry;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expiry> {
        let this = self.get_mut();
        this.slot.waker.register(cx.waker());
        loop {
            let s = this.slot.state.load(Ordering::Acquire);
            let (deadline, why) = match s & PHASE {
                CLOSED => return Poll::Ready(Expiry::Evicted),
                BUSY => return Poll::Pending,
                IDLE => (this.slot.at(s) + this.idle, Expiry::Idle),
                _ => (this.slot.at(s) + this.header, Expiry::Header),
            };
            // The timer moves lazily: re-armed when the deadline moves earlier, or when
            // it fires before a deadline that moved later.
            if this.armed.is_none_or(|a| deadline < a) {
                this.sleep.as_mut().reset(deadline);
                this.armed = Some(deadline);
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if Instant::now() >= deadline {
                this.timed_out.inc();
                return Poll::Ready(why);
            }
            this.sleep.as_mut().reset(deadline);
            this.armed = Some(deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, per: usize) -> Limits {
        Limits {
            max_connections: max,
            max_per_source: per,
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(3),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sources_are_ipv4_addresses_and_ipv6_slash_64s() {
        assert_eq!(source_key(ip("10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(source_key(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(source_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            source_key(ip("2001:db8:1:2:ffff::9")),
            source_key(ip("2001:db8:1:2::1"))
        );
        assert_ne!(
            source_key(ip("2001:db8:1:2::1")),
            source_key(ip("2001:db8:1:3::1"))
        );
    }

    #[tokio::test]
    async fn a_source_at_its_share_replaces_its_oldest_idle_connection_or_is_refused() {
        let m = ConnMetrics::default();
        let a = Admission::new("test", limits(10, 3), m.clone());
        let first = a.admit(ip("10.0.0.1")).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let c2 = a.admit(ip("10.0.0.1")).unwrap();
        let c3 = a.admit(ip("10.0.0.1")).unwrap();
        // The fourth takes the place of the oldest idle one.
        let c4 = a.admit(ip("10.0.0.1")).unwrap();
        assert!(first.slot().state.load(Ordering::Relaxed) & PHASE == CLOSED);
        assert_eq!(first.watchdog().await, Expiry::Evicted);
        assert!(!first.slot().begin());
        assert_eq!((m.evicted.get(), m.open.get()), (1, 3));
        drop(first);
        assert_eq!(m.open.get(), 3);
        // All busy: refused; other sources still get in.
        for c in [&c2, &c3, &c4] {
            assert!(c.slot().begin());
        }
        assert_eq!(a.admit(ip("10.0.0.1")).err(), Some(Refused::PerSource));
        assert_eq!(m.refused_per_source.get(), 1);
        let other = a.admit(ip("10.0.0.2")).unwrap();
        c3.slot().end();
        let c5 = a.admit(ip("10.0.0.1")).unwrap();
        assert!(c3.slot().state.load(Ordering::Relaxed) & PHASE == CLOSED);
        drop((c2, c3, c4, c5, other));
        assert_eq!(m.open.get(), 0);
        assert!(a.shared.table.lock().unwrap().sources.is_empty());
    }

    #[tokio::test]
    async fn a_full_listener_evicts_from_the_busiest_source() {
        let m = ConnMetrics::default();
        let a = Admission::new("test", limits(4, 4), m.clone());
        let lone = a.admit(ip("10.0.0.9")).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let heavy: Vec<Conn> = (0..3).map(|_| a.admit(ip("10.0.0.1")).unwrap()).collect();
        // Full: the lone client's connection is the oldest but its source holds one.
        let newcomer = a.admit(ip("10.0.0.2")).unwrap();
        assert!(lone.slot().begin(), "the lone connection was evicted");
        assert_eq!(m.evicted.get(), 1);
        assert_eq!(
            heavy
                .iter()
                .filter(|c| c.slot().state.load(Ordering::Relaxed) & PHASE == CLOSED)
                .count(),
            1
        );
        // Everything busy: refused.
        for c in heavy.iter().chain([&newcomer]) {
            c.slot().begin();
        }
        assert_eq!(a.admit(ip("10.0.0.3")).err(), Some(Refused::Full));
        assert_eq!(m.rejected.get(), 1);
        assert_eq!(m.open.get(), 4);
    }

    #[test]
    fn slow_rate_is_behind_only_past_its_grace() {
        let s = SlowRate {
            bytes_per_sec: 1000,
            grace: Duration::from_secs(10),
        };
        let secs = Duration::from_secs;
        assert!(!s.behind(0, secs(10)), "within the grace");
        assert!(s.behind(0, Duration::from_millis(10_001)));
        assert!(!s.behind(5000, secs(15)), "5 s past the grace, 5,000 bytes");
        assert!(s.behind(4999, secs(15)));
        let off = SlowRate {
            bytes_per_sec: 0,
            ..s
        };
        assert!(!off.behind(0, secs(3600)));
    }

    #[tokio::test]
    async fn a_full_listener_evicts_a_slow_busy_connection_but_never_a_fast_one() {
        let m = ConnMetrics::default();
        let slow = SlowRate {
            bytes_per_sec: 1000,
            grace: Duration::from_millis(100),
        };
        let a = Admission::with_slow("test", limits(4, 4), m.clone(), Some(slow));
        let c: Vec<Conn> = (0..4).map(|_| a.admit(ip("10.0.0.1")).unwrap()).collect();
        for x in &c {
            assert!(x.slot().begin());
            x.slot().pace_start();
        }
        // Within the grace nothing is slow: refused.
        assert_eq!(a.admit(ip("10.0.0.2")).err(), Some(Refused::Full));
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Three keep up (1,000 bytes/s over the 300 ms past the grace needs 300), one
        // has sent 10 bytes; the slow one goes, the fast ones stay.
        for x in &c[..3] {
            x.slot().pace_sent(1 << 20);
        }
        c[3].slot().pace_sent(10);
        let newcomer = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(c[3].watchdog().await, Expiry::Evicted);
        assert_eq!(m.evicted.get(), 1);
        assert!(c[..3]
            .iter()
            .all(|x| x.slot().state.load(Ordering::Relaxed) & PHASE == BUSY));
        // Everything busy and fast: refused again; a response that ended is no longer
        // measured (its connection is idle, and idle goes first).
        assert!(newcomer.slot().begin());
        assert_eq!(a.admit(ip("10.0.0.3")).err(), Some(Refused::Full));
        c[0].slot().pace_sent(0);
        c[0].slot().end();
        assert!(c[0].slot().begin());
        assert_eq!(a.admit(ip("10.0.0.3")).err(), Some(Refused::Full));
        // Without a slow rate (the API listener) a busy connection is never evicted.
        let plain = Admission::new("test", limits(1, 1), ConnMetrics::default());
        let only = plain.admit(ip("10.0.0.1")).unwrap();
        assert!(only.slot().begin());
        only.slot().pace_start();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(plain.admit(ip("10.0.0.2")).err(), Some(Refused::Full));
    }

    #[tokio::test]
    async fn watchdog_times_idle_and_slow_heads_but_never_a_busy_connection() {
        let m = ConnMetrics::default();
        let l = Limits {
            header_read_timeout: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(1500),
            ..limits(4, 4)
        };
        let a = Admission::new("test", l, m.clone());
        let ms = Duration::from_millis;
        let c = a.admit(ip("10.0.0.1")).unwrap();
        let t0 = Instant::now();
        assert_eq!(c.watchdog().await, Expiry::Idle);
        assert!(t0.elapsed() >= ms(1490), "{:?}", t0.elapsed());
        // A head started after 300 ms must be complete 200 ms later, before the idle
        // deadline.
        let c = a.admit(ip("10.0.0.1")).unwrap();
        let mut w = c.watchdog();
        let t0 = Instant::now();
        tokio::select! {
            _ = &mut w => panic!("fired early"),
            _ = tokio::time::sleep(ms(300)) => {}
        }
        c.slot().head_started();
        assert_eq!((&mut w).await, Expiry::Header);
        let took = t0.elapsed();
        assert!(took >= ms(490) && took < ms(1200), "{took:?}");
        // Busy: no deadline, however long; idle again: a fresh idle timeout.
        let c = a.admit(ip("10.0.0.1")).unwrap();
        let mut w = c.watchdog();
        assert!(c.slot().begin());
        tokio::select! {
            _ = &mut w => panic!("a busy connection timed out"),
            _ = tokio::time::sleep(ms(2000)) => {}
        }
        let t0 = Instant::now();
        c.slot().end();
        assert_eq!(w.await, Expiry::Idle);
        assert!(t0.elapsed() >= ms(1490), "{:?}", t0.elapsed());
        assert_eq!(m.timed_out.get(), 3);
    }
}
