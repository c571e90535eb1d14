//! DHCP server (proxyDHCP and authoritative, PXE / UEFI / iPXE aware) on dhcproto:
//! a pure core ([`core::Server::handle`]: `request + state → reply`) and the thin
//! socket loop in this file.
//!
//! The loop is one task that owns all state, so the hot path takes no locks. It
//! reads a packet, drains whatever else is already queued (up to `max_batch`),
//! handles the batch and sends every reply at once, except ACKs: those wait for
//! their lease changes to be durable. Lease changes are written by one commit at a
//! time off the loop, into the scope's [`ledger`]: the lease log (one append + one
//! fdatasync on the blocking pool, see [`persist`]) or, with several appliances, etcd
//! (a compare-and-swap per address, see [`cluster`]); while it runs, the loop keeps
//! answering, and everything that accumulates is the next commit (group commit that
//! grows with the write's latency). Commits start at most once
//! per `commit_window` (default 2 ms; earlier when `max_batch` ACKs wait): with a
//! fast disk and a steady trickle of clients every commit would otherwise carry one
//! or two leases (measured: 13,191 commits for 18,170 ACKs at 2,000 leases/s; with
//! the window 3,944, i.e. 3.3× fewer fdatasyncs; the CPU per lease did not change
//! measurably, the per-packet kernel path dominates it). An ACK waits at most one
//! window longer. A commit's ACKs are sent
//! when it returns, after its changes are published to the [`LeaseIndex`], so an
//! ACK is never on the wire before its lease is durable (etcd: an ACK whose address
//! another appliance won becomes a NAK). At most `max(4 × max_batch,
//! 4096)` ACKs may wait for disk; beyond that the loop stops reading (the bound on
//! in-flight work; the kernel buffer absorbs the rest). A per-MAC token bucket
//! drops floods from one client before they cost a decode.
//!
//! Sockets: UDP 0.0.0.0:67 (and :4011 in proxy mode, for UEFI PXE and iPXE boot
//! file requests), bound to the interface with SO_BINDTODEVICE, SO_BROADCAST for
//! replies to clients without an address, SO_REUSEADDR/SO_REUSEPORT so a proxy can
//! share the port with the authoritative server of the segment.

pub mod api;
#[cfg(feature = "etcd")]
pub mod cluster;
pub mod core;
pub mod grants;
pub mod leases;
pub mod ledger;
pub mod members;
pub mod metrics;
pub mod overload;
pub mod persist;
pub mod reservations;
pub mod settings;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sys::unix_now;

use anyhow::{bail, Context as _, Result};
use tokio::net::UdpSocket;

pub use self::core::{ClientInfo, MachineScripts, Meta, Outcome, Reply, ReplyKind, Server};
pub use self::grants::Grant;
pub use self::leases::{Lease, LeaseIndex, LeaseState};
pub use self::metrics::{DropReason, Metrics};
pub use self::settings::{DhcpConfig, DhcpMode, DhcpSettings, Reservation};

use self::core::{PXE_PORT, SERVER_PORT};
use self::grants::Reporter;
use self::leases::Verdict;
use self::ledger::{Done, Ledger};
use self::persist::LeaseLog;
use crate::model::ident::Mac;
use crate::shutdown::Shutdown;

/// Lease log file name inside the state directory.
pub const LEASE_FILE: &str = "dhcp-leases.log";

/// The interface's first IPv4 address and prefix length.
pub fn interface_ipv4(name: &str) -> Result<(Ipv4Addr, u8)> {
    let addrs = nix::ifaddrs::getifaddrs().context("listing interface addresses")?;
    for a in addrs {
        if a.interface_name != name {
            continue;
        }
        let Some(ip) = a
            .address
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| s.ip())
        else {
            continue;
        };
        let prefix = a
            .netmask
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| u32::from(s.ip()).count_ones() as u8)
            .unwrap_or(24);
        return Ok((ip, prefix));
    }
    bail!("interface {name:?} has no IPv4 address (set dhcp.server_ip or add an address)")
}

