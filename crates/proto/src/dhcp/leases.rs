//! Lease state: the authoritative lease table with address allocation (pure, no
//! I/O), the journal of changes the socket loop makes durable before it answers,
//! and [`LeaseIndex`], the cheap read-only view other services query (IP ↔ MAC).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::settings::{Reservation, Subnet};
use crate::model::ident::{Mac, MacFmt};

/// Lifecycle of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// Offered, not yet requested (memory only, never persisted).
    Offered,
    /// Acknowledged: the client owns it until `expires`.
    Bound,
    /// Released by the client (kept so the same client gets it back).
    Released,
    /// Declined (in use by someone else on the wire) until `expires`.
    Declined,
}

/// One lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub ip: Ipv4Addr,
    #[serde(serialize_with = "ser_mac")]
    pub mac: Mac,
    pub hostname: Option<String>,
    /// Unix seconds.
    pub expires: u64,
    pub state: LeaseState,
}

fn ser_mac<S: serde::Serializer>(m: &Mac, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&MacFmt(m))
}

impl Lease {
    /// Is this lease holding its address at `now`?
    pub fn active(&self, now: u64) -> bool {
        match self.state {
            LeaseState::Bound | LeaseState::Offered | LeaseState::Declined => self.expires > now,
            LeaseState::Released => false,
        }
    }
}

/// A change to persist (the journal). `Bound`/`Released`/`Declined` leases are
/// written; `Forget` drops an address from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put(Lease),
    Forget(Ipv4Addr),
}

/// Read-only lease view shared with the HTTP identity check and the API.
/// Clones share the same data; the DHCP loop publishes after each batch.
#[derive(Debug, Clone, Default)]
pub struct LeaseIndex {
    inner: Arc<RwLock<IndexInner>>,
}

#[derive(Debug, Default)]
struct IndexInner {
    by_ip: HashMap<Ipv4Addr, Lease>,
    by_mac: HashMap<Mac, Ipv4Addr>,
}

impl LeaseIndex {
    /// The bound lease for `ip` (expired leases included; check `expires`).
    pub fn by_ip(&self, ip: Ipv4Addr) -> Option<Lease> {
        self.inner.read().ok()?.by_ip.get(&ip).cloned()
    }

    pub fn by_mac(&self, mac: &Mac) -> Option<Lease> {
        let g = self.inner.read().ok()?;
        g.by_mac.get(mac).and_then(|ip| g.by_ip.get(ip)).cloned()
    }

    /// Every bound lease, sorted by address.
    pub fn all(&self) -> Vec<Lease> {
        let mut v: Vec<Lease> = match self.inner.read() {
            Ok(g) => g.by_ip.values().cloned().collect(),
            Err(_) => Vec::new(),
        };
        v.sort_by_key(|l| u32::from(l.ip));
        v
    }

