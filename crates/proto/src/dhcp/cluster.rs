//! DHCP across appliances: several appliances answer one segment from one pool, and
//! etcd decides who gets an address (`[store] backend = "etcd"`).
//!
//! Each address is a key, `{prefix}dhcp/{scope}/{ip}` (scope `boot` for `[dhcp]`,
//! `management` for `[discovery.dhcp]`), whose value is the lease as compact JSON:
//! `{"mac","expires","state","hostname","appliance"}`. A lease is granted only by a
//! compare-and-swap on that key: the Txn compares the key's mod revision with the one
//! this appliance last saw, and writes only if the record it saw may be replaced
//! ([`may_replace`]: no record, the same MAC, or a lease that ended `SKEW_MARGIN_SECS`
//! ago or was released). When the compare fails, the same Txn reads the key back and
//! the decision is made again on what is really there (at most `CAS_ROUNDS` rounds).
//! So two appliances can never both hold a record giving one address to two MACs, and
//! an ACK leaves only after its Txn succeeded (etcd's commit is a quorum's fsync, so
//! "never ACK before the lease is durable" holds). A lease that lost becomes a NAK (the
//! client starts over with DISCOVER) and the table learns the winner.
//!
//! Every appliance mirrors the scope: it lists the prefix, watches it from the
//! listing's revision, and lists again when the watch is compacted away or breaks
//! ([`MirrorMsg`]). The mirror keeps the table's view of other appliances' leases
//! current ([`LeaseTable::learn`]), so OFFERs avoid addresses held elsewhere, a client
//! renewing or rebinding through another appliance is ACKed, and the [`LeaseIndex`]
//! (the boot listener's identity check, `bootplane get leases`) shows every lease of
//! the cluster. The mirror also remembers each key's mod revision: the Txn's compare.
//!
//! While etcd cannot be reached (a Txn fails or times out after
//! `store.etcd.request_timeout_ms`, or the watch broke and the list fails): no new
//! address is granted (no OFFER is sent, a REQUEST for a new lease gets no answer, so
//! the client keeps retrying), and a client renewing or rebinding an address the mirror
//! shows bound to its MAC is ACKed for the time that lease has left (at least
//! `MIN_DEGRADED_SECS`), never longer: no appliance can give that address away before
//! then, so nothing is promised that etcd did not already grant. When etcd answers
//! again everything resumes; nothing is queued meanwhile.
//!
//! Why a CAS per address and not split scopes with failover (ISC failover, Kea's HA
//! hook): Kea HA runs two active servers (plus backups) that send each other lease
//! updates and wait for them before answering; its load-balancing mode needs the pools
//! split by hand between the two (client classes), and a server uses its partner's part
//! only once it has declared the partner down. bootplane's appliances share etcd
//! already (the object store, elections), so the lease state is shared without a
//! partner protocol: any number of appliances are active, no pool is split or
//! rebalanced, there is no partner-down state to detect or get wrong, and any appliance
//! renews any lease. The price is one etcd round trip per granted lease (the ACK
//! already waits for a group commit) and that new leases need an etcd quorum, which
//! provisioning needs anyway (claims and boot configurations are written there). Kea's
//! shared-lease-database setup resolves conflicts the same way (the database's unique
//! address rejects the second insert). Two appliances offering to two clients at once
//! would pick the same lowest free address and collide on nearly every pair; shared
//! tables search from a point the client's MAC hashes to ([`LeaseTable::share`]).
//!
//! Bounds: one commit in flight per scope (the loop's), at most `TXN_CONCURRENCY`
//! Txns of it at once, each bounded by `request_timeout_ms`; at most `MIRROR_QUEUE`
//! mirror messages wait for the loop (the watch reader waits, then etcd buffers or
//! cancels the watch, which is re-listed); the mirror keeps one entry per address of
//! the configured subnets.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, KvClient, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use futures::StreamExt as _;
use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::core::Reply;
use super::leases::{
    holds, may_replace, Change, Lease, LeaseIndex, LeaseState, LeaseTable, Verdict,
};
use super::metrics::Metrics;
use crate::model::ident::{parse_mac, Mac, MacFmt};
use crate::shutdown::Shutdown;
use crate::store::settings::EtcdConfig;
use crate::sys::unix_now;