fn udp_socket(interface: &str, port: u16) -> Result<UdpSocket> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("creating udp socket")?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).context("setting SO_REUSEADDR")?;
    setsockopt(&fd, sockopt::ReusePort, &true).context("setting SO_REUSEPORT")?;
    setsockopt(&fd, sockopt::Broadcast, &true).context("setting SO_BROADCAST")?;
    setsockopt(
        &fd,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(interface),
    )
    .with_context(|| format!("binding to interface {interface} (SO_BINDTODEVICE)"))?;
    // Room for a boot storm's burst while a batch is being committed.
    let _ = crate::net::raise_rcvbuf(&fd, 8 << 20);
    let _ = setsockopt(&fd, sockopt::SndBuf, &(4 << 20));
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(0, 0, 0, 0, port),
    )
    .with_context(|| format!("binding udp port {port} on {interface}"))?;
    let std_sock = std::net::UdpSocket::from(fd);
    UdpSocket::from_std(std_sock).context("registering udp socket")
}

/// Per-MAC token bucket: `rate` packets/s, burst `2 × rate`.
struct RateLimiter {
    rate: f64,
    buckets: HashMap<Mac, (f64, Instant)>,
    /// When idle buckets were last swept out.
    swept: Instant,
}

impl RateLimiter {
    /// Buckets kept before idle ones (10 s without a packet) are swept out.
    const MAX_BUCKETS: usize = 200_000;

    fn new(rate: f64, now: Instant) -> RateLimiter {
        RateLimiter {
            rate,
            buckets: HashMap::new(),
            swept: now,
        }
    }

    fn allow(&mut self, mac: Mac, now: Instant) -> bool {
        let burst = self.rate * 2.0;
        // At most one sweep per second: under a flood of fresh MACs every bucket is
        // recent and a sweep frees nothing, so sweeping per packet would scan the whole
        // map for each one.
        if self.buckets.len() > Self::MAX_BUCKETS
            && now.duration_since(self.swept) >= Duration::from_secs(1)
        {
            self.swept = now;
            self.buckets
                .retain(|_, (_, t)| now.duration_since(*t) < Duration::from_secs(10));
        }
        let (tokens, last) = self.buckets.entry(mac).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Packet {
    data: Vec<u8>,
    src: SocketAddrV4,
    port: u16,
}

fn v4(a: SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    }
}

struct Sockets<'a> {
    s67: &'a UdpSocket,
    s4011: Option<&'a UdpSocket>,
}

impl Sockets<'_> {
    /// Send a reply from the port its request arrived on; count it.
    async fn send(&self, r: &Reply, port: u16, metrics: &Metrics) {
        let Some((bytes, left_out)) = self::core::encode_reply(r) else {
            metrics.drop(DropReason::SendFailed);
            return;
        };
        if left_out > 0 {
            tracing::warn!(left_out, max_len = r.max_len, dest = %r.dest, "dhcp reply options did not fit the client's size limit");
        }
        let sock = if port == PXE_PORT {
            self.s4011.unwrap_or(self.s67)
        } else {
            self.s67
        };
        match sock.send_to(&bytes, SocketAddr::V4(r.dest)).await {
            Ok(_) => match r.kind {
                ReplyKind::Offer => metrics.offers.inc(),
                ReplyKind::Ack => metrics.acks.inc(),
                ReplyKind::Nak => metrics.naks.inc(),
                ReplyKind::Inform => metrics.informs.inc(),
                ReplyKind::ProxyOffer | ReplyKind::ProxyAck => metrics.proxy_replies.inc(),
            },
            Err(e) => {
                tracing::debug!(error = %e, dest = %r.dest, "dhcp send failed");
                metrics.drop(DropReason::SendFailed);
                0
            }
        };
    }
}

/// Opens the lease log at `log_path` and loads its unexpired leases into `server`'s
/// table and `index`; returns the log and how many leases it held.
fn load_leases(
    log_path: &Path,
    server: &mut Server,
    index: &LeaseIndex,
) -> Result<(LeaseLog, usize)> {
    let (log, leases) = LeaseLog::open(log_path, unix_now(), 7 * 86_400)?;
    let loaded: Vec<leases::Change> = leases.iter().cloned().map(leases::Change::Put).collect();
    for l in leases {
        server.table.load(l);
    }
    index.apply(&loaded);
    Ok((log, loaded.len()))
}