    pub fn len(&self) -> usize {
        self.inner.read().map(|g| g.by_ip.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Apply persisted changes: the DHCP loop publishes its own once durable and the
    /// ledger's mirror other appliances' (nothing else writes an index in production).
    pub fn apply(&self, changes: &[Change]) {
        let Ok(mut g) = self.inner.write() else {
            return;
        };
        for c in changes {
            match c {
                Change::Put(l) if l.state == LeaseState::Bound => {
                    if let Some(old) = g.by_ip.insert(l.ip, l.clone()) {
                        if old.mac != l.mac && g.by_mac.get(&old.mac) == Some(&l.ip) {
                            g.by_mac.remove(&old.mac);
                        }
                    }
                    if let Some(prev_ip) = g.by_mac.insert(l.mac, l.ip) {
                        if prev_ip != l.ip {
                            g.by_ip.remove(&prev_ip);
                        }
                    }
                }
                Change::Put(l) => remove_ip(&mut g, l.ip),
                Change::Forget(ip) => remove_ip(&mut g, *ip),
            }
        }
    }
}

fn remove_ip(g: &mut IndexInner, ip: Ipv4Addr) {
    if let Some(old) = g.by_ip.remove(&ip) {
        if g.by_mac.get(&old.mac) == Some(&ip) {
            g.by_mac.remove(&old.mac);
        }
    }
}

/// Why no address could be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    NoSubnet,
    PoolExhausted,
}

/// The lease table for all subnets (owned by the DHCP loop).
#[derive(Debug)]
pub struct LeaseTable {
    subnets: Vec<Subnet>,
    /// Per subnet: dynamic addresses not present in `by_ip`.
    free: Vec<BTreeSet<u32>>,
    by_ip: HashMap<Ipv4Addr, Lease>,
    by_mac: HashMap<Mac, Ipv4Addr>,
    reservations: HashMap<Mac, Reservation>,
    reserved_ips: HashSet<Ipv4Addr>,
    journal: Vec<Change>,
    /// Shared with other appliances ([`LeaseTable::share`]): how long past its expiry
    /// another MAC's lease still holds its address (clock skew between appliances),
    /// and whether free addresses are searched from a point the MAC hashes to.
    shared: Option<u64>,
}

/// FNV-1a of a MAC: the same on every appliance (no per-process random state).
fn mac_hash(mac: &Mac) -> u32 {
    mac.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Does `l` still hold its address against other MACs at `now`, `margin` seconds of
/// clock skew allowed for (a released lease never does; an offer only until it ends)?
pub(crate) fn holds(l: &Lease, now: u64, margin: u64) -> bool {
    match l.state {
        LeaseState::Bound | LeaseState::Declined => l.expires.saturating_add(margin) > now,
        LeaseState::Offered => l.expires > now,
        LeaseState::Released => false,
    }
}

/// May `want` replace the durable record `cur` of its address at `now`? The rule every
/// appliance applies before its compare-and-swap ([`super::cluster`]): no record; the
/// same MAC (a declined address only by another decline); or a record that no longer
/// holds the address ([`holds`] with `margin`).
pub fn may_replace(cur: Option<&Lease>, want: &Lease, now: u64, margin: u64) -> bool {
    match cur {
        None => true,
        Some(c) if c.mac == want.mac => {
            c.state != LeaseState::Declined
                || want.state == LeaseState::Declined
                || !holds(c, now, margin)
        }
        Some(c) => !holds(c, now, margin),
    }
}

impl LeaseTable {
    pub fn new(subnets: Vec<Subnet>, reservations: Vec<Reservation>) -> LeaseTable {
        let mut t = LeaseTable {
            free: subnets.iter().map(|_| BTreeSet::new()).collect(),
            subnets,
            by_ip: HashMap::new(),
            by_mac: HashMap::new(),
            reservations: HashMap::new(),
            reserved_ips: HashSet::new(),
            journal: Vec::new(),
            shared: None,
        };
        t.set_reservations(reservations);
        t
    }

    /// The table is one of several appliances' views of the same addresses: another
    /// MAC's lease holds its address `margin_secs` past its expiry (clock skew), and
    /// the free address given to a MAC is the first at or after a point its hash picks
    /// in the pool, so two appliances offering to two clients at once rarely pick the
    /// same address (lowest-free-first would make every concurrent pair collide).
    pub fn share(&mut self, margin_secs: u64) {
        self.shared = Some(margin_secs);
    }

    fn margin(&self) -> u64 {
        self.shared.unwrap_or(0)
    }

    pub(crate) fn subnets(&self) -> &[Subnet] {
        &self.subnets
    }

    /// Replace the static reservations (config now; registered Servers' MACs later).
    /// Existing dynamic leases on newly reserved addresses keep running until they expire
    /// or are released; they are not renewed to anyone but the reserved MAC.
    pub(crate) fn set_reservations(&mut self, list: Vec<Reservation>) {
        self.reservations = list.iter().map(|r| (r.mac, r.clone())).collect();
        self.reserved_ips = list.iter().map(|r| r.ip).collect();
        self.rebuild_free();
    }

    fn rebuild_free(&mut self) {
        for (i, s) in self.subnets.iter().enumerate() {
            let f = &mut self.free[i];
            f.clear();
            for r in &s.ranges {
                for v in u32::from(r.0)..=u32::from(r.1) {
                    let ip = Ipv4Addr::from(v);
                    if s.in_pool(ip)
                        && !self.reserved_ips.contains(&ip)
                        && !self.by_ip.contains_key(&ip)
                    {
                        f.insert(v);
                    }
                }
            }
        }
    }

    /// Load a persisted lease (startup), without journaling it.
    pub(crate) fn load(&mut self, l: Lease) {
        self.insert_lease(l);
    }

    /// Take the changes made since the last call (to persist, then publish).
    pub fn take_journal(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.journal)
    }

    pub fn get(&self, ip: Ipv4Addr) -> Option<&Lease> {
        self.by_ip.get(&ip)
    }

    pub(crate) fn by_mac(&self, mac: &Mac) -> Option<&Lease> {
        self.by_mac.get(mac).and_then(|ip| self.by_ip.get(ip))
    }

    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.by_ip.values()
    }