/// Seconds another MAC's lease keeps its address past its expiry: room for the
/// appliances' clocks to disagree (they decide expiry each by their own clock).
pub const SKEW_MARGIN_SECS: u64 = 5;
/// Most lease Txns of one commit in flight at once.
pub(crate) const TXN_CONCURRENCY: usize = 64;
/// Compare-and-swap rounds per lease; each failed compare reads the key back.
const CAS_ROUNDS: usize = 4;
/// Mirror messages waiting for the DHCP loop.
const MIRROR_QUEUE: usize = 16;
/// Keys per page of a listing.
const PAGE: i64 = 1000;
/// Least time a renewal granted from the mirror while etcd is unreachable carries.
pub(crate) const MIN_DEGRADED_SECS: u64 = 10;

/// A lease as stored in etcd.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    mac: String,
    expires: u64,
    state: LeaseState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hostname: Option<String>,
    appliance: String,
}

fn encode(l: &Lease, appliance: &str) -> String {
    let r = Record {
        mac: MacFmt(&l.mac).to_string(),
        expires: l.expires,
        state: l.state,
        hostname: l.hostname.clone(),
        appliance: appliance.to_string(),
    };
    serde_json::to_string(&r).expect("a record serializes")
}

fn decode(ip: Ipv4Addr, value: &[u8]) -> Option<Lease> {
    let r: Record = serde_json::from_slice(value).ok()?;
    if r.state == LeaseState::Offered {
        return None;
    }
    Some(Lease {
        ip,
        mac: parse_mac(&r.mac).ok()?,
        // As the core takes it from option 12: at most 63 characters.
        hostname: r.hostname.map(|h| h.chars().take(63).collect()),
        expires: r.expires,
        state: r.state,
    })
}

/// What this appliance knows of one address key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// The revision of the last put or delete of the key seen (orders what is learned).
    pub rev: i64,
    /// Whether the key exists (a record that does not parse exists without a lease).
    pub exists: bool,
    pub lease: Option<Lease>,
}

impl Known {
    /// The mod revision a compare-and-swap expects (0: the key is absent).
    fn cas_rev(&self) -> i64 {
        if self.exists {
            self.rev
        } else {
            0
        }
    }
}

/// The scope's keys: `{prefix}dhcp/{scope}/{ip}`.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(etcd_prefix: &str, scope: &str) -> Keys {
        Keys {
            prefix: format!("{etcd_prefix}dhcp/{scope}/"),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn key(&self, ip: Ipv4Addr) -> String {
        format!("{}{ip}", self.prefix)
    }

    fn ip(&self, key: &[u8]) -> Option<Ipv4Addr> {
        std::str::from_utf8(key.strip_prefix(self.prefix.as_bytes())?)
            .ok()?
            .parse()
            .ok()
    }

    /// A key-value pair read or put: its address and what it says.
    fn known(&self, kv: &KeyValue) -> Option<(Ipv4Addr, Known)> {
        let ip = self.ip(kv.key())?;
        let lease = decode(ip, kv.value());
        if lease.is_none() {
            tracing::warn!(key = %String::from_utf8_lossy(kv.key()), "dhcp lease record in etcd does not parse; its address may be taken over");
        }
        let rev = kv.mod_revision();
        Some((
            ip,
            Known {
                rev,
                exists: true,
                lease,
            },
        ))
    }
}

/// How one address's change ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The change is what etcd holds now.
    Written(Known),
    /// etcd holds something else, which may not be replaced (another MAC's lease), or the
    /// key kept changing for `CAS_ROUNDS` rounds: this is what was read last.
    Lost(Known),
    /// etcd did not answer in time (unreachable, no leader, timeout).
    Failed,
}

/// One address to write: the last change the journal made to it and what was known.
#[derive(Debug, Clone)]
pub struct Intent {
    pub ip: Ipv4Addr,
    /// The record wanted; `None`: delete the one known (a forgotten lease).
    pub want: Option<Lease>,
    pub known: Known,
}

/// A commit's Txns, run off the DHCP loop ([`Writer::write`]).
#[derive(Clone)]
pub struct Writer {
    kv: KvClient,
    keys: Keys,
    appliance: Arc<str>,
    timeout: Duration,
}

impl Writer {
    pub fn new(client: &Client, keys: Keys, appliance: &str, timeout: Duration) -> Writer {
        Writer {
            kv: client.kv_client(),
            keys,
            appliance: appliance.into(),
            timeout,
        }
    }