/// Adds the datagrams already queued on the sockets to `batch`, up to `max_batch`.
fn drain_queued(sockets: &Sockets<'_>, batch: &mut Vec<Packet>, max_batch: usize, buf: &mut [u8]) {
    for (sock, port) in [(Some(sockets.s67), SERVER_PORT), (sockets.s4011, PXE_PORT)] {
        let Some(sock) = sock else { continue };
        while batch.len() < max_batch {
            match sock.try_recv_from(buf) {
                Ok((n, a)) => queue_datagram(&buf[..n], a, port, batch),
                Err(_) => break,
            }
        }
    }
}

/// Refreshes the pool utilisation gauges (a scan of the lease table).
fn set_pool_gauges(server: &Server, metrics: &Metrics) {
    for (net, used, size) in server.table.utilisation(unix_now()) {
        let l = metrics::SubnetLabels {
            subnet: net.to_string(),
        };
        metrics.pool_used.get_or_create(&l).set(used as i64);
        metrics.pool_size.get_or_create(&l).set(size as i64);
    }
}

/// One datagram read (or a failed read) on `port`: queued on `batch` as a packet.
async fn received(
    r: std::io::Result<(usize, SocketAddr)>,
    buf: &[u8],
    port: u16,
    batch: &mut Vec<Packet>,
) {
    match r {
        Ok((n, a)) => queue_datagram(&buf[..n], a, port, batch),
        Err(e) => {
            tracing::warn!(error = %e, "dhcp receive failed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A datagram from an IPv4 source, queued on `batch` (others are ignored).
fn queue_datagram(data: &[u8], from: SocketAddr, port: u16, batch: &mut Vec<Packet>) {
    if let Some(src) = v4(from) {
        batch.push(Packet {
            data: data.to_vec(),
            src,
            port,
        });
    }
}

/// `r` carries another server's identifier: sent on a dead member's behalf.
fn stood_in(r: &Reply, server_ip: Ipv4Addr) -> bool {
    use dhcproto::v4::{DhcpOption, OptionCode};
    matches!(r.msg.opts().get(OptionCode::ServerIdentifier),
        Some(DhcpOption::ServerIdentifier(s)) if *s != server_ip)
}

/// One request through the rate limit, the decoder and the server at `now` (the batch's
/// clock readings): the reply to send and the port to send it from, if any (drops and
/// silences are counted here).
fn handle_packet(
    server: &mut Server,
    limiter: &mut RateLimiter,
    reporter: &mut Reporter,
    metrics: &Metrics,
    p: Packet,
    (now_unix, now_i): (u64, Instant),
) -> Option<(Reply, u16)> {
    metrics.received.inc();
    if p.data.len() >= 34 {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&p.data[28..34]);
        if !limiter.allow(mac, now_i) {
            metrics.drop(DropReason::RateLimited);
            return None;
        }
    }
    let Some(msg) = self::core::decode(&p.data) else {
        metrics.drop(DropReason::Malformed);
        return None;
    };
    let meta = Meta {
        now: now_unix,
        src: p.src,
        local_port: p.port,
    };
    match server.handle(&msg, &meta) {
        Outcome::Reply(r) => {
            if r.kind == ReplyKind::Ack {
                reporter.acked(&msg, &r);
            }
            if matches!(r.kind, ReplyKind::Ack | ReplyKind::Nak) && stood_in(&r, server.server_ip) {
                metrics.cluster_stand_ins.inc();
            }
            return Some((r, p.port));
        }
        Outcome::Silent => match msg.opts().msg_type() {
            Some(dhcproto::v4::MessageType::Release) => {
                metrics.releases.inc();
            }
            Some(dhcproto::v4::MessageType::Decline) => {
                metrics.declines.inc();
            }
            _ => {}
        },
        Outcome::Drop(reason) => metrics.drop(reason),
    }
    None
}

/// Lease changes on their way to the ledger, and the ACKs that wait for them.
struct Pipeline {
    ledger: Ledger,
    /// Changes and the ACKs that wait for them, not yet handed to the ledger.
    journal: Vec<leases::Change>,
    acks: Vec<(Reply, u16)>,
    /// The commit running (at most one) and the ACKs it releases.
    inflight: Option<tokio::task::JoinHandle<Done>>,
    inflight_acks: Vec<(Reply, u16)>,
    /// Group-commit window: when the last commit started.
    window: Duration,
    last_commit: Instant,
    max_batch: usize,
}

impl Pipeline {
    fn new(ledger: Ledger, window: Duration, max_batch: usize) -> Pipeline {
        Pipeline {
            ledger,
            journal: Vec::new(),
            acks: Vec::new(),
            inflight: None,
            inflight_acks: Vec::new(),
            window,
            last_commit: Instant::now()
                .checked_sub(window)
                .unwrap_or_else(Instant::now),
            max_batch,
        }
    }

    /// ACKs waiting for a commit.
    fn waiting(&self) -> usize {
        self.acks.len() + self.inflight_acks.len()
    }

    /// A reply of the batch: an ACK waits for its lease to be durable, an OFFER is not
    /// made while new leases cannot be granted, everything else leaves now.
    async fn reply(&mut self, r: Reply, port: u16, sockets: &Sockets<'_>, metrics: &Metrics) {
        match r.kind {
            ReplyKind::Ack => self.acks.push((r, port)),
            ReplyKind::Offer if !self.ledger.available() => {
                metrics.drop(DropReason::LedgerUnavailable)
            }
            _ => sockets.send(&r, port, metrics).await,
        }
    }

    /// The batch's lease changes join the next commit.
    fn queue(&mut self, changes: Vec<leases::Change>) {
        self.ledger.queued(&changes);
        self.journal.extend(changes);
    }

    /// Start the group commit when the window allows (ACKs with nothing to commit leave
    /// at once); otherwise, when the window ends (for the timer), if anything waits.
    async fn step(
        &mut self,
        reporter: &mut Reporter,
        metrics: &Metrics,
        sockets: &Sockets<'_>,
    ) -> Option<Instant> {
        if self.inflight.is_some() {
            return None;
        }
        if self.journal.is_empty() {
            reporter.flush(metrics);
            for (r, port) in self.acks.drain(..) {
                sockets.send(&r, port, metrics).await;
            }
            return None;
        }
        let now = Instant::now();
        let due = self.last_commit + self.window;
        if now < due && self.acks.len() < self.max_batch {
            return Some(due);
        }
        if self.ledger.can_begin() {
            let journal = std::mem::take(&mut self.journal);
            self.inflight_acks = std::mem::take(&mut self.acks);
            reporter.committing();
            self.inflight = Some(self.ledger.begin(journal));
            self.last_commit = now;
        }
        None
    }

    /// The commit in flight ended: settle it with the ledger, then send (or replace, or
    /// drop) each ACK it released and report the grants that became durable.
    async fn settle(&mut self, done: Done, ctx: &mut Ctx<'_, '_>) {
        let acks = std::mem::take(&mut self.inflight_acks);
        let settled = self
            .ledger
            .finish(done, &mut ctx.server.table, ctx.index, ctx.metrics);
        let (verdicts, granted) = self.ledger.verdicts(&settled, &acks, unix_now());
        ctx.reporter
            .committed(|g| granted.contains(g.ip, g.mac), ctx.metrics);
        for ((mut r, port), v) in acks.into_iter().zip(verdicts) {
            match v {
                Verdict::Send => {}
                Verdict::Renewal(secs) => {
                    let t = match r.msg.opts().get(dhcproto::v4::OptionCode::AddressLeaseTime) {
                        Some(dhcproto::v4::DhcpOption::AddressLeaseTime(t)) => *t,
                        _ => secs,
                    };
                    self::core::shorten_lease(&mut r, secs.min(t));
                    ctx.metrics.cluster_degraded_acks.inc();
                }
                Verdict::Nak => {
                    r = ctx.server.nak_for(&r);
                    ctx.metrics.cluster_conflicts.inc();
                }
                Verdict::Drop => {
                    ctx.metrics.drop(DropReason::PersistFailed);
                    continue;
                }
            }
            ctx.sockets.send(&r, port, ctx.metrics).await;
        }
    }
}

/// What settling a commit touches besides the pipeline.
struct Ctx<'s, 'a> {
    server: &'s mut Server,
    index: &'s LeaseIndex,
    reporter: &'s mut Reporter,
    metrics: &'s Metrics,
    sockets: &'s Sockets<'a>,
}

/// The commit in flight, awaited.
async fn inflight_done(h: &mut Option<tokio::task::JoinHandle<Done>>) -> Result<Done> {
    h.as_mut()
        .expect("guarded")
        .await
        .context("lease writer panicked")
}

/// The ledger of a scope, with its leases loaded into `server`'s table and `index`:
/// the lease log at `log_path`, or (`shared`) etcd's listing of the scope, waited for
/// (`None`: shutdown came first). Also how many leases were loaded.
async fn open_ledger(
    log_path: PathBuf,
    shared: Option<Shared>,
    server: &mut Server,
    (index, metrics): (&LeaseIndex, &Metrics),
    shutdown: &mut Shutdown,
) -> Result<Option<(Ledger, usize)>> {
    let Some(sh) = shared else {
        let (log, loaded) = load_leases(&log_path, server, index)?;
        let ledger = Ledger::Log {
            log: Some(log),
            path: log_path,
        };
        return Ok(Some((ledger, loaded)));
    };
    #[cfg(not(feature = "etcd"))]
    {
        let _ = (sh, metrics, shutdown);
        bail!("dhcp leases shared through etcd: this bootplane was built without the etcd feature");
    }
    #[cfg(feature = "etcd")]
    {
        server.table.share(cluster::SKEW_MARGIN_SECS);
        let started = cluster::Ledger::start(&sh.etcd, &sh.scope, metrics, shutdown).await?;
        let Some((mut c, first)) = started else {
            return Ok(None);
        };
        c.observe(first, &mut server.table, index);
        let loaded = server.table.persisted().count();
        Ok(Some((Ledger::Cluster(Box::new(c)), loaded)))
    }
}

/// With leases shared in etcd: this appliance registered as a member of the scope and
/// the members listed into `server` ([`members`]); the receiver of later views. `None`
/// when the scope is not shared, or shutdown came first (`shutdown` says which).
async fn join_members(
    shared: Option<Shared>,
    server: &mut Server,
    metrics: &Metrics,
    shutdown: &mut Shutdown,
) -> Result<Option<tokio::sync::watch::Receiver<members::View>>> {
    let Some(sh) = shared else {
        return Ok(None);
    };
    #[cfg(not(feature = "etcd"))]
    {
        let _ = (sh, server, metrics, shutdown);
        Ok(None)
    }
    #[cfg(feature = "etcd")]
    {
        let me = members::etcd::Me {
            name: sh.etcd.member_name(),
            ip: server.server_ip,
            ttl: server.settings.member_ttl,
        };
        let Some(mut rx) = members::etcd::start(&sh.etcd, &sh.scope, me, shutdown).await? else {
            return Ok(None);
        };
        let view = rx.borrow_and_update().clone();
        tracing::info!(scope = %sh.scope, live = ?view.live().collect::<Vec<_>>(), "dhcp members listed");
        metrics.cluster_members.set(view.live().count() as i64);
        server.set_members(view);
        Ok(Some(rx))
    }
}

/// A new view of the members (`changed`: the watch's news) applied to `server`.
fn members_changed(
    changed: std::result::Result<(), tokio::sync::watch::error::RecvError>,
    members: &mut Option<tokio::sync::watch::Receiver<members::View>>,
    server: &mut Server,
    metrics: &Metrics,
) {
    match changed {
        Ok(()) => {
            if let Some(rx) = members.as_mut() {
                let view = rx.borrow_and_update().clone();
                metrics.cluster_members.set(view.live().count() as i64);
                server.set_members(view);
            }
        }
        // The follower stopped (shutdown): keep the last view.
        Err(_) => *members = None,
    }
}

/// A change of the reservations (`changed`: the watch's news) applied to `server`.
fn reservations_changed(
    changed: std::result::Result<(), tokio::sync::watch::error::RecvError>,
    reservations: &mut Option<tokio::sync::watch::Receiver<Vec<Reservation>>>,
    server: &mut Server,
) {
    match changed {
        Ok(()) => {
            let list = reservations
                .as_mut()
                .map(|rx| rx.borrow_and_update().clone())
                .unwrap_or_default();
            tracing::info!(count = list.len(), "dhcp reservations applied");
            server.set_reservations(list);
        }
        // The watch ended (shutdown): keep the last list.
        Err(_) => *reservations = None,
    }
}

/// Bind the sockets, load the leases (`<state_dir>/dhcp-leases.log`), and serve until
/// shutdown, counting into `metrics`, publishing leases to `index` (the rest of the
/// appliance reads it), with the static reservations kept current by `reservations`
/// ([`reservations::start`]; `None` = the settings' own only).
pub async fn run(
    settings: DhcpSettings,
    state_dir: &Path,
    metrics: Metrics,
    index: LeaseIndex,
    reservations: Option<tokio::sync::watch::Receiver<Vec<Reservation>>>,
    shutdown: Shutdown,
) -> Result<()> {
    let log_path = state_dir.join(LEASE_FILE);
    let scope = Scope {
        log_path,
        grants: None,
        shared: None,
        machine_scripts: None,
    };
    run_scope(settings, scope, metrics, index, reservations, shutdown).await
}

/// Leases shared with other appliances through etcd ([`cluster`]) instead of the lease log.
#[derive(Debug, Clone)]
pub struct Shared {
    pub etcd: crate::store::settings::EtcdConfig,
    /// The scope's name in the keys: `boot` (`[dhcp]`), `management` (`[discovery.dhcp]`).
    pub scope: String,
}

/// What sets one DHCP instance apart from another on the same host: its lease log (or
/// its leases in etcd, `shared`), who hears of its granted leases ([`grants`];
/// after they are durable), and the per-machine script tokens its iPXE clients get.
pub struct Scope {
    pub log_path: PathBuf,
    pub grants: Option<tokio::sync::mpsc::Sender<Grant>>,
    pub shared: Option<Shared>,
    pub machine_scripts: Option<MachineScripts>,
}

/// [`run`] with the lease log and grant reports of `scope` (the management scope runs
/// a second instance on its own interface, see `crate::controller::discovery`).
pub async fn run_scope(
    settings: DhcpSettings,
    scope: Scope,
    metrics: Metrics,
    index: LeaseIndex,
    mut reservations: Option<tokio::sync::watch::Receiver<Vec<Reservation>>>,
    mut shutdown: Shutdown,
) -> Result<()> {
    let iface = settings.interface.clone();
    if iface.is_empty() {
        bail!("dhcp needs an interface (dhcp.interface or --dhcp-interface)");
    }
    let server_ip = settings
        .server_ip
        .map_or_else(|| interface_ipv4(&iface).map(|a| a.0), Ok)?;
    let (max_batch, commit_window) = (settings.max_batch, settings.commit_window);
    metrics.init_drop_reasons();
    let (rate, mode) = (f64::from(settings.rate_limit_per_mac), settings.mode);
    let mut server = Server::new(settings, server_ip);
    if let Some(m) = scope.machine_scripts {
        server = server.with_machine_scripts(m);
    }
    if let Some(rx) = reservations.as_mut() {
        server.set_reservations(rx.borrow_and_update().clone());
    }
    let mut reporter = Reporter::new(scope.grants);
    let held = match &scope.shared {
        Some(s) => format!("etcd {}dhcp/{}/", s.etcd.prefix, s.scope),
        None => scope.log_path.display().to_string(),
    };
    let m = (&index, &metrics);
    let shared = scope.shared.clone();
    let opened = open_ledger(scope.log_path, scope.shared, &mut server, m, &mut shutdown).await?;
    let Some((ledger, loaded)) = opened else {
        return Ok(());
    };
    let mut members = join_members(shared, &mut server, &metrics, &mut shutdown).await?;
    if shutdown.is_shutdown() {
        return Ok(());
    }

    let s67 = udp_socket(&iface, SERVER_PORT)?;
    let s4011 = if mode == DhcpMode::Proxy {
        Some(udp_socket(&iface, PXE_PORT)?)
    } else {
        None
    };
    tracing::info!(interface = %iface, %server_ip, ?mode, leases = loaded, log = %held, "dhcp server listening");

    let mut limiter = RateLimiter::new(rate, Instant::now());
    let (mut buf, mut buf2) = (vec![0u8; 2048], vec![0u8; 2048]);
    // Pool utilisation gauges: refreshed on a timer, not per packet (a scan of the table).
    let mut gauge_tick = tokio::time::interval(Duration::from_secs(1));
    gauge_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch: Vec<Packet> = Vec::with_capacity(max_batch);
    // Bound on in-flight work: stop reading while this many ACKs wait for a commit.
    let max_waiting = (max_batch * 4).max(4096);
    let sockets = Sockets {
        s67: &s67,
        s4011: s4011.as_ref(),
    };
    let mut p = Pipeline::new(ledger, commit_window, max_batch);
    // The group-commit window's timer.
    let commit_timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(commit_timer);
    let mut timer_armed = false;

    loop {
        batch.clear();
        let reading = p.waiting() < max_waiting;
        tokio::select! {
            _ = shutdown.recv() => break,
            // The window is over: the group commit below starts.
            _ = &mut commit_timer, if timer_armed => timer_armed = false,
            _ = gauge_tick.tick() => set_pool_gauges(&server, &metrics),
            changed = async {
                match reservations.as_mut() {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            } => reservations_changed(changed, &mut reservations, &mut server),
            changed = async {
                match members.as_mut() {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            } => members_changed(changed, &mut members, &mut server, &metrics),
            done = inflight_done(&mut p.inflight), if p.inflight.is_some() => {
                p.inflight = None;
                let (server, index, reporter, metrics) = (&mut server, &index, &mut reporter, &metrics);
                p.settle(done?, &mut Ctx { server, index, reporter, metrics, sockets: &sockets }).await;
            }
            msg = p.ledger.next_mirror() => p.ledger.observe(msg, &mut server.table, &index),
            r = s67.recv_from(&mut buf), if reading => received(r, &buf, SERVER_PORT, &mut batch).await,
            r = async {
                match &s4011 {
                    Some(s) => s.recv_from(&mut buf2).await,
                    None => std::future::pending().await,
                }
            }, if reading => received(r, &buf2, PXE_PORT, &mut batch).await,
        }

        if !batch.is_empty() {
            drain_queued(&sockets, &mut batch, max_batch, &mut buf);
            let now = (unix_now(), Instant::now());
            for pk in batch.drain(..) {
                let reply =
                    handle_packet(&mut server, &mut limiter, &mut reporter, &metrics, pk, now);
                if let Some((r, port)) = reply {
                    p.reply(r, port, &sockets, &metrics).await;
                }
            }
            p.queue(server.table.take_journal());
        }

        // Group commit: everything that accumulated while the previous one ran.
        if let Some(due) = p.step(&mut reporter, &metrics, &sockets).await {
            if !timer_armed {
                commit_timer.as_mut().reset(due.into());
                timer_armed = true;
            }
        }
    }
    // At shutdown: wait (up to 5 s) for the commit in flight and send what it releases,
    // so those ACKs are not lost without a trace.
    if let Some(h) = p.inflight.take() {
        if let Ok(Ok(done)) = tokio::time::timeout(Duration::from_secs(5), h).await {
            let (server, index, reporter, metrics) = (&mut server, &index, &mut reporter, &metrics);
            p.settle(
                done,
                &mut Ctx {
                    server,
                    index,
                    reporter,
                    metrics,
                    sockets: &sockets,
                },
            )
            .await;
        }
    }
    tracing::info!("dhcp server stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u32) -> Mac {
        let b = i.to_be_bytes();
        [2, 0, b[0], b[1], b[2], b[3]]
    }

    #[test]
    fn rate_limiter_limits_per_mac_and_sweeps_idle_buckets_at_most_once_a_second() {
        let t0 = Instant::now();
        let mut l = RateLimiter::new(1.0, t0);
        // burst 2, then dropped; another MAC is unaffected
        assert!(l.allow(mac(0), t0));
        assert!(l.allow(mac(0), t0));
        assert!(!l.allow(mac(0), t0));
        assert!(l.allow(mac(1), t0));
        for i in 2..=RateLimiter::MAX_BUCKETS as u32 {
            l.allow(mac(i), t0);
        }
        assert_eq!(l.buckets.len(), RateLimiter::MAX_BUCKETS + 1);
        // over the cap, but all recent and the last sweep was under a second ago: kept
        let t1 = t0 + Duration::from_millis(500);
        assert!(l.allow(mac(u32::MAX), t1));
        assert_eq!(l.buckets.len(), RateLimiter::MAX_BUCKETS + 2);
        // 10.2 s on: the buckets idle since t0 go; t1's (9.7 s) and the packet's own stay
        let t2 = t0 + Duration::from_millis(10_200);
        assert!(l.allow(mac(7), t2));
        assert_eq!(l.buckets.len(), 2);
    }
}