    /// The leases the lease log keeps (all but offers, which live in memory only).
    pub(crate) fn persisted(&self) -> impl Iterator<Item = &Lease> {
        self.by_ip
            .values()
            .filter(|l| l.state != LeaseState::Offered)
    }

    pub(crate) fn reservation(&self, mac: &Mac) -> Option<&Reservation> {
        self.reservations.get(mac)
    }

    pub(crate) fn subnet_index_for(&self, ip: Ipv4Addr) -> Option<usize> {
        self.subnets.iter().position(|s| s.contains(ip))
    }

    /// (active leases, pool size) per subnet, for the utilisation metric.
    pub(crate) fn utilisation(&self, now: u64) -> Vec<(Ipv4Addr, u64, u64)> {
        self.subnets
            .iter()
            .map(|s| {
                let used = self
                    .by_ip
                    .values()
                    .filter(|l| s.contains(l.ip) && l.active(now))
                    .count() as u64;
                (s.network, used, s.pool_size())
            })
            .collect()
    }

    fn insert_lease(&mut self, l: Lease) {
        if let Some(i) = self.subnet_index_for(l.ip) {
            self.free[i].remove(&u32::from(l.ip));
        }
        if let Some(old) = self.by_ip.insert(l.ip, l.clone()) {
            if old.mac != l.mac && self.by_mac.get(&old.mac) == Some(&l.ip) {
                self.by_mac.remove(&old.mac);
            }
        }
        if l.state != LeaseState::Declined {
            if let Some(prev) = self.by_mac.insert(l.mac, l.ip) {
                if prev != l.ip {
                    // A client holds one address per table: drop its older one.
                    self.forget(prev);
                }
            }
        }
    }

    fn forget(&mut self, ip: Ipv4Addr) {
        if let Some(old) = self.remove(ip) {
            if old.state != LeaseState::Offered {
                self.journal.push(Change::Forget(ip));
            }
        }
    }

    /// Drop `ip`'s lease from the table (not journaled) and free the address.
    fn remove(&mut self, ip: Ipv4Addr) -> Option<Lease> {
        let old = self.by_ip.remove(&ip)?;
        if self.by_mac.get(&old.mac) == Some(&ip) {
            self.by_mac.remove(&old.mac);
        }
        if let Some(i) = self.subnet_index_for(ip) {
            let s = &self.subnets[i];
            if s.in_pool(ip) && !self.reserved_ips.contains(&ip) {
                self.free[i].insert(u32::from(ip));
            }
        }
        Some(old)
    }

    /// Make `ip`'s entry what the shared store durably holds for it (`record`; `None`:
    /// no record), learned from another appliance or from a commit's outcome; nothing is
    /// journaled. An offer of ours stays unless the record holds the address at `now`.
    /// A MAC holding two addresses in the store (it moved between appliances) keeps both
    /// blocked; the one expiring last is its address here.
    pub fn learn(&mut self, ip: Ipv4Addr, record: Option<Lease>, now: u64) {
        let cur = self.by_ip.get(&ip);
        let Some(l) = record else {
            if cur.is_some_and(|c| c.state != LeaseState::Offered) {
                self.remove(ip);
            }
            return;
        };
        if let Some(c) = cur {
            let keep_offer = c.state == LeaseState::Offered && !holds(&l, now, self.margin());
            if *c == l || keep_offer {
                return;
            }
        }
        if self.by_ip.get(&ip).is_some_and(|c| c.mac != l.mac) {
            self.remove(ip);
        }
        if let Some(i) = self.subnet_index_for(ip) {
            self.free[i].remove(&u32::from(ip));
        }
        let mac = l.mac;
        let declined = l.state == LeaseState::Declined;
        self.by_ip.insert(ip, l);
        if declined {
            if self.by_mac.get(&mac) == Some(&ip) {
                self.by_mac.remove(&mac);
            }
            return;
        }
        match self.by_mac.get(&mac).copied() {
            Some(other) if other != ip => {
                let other_lease = self.by_ip.get(&other);
                if other_lease.is_some_and(|o| o.state == LeaseState::Offered) {
                    // It took its address elsewhere: our offer is void.
                    self.remove(other);
                    self.by_mac.insert(mac, ip);
                } else if other_lease.is_none_or(|o| o.expires <= self.by_ip[&ip].expires) {
                    self.by_mac.insert(mac, ip);
                }
            }
            _ => {
                self.by_mac.insert(mac, ip);
            }
        }
    }