    /// Every intent's Txn, `TXN_CONCURRENCY` at once, all within one request timeout
    /// (so an unreachable etcd fails a commit of thousands of leases in that time, not in
    /// one timeout per wave); outcomes in no particular order.
    pub async fn write(&self, intents: Vec<Intent>) -> Vec<(Ipv4Addr, Outcome)> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        futures::stream::iter(intents)
            .map(|it| async move { (it.ip, self.write_by(it, deadline).await) })
            .buffer_unordered(TXN_CONCURRENCY)
            .collect()
            .await
    }

    /// [`Writer::write`] of one intent.
    pub async fn write_one(&self, it: Intent) -> Outcome {
        self.write_by(it, tokio::time::Instant::now() + self.timeout)
            .await
    }

    /// Compare-and-swap one address by `deadline`: put `want` (or delete the known
    /// record) if the key is still at the revision known; if not, decide again on what
    /// the key holds.
    async fn write_by(&self, it: Intent, deadline: tokio::time::Instant) -> Outcome {
        let key = self.keys.key(it.ip);
        let mut cur = it.known;
        for _ in 0..CAS_ROUNDS {
            let op = match &it.want {
                Some(l) if !may_replace(cur.lease.as_ref(), l, unix_now(), SKEW_MARGIN_SECS) => {
                    return Outcome::Lost(cur)
                }
                Some(l) => TxnOp::put(key.clone(), encode(l, &self.appliance), None),
                None if !cur.exists => return Outcome::Written(cur),
                None => TxnOp::delete(key.clone(), None),
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    cur.cas_rev(),
                )])
                .and_then([op])
                .or_else([TxnOp::get(key.clone(), None)]);
            let mut kv = self.kv.clone();
            let resp = match tokio::time::timeout_at(deadline, kv.txn(txn)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, %key, "dhcp lease txn failed");
                    return Outcome::Failed;
                }
                Err(_) => return Outcome::Failed,
            };
            let rev = resp.header().map_or(0, |h| h.revision());
            if resp.succeeded() {
                return Outcome::Written(Known {
                    rev,
                    exists: it.want.is_some(),
                    lease: it.want.clone(),
                });
            }
            // The key moved on: what it holds now (absent: known as of this revision).
            cur = match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(g)) => match g.kvs().first() {
                    Some(kv) => self.keys.known(kv).map_or_else(Known::default, |k| k.1),
                    None => Known {
                        rev,
                        exists: false,
                        lease: None,
                    },
                },
                _ => return Outcome::Failed,
            };
            if it.want.is_none() {
                // A delete is only of the record that was known.
                return Outcome::Lost(cur);
            }
        }
        Outcome::Lost(cur)
    }
}

/// What the mirror task tells the loop.
#[derive(Debug)]
pub enum MirrorMsg {
    /// Every key of the scope at revision `rev` (a listing).
    Snapshot {
        rev: i64,
        records: Vec<(Ipv4Addr, Known)>,
    },
    /// Puts and deletes after the listing, in order.
    Events(Vec<(Ipv4Addr, Known)>),
    /// etcd could not be reached; the mirror is listing again.
    Down,
}

/// Every key under the scope's prefix, one consistent revision, in pages.
pub(crate) async fn list(kv: &mut KvClient, keys: &Keys, timeout: Duration) -> Result<MirrorMsg> {
    let prefix = keys.prefix().as_bytes().to_vec();
    let mut end = prefix.clone();
    *end.last_mut().expect("the prefix ends with '/'") += 1;
    let (mut from, mut rev, mut records) = (prefix, 0i64, Vec::new());
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let resp = tokio::time::timeout(timeout, kv.get(from.clone(), Some(opts)))
            .await
            .context("listing dhcp leases in etcd: timed out")??;
        if rev == 0 {
            rev = resp.header().map_or(0, |h| h.revision());
        }
        records.extend(resp.kvs().iter().filter_map(|kv| keys.known(kv)));
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok(MirrorMsg::Snapshot { rev, records })
}

/// How one list-then-watch ended without an error.
enum Ended {
    /// The loop is gone.
    Closed,
    /// The watch's revision was compacted away: list again.
    Compacted,
}