    /// Can `mac` have `ip` at `now`? (in subnet `si`'s pool or reserved to it, and not held by another)
    fn available_to(&self, si: usize, ip: Ipv4Addr, mac: &Mac, now: u64) -> bool {
        let s = &self.subnets[si];
        if !s.contains(ip) || ip == s.network || ip == s.broadcast() {
            return false;
        }
        let reserved_to_me = self.reservations.get(mac).is_some_and(|r| r.ip == ip);
        if !reserved_to_me && (!s.in_pool(ip) || self.reserved_ips.contains(&ip)) {
            return false;
        }
        match self.by_ip.get(&ip) {
            None => true,
            Some(l) => {
                (l.mac == *mac && l.state != LeaseState::Declined) || !holds(l, now, self.margin())
            }
        }
    }

    /// Where the search for a free address for `mac` in subnet `si` starts: the pool's
    /// lowest address, or (shared) a point in it the MAC hashes to.
    fn search_start(&self, si: usize, mac: &Mac) -> u32 {
        let s = &self.subnets[si];
        let lo = s.ranges.iter().map(|r| u32::from(r.0)).min().unwrap_or(0);
        let hi = s.ranges.iter().map(|r| u32::from(r.1)).max().unwrap_or(0);
        match self.shared {
            Some(_) if hi > lo => lo + mac_hash(mac) % (hi - lo + 1),
            _ => lo,
        }
    }

    /// Pick an address for `mac` in subnet `si`: reservation, its current lease,
    /// the requested address, a free one, then the longest-expired one.
    pub fn choose(
        &mut self,
        si: usize,
        mac: &Mac,
        requested: Option<Ipv4Addr>,
        now: u64,
    ) -> Result<Ipv4Addr, AllocError> {
        if si >= self.subnets.len() {
            return Err(AllocError::NoSubnet);
        }
        if let Some(r) = self.reservations.get(mac) {
            if self.subnets[si].contains(r.ip) {
                let ip = r.ip;
                if self.available_to(si, ip, mac, now) {
                    return Ok(ip);
                }
            }
        }
        if let Some(ip) = self.by_mac.get(mac).copied() {
            if self.available_to(si, ip, mac, now) {
                return Ok(ip);
            }
        }
        if let Some(ip) = requested {
            if self.available_to(si, ip, mac, now) {
                return Ok(ip);
            }
        }
        let start = self.search_start(si, mac);
        loop {
            let f = &self.free[si];
            let Some(v) = f.range(start..).next().or_else(|| f.first()).copied() else {
                break;
            };
            let ip = Ipv4Addr::from(v);
            if self.available_to(si, ip, mac, now) {
                // It stays in the free set until a lease is inserted.
                return Ok(ip);
            }
            self.free[si].remove(&v);
        }
        // Reclaim: the address whose lease ended longest ago.
        let (s, margin) = (&self.subnets[si], self.margin());
        let victim = self
            .by_ip
            .values()
            .filter(|l| {
                s.contains(l.ip)
                    && !holds(l, now, margin)
                    && s.in_pool(l.ip)
                    && !self.reserved_ips.contains(&l.ip)
            })
            .min_by_key(|l| (l.state != LeaseState::Released, l.expires))
            .map(|l| l.ip);
        match victim {
            Some(ip) => Ok(ip),
            None => Err(AllocError::PoolExhausted),
        }
    }