/// List, then watch from the listing's revision until the watch breaks.
async fn follow(
    client: &Client,
    keys: &Keys,
    tx: &mpsc::Sender<MirrorMsg>,
    timeout: Duration,
) -> Result<Ended> {
    let snapshot = list(&mut client.kv_client(), keys, timeout).await?;
    let MirrorMsg::Snapshot { rev, .. } = &snapshot else {
        unreachable!("list returns a snapshot")
    };
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(rev + 1)
        .with_progress_notify();
    if tx.send(snapshot).await.is_err() {
        return Ok(Ended::Closed);
    }
    let mut w = client.watch_client();
    let mut stream = tokio::time::timeout(timeout, w.watch(keys.prefix(), Some(opts)))
        .await
        .context("watching dhcp leases in etcd: timed out")??;
    loop {
        let Some(resp) = stream.message().await? else {
            bail!("the etcd watch ended");
        };
        if resp.compact_revision() > 0 {
            return Ok(Ended::Compacted);
        }
        if resp.canceled() {
            bail!("the etcd watch was canceled: {}", resp.cancel_reason());
        }
        let events: Vec<(Ipv4Addr, Known)> = resp
            .events()
            .iter()
            .filter_map(|e| {
                let kv = e.kv()?;
                match e.event_type() {
                    EventType::Put => keys.known(kv),
                    EventType::Delete => Some((
                        keys.ip(kv.key())?,
                        Known {
                            rev: kv.mod_revision(),
                            exists: false,
                            lease: None,
                        },
                    )),
                }
            })
            .collect();
        if !events.is_empty() && tx.send(MirrorMsg::Events(events)).await.is_err() {
            return Ok(Ended::Closed);
        }
    }
}