    /// Hold `ip` for `mac` until `expires` (an offer; memory only).
    pub(crate) fn offer(&mut self, ip: Ipv4Addr, mac: Mac, hostname: Option<String>, expires: u64) {
        if let Some(l) = self.by_ip.get(&ip) {
            if l.mac == mac && l.state == LeaseState::Bound && l.expires >= expires {
                return; // already bound for longer: keep it
            }
            if l.mac != mac {
                self.forget(ip);
            }
        }
        self.insert_lease(Lease {
            ip,
            mac,
            hostname,
            expires,
            state: LeaseState::Offered,
        });
    }

    /// Drop an unanswered offer for `mac` (it chose another server).
    pub(crate) fn cancel_offer(&mut self, mac: &Mac) {
        if let Some(l) = self.by_mac(mac) {
            if l.state == LeaseState::Offered {
                let ip = l.ip;
                self.forget(ip);
            }
        }
    }

    /// Bind `ip` to `mac` until `expires` (journaled: must be durable before the ACK).
    pub fn bind(&mut self, ip: Ipv4Addr, mac: Mac, hostname: Option<String>, expires: u64) {
        if self.by_ip.get(&ip).is_some_and(|l| l.mac != mac) {
            self.forget(ip);
        }
        let l = Lease {
            ip,
            mac,
            hostname,
            expires,
            state: LeaseState::Bound,
        };
        self.insert_lease(l.clone());
        self.journal.push(Change::Put(l));
    }

    /// The client gave `ip` back. Returns false if it was not theirs.
    pub fn release(&mut self, ip: Ipv4Addr, mac: &Mac, now: u64) -> bool {
        match self.by_ip.get_mut(&ip) {
            Some(l) if l.mac == *mac && l.state == LeaseState::Bound => {
                l.state = LeaseState::Released;
                l.expires = now;
                let l = l.clone();
                self.journal.push(Change::Put(l));
                true
            }
            _ => false,
        }
    }

    /// The client found `ip` in use: park it until `until`.
    pub(crate) fn decline(&mut self, ip: Ipv4Addr, mac: &Mac, until: u64) -> bool {
        match self.by_ip.get(&ip) {
            Some(l) if l.mac == *mac => {
                let l = Lease {
                    ip,
                    mac: *mac,
                    hostname: None,
                    expires: until,
                    state: LeaseState::Declined,
                };
                if self.by_mac.get(mac) == Some(&ip) {
                    self.by_mac.remove(mac);
                }
                self.by_ip.insert(ip, l.clone());
                self.journal.push(Change::Put(l));
                true
            }
            _ => false,
        }
    }
}