/// The mirror task: [`follow`] again and again (at once after a compaction, after a
/// growing pause up to 2 s after an error: a listing is cheap, and it is what tells the
/// loop that new leases can be granted again), until shutdown or the loop is gone.
pub async fn mirror(
    client: Client,
    keys: Keys,
    tx: mpsc::Sender<MirrorMsg>,
    timeout: Duration,
    relists: Counter,
    mut shutdown: Shutdown,
) {
    let mut pause = Duration::from_millis(100);
    loop {
        let r = tokio::select! {
            _ = shutdown.recv() => return,
            r = follow(&client, &keys, &tx, timeout) => r,
        };
        relists.inc();
        match r {
            Ok(Ended::Closed) => return,
            Ok(Ended::Compacted) => {
                tracing::info!(
                    prefix = keys.prefix(),
                    "dhcp lease watch compacted away; listing again"
                );
                pause = Duration::from_millis(100);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), prefix = keys.prefix(), "dhcp lease mirror lost etcd; retrying");
                if tx.send(MirrorMsg::Down).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            _ = shutdown.recv() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// The etcd ledger of one DHCP scope: the writer, the mirror's view of every address
/// key, and which addresses have changes of this appliance not yet settled.
pub struct Ledger {
    writer: Writer,
    known: HashMap<Ipv4Addr, Known>,
    rx: mpsc::Receiver<MirrorMsg>,
    /// Addresses with changes queued for the next commit, and in the commit running:
    /// the mirror does not overwrite the table's entry for those.
    pending: HashSet<Ipv4Addr>,
    inflight: HashSet<Ipv4Addr>,
    /// etcd answered the last request (a Txn, or the mirror's listing).
    available: bool,
}

impl Ledger {
    /// Connect, start the mirror task and wait (until shutdown) for its first listing.
    pub async fn start(
        cfg: &EtcdConfig,
        scope: &str,
        metrics: &Metrics,
        shutdown: &mut Shutdown,
    ) -> Result<Option<(Ledger, MirrorMsg)>> {
        let client = crate::store::etcd::client::connect(cfg).await?;
        let keys = Keys::new(&cfg.prefix, scope);
        let timeout = Duration::from_millis(cfg.request_timeout_ms);
        let writer = Writer::new(&client, keys.clone(), &cfg.member_name(), timeout);
        let (tx, mut rx) = mpsc::channel(MIRROR_QUEUE);
        tokio::spawn(mirror(
            client,
            keys.clone(),
            tx,
            timeout,
            metrics.cluster_relists.clone(),
            shutdown.child(),
        ));
        loop {
            let msg = tokio::select! {
                _ = shutdown.recv() => return Ok(None),
                m = rx.recv() => m.context("the dhcp lease mirror stopped")?,
            };
            match msg {
                MirrorMsg::Down => {
                    tracing::warn!(
                        prefix = keys.prefix(),
                        "dhcp waits for etcd before answering"
                    )
                }
                first => {
                    let ledger = Ledger {
                        writer,
                        known: HashMap::new(),
                        rx,
                        pending: HashSet::new(),
                        inflight: HashSet::new(),
                        available: true,
                    };
                    return Ok(Some((ledger, first)));
                }
            }
        }
    }

    pub fn available(&self) -> bool {
        self.available
    }

    /// The next message of the mirror (pending forever once it stopped).
    pub async fn next_mirror(&mut self) -> MirrorMsg {
        match self.rx.recv().await {
            Some(m) => m,
            None => std::future::pending().await,
        }
    }

    /// `changes` wait for the next commit.
    pub fn queued(&mut self, changes: &[Change]) {
        self.pending.extend(changes.iter().map(change_ip));
    }

    /// The intents of a commit of `journal` (its last change per address).
    pub fn begin(&mut self, journal: Vec<Change>) -> (Writer, Vec<Intent>) {
        let mut last: HashMap<Ipv4Addr, Option<Lease>> = HashMap::new();
        for c in journal {
            match c {
                Change::Put(l) => last.insert(l.ip, Some(l)),
                Change::Forget(ip) => last.insert(ip, None),
            };
        }
        self.inflight = std::mem::take(&mut self.pending);
        let intents = last
            .into_iter()
            .map(|(ip, want)| Intent {
                ip,
                want,
                known: self.known.get(&ip).cloned().unwrap_or_default(),
            })
            .collect();
        (self.writer.clone(), intents)
    }

    /// A commit ended: learn what etcd holds for each address, make the table and the
    /// index agree with it (addresses with newer changes queued aside), count.
    pub fn finish(
        &mut self,
        outcomes: Vec<(Ipv4Addr, Outcome)>,
        table: &mut LeaseTable,
        index: &LeaseIndex,
        metrics: &Metrics,
    ) -> HashMap<Ipv4Addr, Outcome> {
        self.inflight.clear();
        let now = unix_now();
        let (mut ok, mut failed) = (false, false);
        for (ip, o) in &outcomes {
            match o {
                Outcome::Written(k) | Outcome::Lost(k) => {
                    ok = true;
                    self.learn(*ip, k.clone());
                }
                Outcome::Failed => {
                    failed = true;
                    metrics.cluster_commit_failures.inc();
                }
            }
            self.sync(*ip, table, index, now);
        }
        if failed {
            self.available = false;
        } else if ok {
            self.available = true;
        }
        outcomes.into_iter().collect()
    }

    /// A message of the mirror: learn it, and make the table and index agree.
    pub fn observe(&mut self, msg: MirrorMsg, table: &mut LeaseTable, index: &LeaseIndex) {
        let now = unix_now();
        let mut changed = Vec::new();
        match msg {
            MirrorMsg::Down => {
                self.available = false;
                return;
            }
            MirrorMsg::Snapshot { rev, records } => {
                self.available = true;
                let listed: HashSet<Ipv4Addr> = records.iter().map(|r| r.0).collect();
                let gone: Vec<Ipv4Addr> = self
                    .known
                    .iter()
                    .filter(|(ip, k)| k.exists && k.rev <= rev && !listed.contains(ip))
                    .map(|(ip, _)| *ip)
                    .collect();
                for ip in gone {
                    let k = Known {
                        rev,
                        exists: false,
                        lease: None,
                    };
                    if self.learn(ip, k) {
                        changed.push(ip);
                    }
                }
                for (ip, k) in records {
                    if table.subnet_index_for(ip).is_some() && self.learn(ip, k) {
                        changed.push(ip);
                    }
                }
            }
            MirrorMsg::Events(events) => {
                for (ip, k) in events {
                    if table.subnet_index_for(ip).is_some() && self.learn(ip, k) {
                        changed.push(ip);
                    }
                }
            }
        }
        for ip in changed {
            self.sync(ip, table, index, now);
        }
    }

    /// Keep `k` for `ip` unless something newer is known; whether it was kept.
    fn learn(&mut self, ip: Ipv4Addr, k: Known) -> bool {
        match self.known.get(&ip) {
            Some(cur) if cur.rev > k.rev || *cur == k => false,
            _ => {
                self.known.insert(ip, k);
                true
            }
        }
    }

    /// The table's and the index's entry for `ip` become what etcd holds, unless this
    /// appliance has changes to it that are not settled yet.
    fn sync(&self, ip: Ipv4Addr, table: &mut LeaseTable, index: &LeaseIndex, now: u64) {
        if self.pending.contains(&ip) || self.inflight.contains(&ip) {
            return;
        }
        let lease = self.known.get(&ip).and_then(|k| k.lease.clone());
        match &lease {
            Some(l) => index.apply(&[Change::Put(l.clone())]),
            None => index.apply(&[Change::Forget(ip)]),
        }
        table.learn(ip, lease, now);
    }

    /// What becomes of `ack` (waiting for the commit whose outcomes these are) at `now`.
    pub fn verdict(&self, outcomes: &HashMap<Ipv4Addr, Outcome>, ack: &Reply, now: u64) -> Verdict {
        let Some(mac) = reply_mac(ack) else {
            return Verdict::Drop;
        };
        let ip = ack.msg.yiaddr();
        let bound_to_it = |l: &Lease| l.mac == mac && l.state == LeaseState::Bound;
        match outcomes.get(&ip) {
            Some(Outcome::Written(k)) if k.lease.as_ref().is_some_and(bound_to_it) => Verdict::Send,
            Some(Outcome::Lost(k))
                if k.lease
                    .as_ref()
                    .is_some_and(|l| l.mac != mac && holds(l, now, SKEW_MARGIN_SECS)) =>
            {
                Verdict::Nak
            }
            // Only a client using its address now (RENEWING, REBINDING: ciaddr set),
            // for what its lease has left.
            Some(Outcome::Failed) if ack.msg.ciaddr() == ip => {
                match self.known.get(&ip).and_then(|k| k.lease.as_ref()) {
                    Some(l) if bound_to_it(l) && l.expires >= now + MIN_DEGRADED_SECS => {
                        Verdict::Renewal(u32::try_from(l.expires - now).unwrap_or(u32::MAX))
                    }
                    _ => Verdict::Drop,
                }
            }
            _ => Verdict::Drop,
        }
    }

    /// The mirror's record for `ip` (tests, diagnostics).
    pub fn known(&self, ip: Ipv4Addr) -> Option<&Known> {
        self.known.get(&ip)
    }
}

fn change_ip(c: &Change) -> Ipv4Addr {
    match c {
        Change::Put(l) => l.ip,
        Change::Forget(ip) => *ip,
    }
}

/// The client MAC of a reply (chaddr, Ethernet).
pub(crate) fn reply_mac(r: &Reply) -> Option<Mac> {
    let c = r.msg.chaddr();
    let mut m = [0u8; 6];
    m.copy_from_slice(c.get(..6)?);
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_compact_json_and_read_back() {
        let l = Lease {
            ip: Ipv4Addr::new(10, 0, 0, 7),
            mac: [0x52, 0x54, 0, 0xab, 0xcd, 0xef],
            hostname: Some("node-7".into()),
            expires: 1_700_000_000,
            state: LeaseState::Bound,
        };
        let text = encode(&l, "bp-a");
        assert_eq!(
            text,
            r#"{"mac":"52:54:00:ab:cd:ef","expires":1700000000,"state":"bound","hostname":"node-7","appliance":"bp-a"}"#
        );
        assert_eq!(decode(l.ip, text.as_bytes()), Some(l.clone()));
        let released = Lease {
            hostname: None,
            state: LeaseState::Released,
            ..l
        };
        let text = encode(&released, "bp-b");
        assert!(!text.contains("hostname"), "{text}");
        assert_eq!(decode(released.ip, text.as_bytes()), Some(released));
        assert_eq!(decode(Ipv4Addr::LOCALHOST, b"{\"mac\":1}"), None);
    }

    #[test]
    fn keys_name_the_scope_and_the_address() {
        let k = Keys::new("/bootplane/", "boot");
        assert_eq!(
            k.key(Ipv4Addr::new(10, 1, 2, 3)),
            "/bootplane/dhcp/boot/10.1.2.3"
        );
        assert_eq!(
            k.ip(b"/bootplane/dhcp/boot/10.1.2.3"),
            Some(Ipv4Addr::new(10, 1, 2, 3))
        );
        assert_eq!(k.ip(b"/bootplane/dhcp/management/10.1.2.3"), None);
        assert_eq!(k.ip(b"/bootplane/dhcp/boot/x"), None);
    }
}