/// What becomes of an ACK once its commit has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its lease is durable: send it.
    Send,
    /// Another appliance's client holds the address: a NAK instead.
    Nak,
    /// etcd is unreachable and the mirror shows this client's lease with this many
    /// seconds left: send it with that lease time.
    Renewal(u32),
    /// No answer (the client retransmits).
    Drop,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnet() -> Subnet {
        Subnet {
            network: Ipv4Addr::new(10, 0, 0, 0),
            prefix_len: 24,
            ranges: vec![(Ipv4Addr::new(10, 0, 0, 10), Ipv4Addr::new(10, 0, 0, 12))],
            exclude: vec![(Ipv4Addr::new(10, 0, 0, 11), Ipv4Addr::new(10, 0, 0, 11))],
            router: None,
            dns: vec![],
            domain: None,
            lease_time_secs: 60,
        }
    }

    #[test]
    fn allocation_order_exclusion_and_exhaustion() {
        let mut t = LeaseTable::new(vec![subnet()], vec![]);
        let a = t.choose(0, &[1; 6], None, 100).unwrap();
        assert_eq!(a, Ipv4Addr::new(10, 0, 0, 10));
        t.bind(a, [1; 6], None, 200);
        let b = t.choose(0, &[2; 6], None, 100).unwrap();
        assert_eq!(b, Ipv4Addr::new(10, 0, 0, 12), "10.0.0.11 is excluded");
        t.bind(b, [2; 6], None, 250);
        assert_eq!(
            t.choose(0, &[3; 6], None, 100),
            Err(AllocError::PoolExhausted)
        );
        // the same client gets its address again
        assert_eq!(t.choose(0, &[1; 6], None, 150).unwrap(), a);
        // after expiry, the address is reused
        assert_eq!(t.choose(0, &[3; 6], None, 300).unwrap(), a);
        t.bind(a, [3; 6], None, 400);
        assert!(t.by_mac(&[1; 6]).is_none());
        assert_eq!(t.by_mac(&[3; 6]).unwrap().ip, a);
    }

    #[test]
    fn release_prefers_reclaiming_released_and_journals() {
        let mut t = LeaseTable::new(vec![subnet()], vec![]);
        t.bind(Ipv4Addr::new(10, 0, 0, 10), [1; 6], None, 1000);
        t.bind(Ipv4Addr::new(10, 0, 0, 12), [2; 6], None, 1000);
        assert!(t.release(Ipv4Addr::new(10, 0, 0, 12), &[2; 6], 100));
        assert!(!t.release(Ipv4Addr::new(10, 0, 0, 10), &[9; 6], 100));
        assert_eq!(
            t.choose(0, &[3; 6], None, 101).unwrap(),
            Ipv4Addr::new(10, 0, 0, 12)
        );
        let j = t.take_journal();
        assert_eq!(j.len(), 3);
        let idx = LeaseIndex::default();
        idx.apply(&j);
        assert_eq!(idx.by_ip(Ipv4Addr::new(10, 0, 0, 10)).unwrap().mac, [1; 6]);
        assert!(
            idx.by_ip(Ipv4Addr::new(10, 0, 0, 12)).is_none(),
            "released leaves the index"
        );
        assert_eq!(idx.by_mac(&[1; 6]).unwrap().ip, Ipv4Addr::new(10, 0, 0, 10));
        assert_eq!(idx.all().len(), 1);
    }

    #[test]
    fn reservations_win_and_are_kept_from_others() {
        let r = Reservation {
            mac: [7; 6],
            ip: Ipv4Addr::new(10, 0, 0, 12),
            hostname: Some("n7".into()),
        };
        let mut t = LeaseTable::new(vec![subnet()], vec![r]);
        assert_eq!(
            t.choose(0, &[7; 6], None, 0).unwrap(),
            Ipv4Addr::new(10, 0, 0, 12)
        );
        assert_eq!(
            t.choose(0, &[1; 6], Some(Ipv4Addr::new(10, 0, 0, 12)), 0)
                .unwrap(),
            Ipv4Addr::new(10, 0, 0, 10)
        );
        // a reservation outside the pool is still given
        t.set_reservations(vec![Reservation {
            mac: [8; 6],
            ip: Ipv4Addr::new(10, 0, 0, 99),
            hostname: None,
        }]);
        assert_eq!(
            t.choose(0, &[8; 6], None, 0).unwrap(),
            Ipv4Addr::new(10, 0, 0, 99)
        );
    }

    #[test]
    fn decline_parks_address() {
        let mut t = LeaseTable::new(vec![subnet()], vec![]);
        t.bind(Ipv4Addr::new(10, 0, 0, 10), [1; 6], None, 1000);
        assert!(t.decline(Ipv4Addr::new(10, 0, 0, 10), &[1; 6], 500));
        assert_eq!(
            t.choose(0, &[1; 6], None, 100).unwrap(),
            Ipv4Addr::new(10, 0, 0, 12)
        );
        assert_eq!(
            t.choose(0, &[2; 6], Some(Ipv4Addr::new(10, 0, 0, 10)), 100)
                .unwrap(),
            Ipv4Addr::new(10, 0, 0, 12)
        );
    }

    #[test]
    fn shared_tables_search_from_the_macs_hash_and_hold_past_expiry() {
        let mut sub = subnet();
        sub.ranges = vec![(Ipv4Addr::new(10, 0, 0, 10), Ipv4Addr::new(10, 0, 0, 250))];
        sub.exclude.clear();
        let (mut a, mut b) = (
            LeaseTable::new(vec![sub.clone()], vec![]),
            LeaseTable::new(vec![sub.clone()], vec![]),
        );
        a.share(5);
        b.share(5);
        // the same MAC gets the same address from two appliances' tables
        let pick = |t: &mut LeaseTable, m: u8| t.choose(0, &[2, 0, 0, 0, 0, m], None, 0).unwrap();
        for m in 0..20 {
            assert_eq!(pick(&mut a, m), pick(&mut b, m));
        }
        // and different MACs are spread out (lowest-free-first would give .10 to all)
        let distinct: HashSet<Ipv4Addr> = (0..20).map(|m| pick(&mut a, m)).collect();
        assert!(distinct.len() >= 15, "{distinct:?}");
        // another MAC's lease holds its address 5 s past its expiry
        let ip = pick(&mut a, 1);
        a.bind(ip, [2, 0, 0, 0, 0, 1], None, 100);
        let other = [9; 6];
        assert!(!a.available_to(0, ip, &other, 104));
        assert!(a.available_to(0, ip, &other, 105));
        assert!(a.available_to(0, ip, &[2, 0, 0, 0, 0, 1], 104));
    }

    #[test]
    fn may_replace_is_the_cas_rule() {
        let l = |mac: u8, exp: u64, state| Lease {
            ip: Ipv4Addr::new(10, 0, 0, 10),
            mac: [mac; 6],
            hostname: None,
            expires: exp,
            state,
        };
        let want = l(1, 200, LeaseState::Bound);
        assert!(may_replace(None, &want, 100, 5));
        assert!(may_replace(
            Some(&l(1, 150, LeaseState::Bound)),
            &want,
            100,
            5
        ));
        assert!(!may_replace(
            Some(&l(2, 150, LeaseState::Bound)),
            &want,
            100,
            5
        ));
        assert!(
            !may_replace(Some(&l(2, 98, LeaseState::Bound)), &want, 100, 5),
            "skew margin"
        );
        assert!(may_replace(
            Some(&l(2, 95, LeaseState::Bound)),
            &want,
            100,
            5
        ));
        assert!(may_replace(
            Some(&l(2, 150, LeaseState::Released)),
            &want,
            100,
            5
        ));
        assert!(!may_replace(
            Some(&l(1, 150, LeaseState::Declined)),
            &want,
            100,
            5
        ));
        assert!(!may_replace(
            Some(&l(2, 150, LeaseState::Declined)),
            &want,
            100,
            5
        ));
    }

    #[test]
    fn learn_mirrors_records_without_journaling() {
        let mut t = LeaseTable::new(vec![subnet()], vec![]);
        t.share(0);
        let ip10 = Ipv4Addr::new(10, 0, 0, 10);
        let ip12 = Ipv4Addr::new(10, 0, 0, 12);
        // our offer to MAC 1 is void once another appliance binds the address to MAC 2
        t.offer(ip10, [1; 6], None, 130);
        let theirs = Lease {
            ip: ip10,
            mac: [2; 6],
            hostname: None,
            expires: 1000,
            state: LeaseState::Bound,
        };
        t.learn(ip10, Some(theirs.clone()), 100);
        assert_eq!(t.get(ip10), Some(&theirs));
        assert!(t.by_mac(&[1; 6]).is_none());
        assert_eq!(t.choose(0, &[1; 6], Some(ip10), 100).unwrap(), ip12);
        // an expired record does not override our offer
        t.offer(ip12, [1; 6], None, 130);
        let stale = Lease {
            ip: ip12,
            mac: [3; 6],
            hostname: None,
            expires: 50,
            state: LeaseState::Bound,
        };
        t.learn(ip12, Some(stale), 100);
        assert_eq!(t.get(ip12).unwrap().state, LeaseState::Offered);
        // MAC 2 moved to .12 elsewhere: both stay blocked, .12 (later expiry) is its own
        let moved = Lease {
            ip: ip12,
            mac: [2; 6],
            hostname: None,
            expires: 2000,
            state: LeaseState::Bound,
        };
        t.learn(ip12, Some(moved), 100);
        assert_eq!(t.by_mac(&[2; 6]).unwrap().ip, ip12);
        assert!(t.get(ip10).is_some());
        assert_eq!(
            t.choose(0, &[4; 6], None, 100),
            Err(AllocError::PoolExhausted)
        );
        // a deleted record frees its address; an offer of ours is kept
        t.learn(ip10, None, 100);
        assert!(t.get(ip10).is_none());
        assert_eq!(t.choose(0, &[4; 6], None, 100).unwrap(), ip10);
        t.offer(ip10, [4; 6], None, 130);
        t.learn(ip10, None, 100);
        assert_eq!(t.get(ip10).unwrap().state, LeaseState::Offered);
        assert!(t.take_journal().is_empty(), "learning journals nothing");
    }
}
