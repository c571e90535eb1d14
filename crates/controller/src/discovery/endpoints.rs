//! Management network → fleet: each lease granted by the management DHCP scope whose
//! MAC has a known prefix ([`super::macdb`]) becomes an `Endpoint` (`bmc-<mac>`, its
//! `spec.macAddress` and `spec.ip`), and each such Endpoint a `BMC` (`spec.endpointRef`,
//! the database's protocol and port, `spec.bmcSecretRef`) and a `BMCSecret` (a copy of
//! the vendor's default-credentials BMCSecret), both owned by the Endpoint so that
//! deleting it removes them. Existing objects are left as they are (an operator's edits
//! stay), so a restart or a re-lease writes nothing.
//!
//! **Pinned addresses.** An Endpoint's `spec.ip` is the address of its first lease. A
//! later lease of the same MAC at another address does not move it (a spoofed MAC could
//! otherwise draw the BMC's credentials to itself): the Endpoint's `status.leaseIP` takes
//! the new address, its condition `AddressPinned` turns False (reason `LeaseMoved`) and
//! a Warning Event says so (`bootplane_discovery_endpoints_moved_total` counts them). An
//! operator accepts the move by setting `spec.ip` to the new address; the condition then
//! turns True again (reason `Accepted`).
//!
//! **Approval before credentials.** The vendor's default credentials go only to a BMC
//! an operator trusts: an Endpoint created from a lease whose address is not in
//! `discovery.approved_bmcs` carries the label `bootplane.dev/approval: pending` (the
//! convention of discovered Servers) and gets no BMCSecret and no BMC, so nothing
//! logs in to it, until an operator changes the label (to `approved`, or removes it).
//! Its condition `Approved` says so (False, reason `AwaitingApproval`, with a Warning
//! Event; True, reason `Approved`, once approved). A rogue device that took a known MAC
//! prefix thus collects no password.
//!
//! **A cap.** At most `discovery.max_new_endpoints` Endpoints (and so BMCs and
//! BMCSecrets) are created per `discovery.new_endpoints_interval_secs`; a lease beyond
//! that is skipped (`bootplane_discovery_capped_total`, one warning per interval) and
//! taken at its next renewal.
//!
//! **The intake reads the scope's leases**, not the DHCP loop's reports: every
//! [`INTAKE_EVERY`] (and at once after a lease granted here) it takes each active lease
//! of the management scope's [`LeaseIndex`] not seen since it last changed (a renewal
//! changes its expiry, and is seen again: the same address writes nothing). With the
//! store on etcd that index holds every appliance's leases (the DHCP ledger's mirror),
//! and [`Management`] runs in the `metal` controller group: on the group's leader only,
//! writing through its fenced store, so one appliance takes the cluster's BMC leases,
//! one cap counts them and one reconciler writes BMCs; a new leader reads every lease
//! once when its term begins.
//!
//! Unknown prefixes are counted (`bootplane_discovery_unknown_mac_total`) and logged once
//! at debug level. Nothing here reads or writes a credential except the copy of the
//! default secret's `data`, which never reaches a log, a condition or a metric.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Notify};

use super::macdb::{Entry, MacDb};
use crate::dhcp::{Grant, LeaseIndex};
use crate::model::ident::{parse_mac, Mac, MacFmt};
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views::{read, ConditionStatus, Endpoint};
use crate::queue::WorkQueue;
use crate::runtime::Runtime;
use crate::shutdown::Shutdown;
use crate::store::modify::retry_if;
use crate::store::{Modified, Store, StoreError};
use crate::{controller_ref, set_condition, Next, APPROVAL_LABEL, APPROVAL_PENDING};

/// Granted leases waiting to wake the intake (the DHCP loop drops and counts beyond this).
pub const GRANT_QUEUE: usize = 1024;
/// How often the intake reads the scope's leases when no local grant wakes it: how late
/// a lease granted by another appliance (or one whose report was dropped) is taken.
pub const INTAKE_EVERY: Duration = Duration::from_secs(1);
/// How soon an Endpoint whose default-credentials secret is missing is looked at again.
const SECRET_RETRY: Duration = Duration::from_secs(10);
/// The condition saying whether an Endpoint's `spec.ip` is its MAC's latest lease.
pub(crate) const PINNED: &str = "AddressPinned";
/// The condition saying whether an Endpoint may be sent credentials.
pub(crate) const APPROVED: &str = "Approved";

use super::settings::Cap;

/// The current interval of a [`Cap`]: when it began, how many were created in it, and
/// whether its warning was logged.
struct Window {
    start: std::time::Instant,
    created: u32,
    warned: bool,
}

/// Discovery counters on `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub unknown_mac: Counter,
    pub endpoints_created: Counter,
    pub endpoints_moved: Counter,
    pub bmcs_created: Counter,
    pub capped: Counter,
}

impl Metrics {
    pub fn register(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("bootplane_discovery");
        r.register(
            "unknown_mac",
            "management leases whose MAC prefix is not in the database",
            self.unknown_mac.clone(),
        );
        r.register(
            "endpoints_created",
            "Endpoints created from management leases",
            self.endpoints_created.clone(),
        );
        r.register(
            "endpoints_moved",
            "leases of a known Endpoint's MAC at another address (the Endpoint keeps its pinned address)",
            self.endpoints_moved.clone(),
        );
        r.register(
            "capped",
            "management leases not made Endpoints because discovery.max_new_endpoints was reached",
            self.capped.clone(),
        );
        r.register(
            "bmcs_created",
            "BMCs (with their BMCSecrets) created from Endpoints",
            self.bmcs_created.clone(),
        );
    }
}

/// Reads the MAC-prefix database at `path` (none: an empty one), size-bounded before
/// it is read.
pub fn load_db(path: Option<&std::path::Path>) -> anyhow::Result<MacDb> {
    use anyhow::Context as _;
    let Some(path) = path else {
        return Ok(MacDb::default());
    };
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading discovery.mac_db {}", path.display()))?
        .len();
    if len > super::macdb::MAX_BYTES as u64 {
        anyhow::bail!(
            "discovery.mac_db {} is {len} bytes (at most {})",
            path.display(),
            super::macdb::MAX_BYTES
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading discovery.mac_db {}", path.display()))?;
    MacDb::parse(&text).with_context(|| format!("discovery.mac_db {}", path.display()))
}

/// The Endpoint name of a MAC: `bmc-` and its 12 hex digits.
pub(crate) fn endpoint_name(mac: &[u8; 6]) -> String {
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("bmc-{hex}")
}

/// The management-network controller set.
pub struct Management {
    store: Store,
    db: Arc<MacDb>,
    metrics: Metrics,
    queue: Arc<WorkQueue<String>>,
    t_endpoint: Arc<ResourceType>,
    t_bmc: Arc<ResourceType>,
    t_secret: Arc<ResourceType>,
    cap: Cap,
    window: std::sync::Mutex<Window>,
    events: crate::store::events::Recorder,
    /// BMC addresses trusted without an operator's approval (`discovery.approved_bmcs`).
    approved: super::settings::ApprovedBmcs,
    /// The management scope's leases (on etcd: the cluster's).
    leases: LeaseIndex,
    /// Told when this appliance granted a lease ([`wake_on_grants`]).
    wake: Arc<Notify>,
    /// The leases taken since they last changed (MAC, address, expiry), at most one
    /// per lease the index holds.
    taken: std::sync::Mutex<HashSet<(Mac, Ipv4Addr, u64)>>,
    /// MACs of an unknown prefix counted (once each while the index holds a lease of
    /// theirs: a renewal is not another unknown device).
    unknown: std::sync::Mutex<HashSet<Mac>>,
}

/// What a [`Management`] is made of besides its store, built once at start and shared by
/// every term of leadership.
#[derive(Clone)]
pub struct Inputs {
    pub db: Arc<MacDb>,
    pub metrics: Metrics,
    pub cap: Cap,
    pub approved: super::settings::ApprovedBmcs,
    pub leases: LeaseIndex,
    pub wake: Arc<Notify>,
}

/// Wake the intake for each lease this appliance's management scope grants, until
/// shutdown (or the DHCP loop ends): the reports only say "look now".
pub async fn wake_on_grants(
    mut grants: mpsc::Receiver<Grant>,
    wake: Arc<Notify>,
    shutdown: Shutdown,
) {
    let mut stop = shutdown.child();
    loop {
        tokio::select! {
            _ = stop.recv() => break,
            g = grants.recv() => match g {
                Some(_) => wake.notify_one(),
                None => break,
            },
        }
    }
}

impl Management {
    /// Needs a tokio runtime (its Event recorder's task).
    pub fn new(store: Store, inputs: Inputs) -> Arc<Management> {
        let Inputs {
            db,
            metrics,
            cap,
            approved,
            leases,
            wake,
        } = inputs;
        let reg = store.registry();
        Arc::new(Management {
            approved,
            leases,
            wake,
            taken: Default::default(),
            unknown: Default::default(),
            events: crate::store::events::Recorder::spawn(store.clone(), "bootplane-discovery"),
            cap,
            window: std::sync::Mutex::new(Window {
                start: std::time::Instant::now(),
                created: 0,
                warned: false,
            }),
            t_endpoint: reg.resolve("endpoint").expect("endpoint type"),
            t_bmc: reg.resolve("bmc").expect("bmc type"),
            t_secret: reg.resolve("bmcsecret").expect("bmcsecret type"),
            store,
            db,
            metrics,
            queue: WorkQueue::new(),
        })
    }

    /// Runs the lease intake and the Endpoint reconciler until shutdown.
    pub async fn run(self: Arc<Self>, workers: usize, shutdown: Shutdown) {
        let intake = {
            let me = self.clone();
            let mut stop = shutdown.child();
            async move {
                loop {
                    me.intake().await;
                    tokio::select! {
                        _ = stop.recv() => break,
                        _ = me.wake.notified() => {}
                        _ = tokio::time::sleep(INTAKE_EVERY) => {}
                    }
                }
            }
        };
        let reconcilers = Runtime::new(self.clone(), self.store.clone(), workers.clamp(1, 8))
            .watch(
                [self.t_endpoint.clone()],
                |c: &Management, _, o, deleted| {
                    if !deleted {
                        c.queue.add(meta::name(o).to_string());
                    }
                },
            )
            .reconciler("endpoint", self.queue.clone(), |c, k| async move {
                c.reconcile(&k).await
            })
            .run(shutdown);
        tokio::join!(intake, reconcilers);
    }

    /// Take every active lease of the scope not taken since it last changed.
    async fn intake(&self) {
        let now = crate::sys::unix_now();
        let leases: Vec<_> = (self.leases.all().into_iter())
            .filter(|l| l.active(now) && l.state == crate::dhcp::LeaseState::Bound)
            .collect();
        let key = |l: &crate::dhcp::Lease| (l.mac, l.ip, l.expires);
        let current: HashSet<_> = leases.iter().map(key).collect();
        self.taken.lock().unwrap().retain(|k| current.contains(k));
        let macs: HashSet<Mac> = leases.iter().map(|l| l.mac).collect();
        self.unknown.lock().unwrap().retain(|m| macs.contains(m));
        for l in &leases {
            if self.taken.lock().unwrap().contains(&key(l)) {
                continue;
            }
            let g = Grant {
                mac: l.mac,
                ip: l.ip,
                hostname: l.hostname.clone(),
                vendor_class: None,
            };
            if self.lease(&g).await {
                self.taken.lock().unwrap().insert(key(l));
            }
        }
    }

    /// One granted lease: its Endpoint created, or its IP updated. Whether it was
    /// taken (`false`: capped, or the write failed; the next look tries again).
    async fn lease(&self, g: &Grant) -> bool {
        let Some(entry) = self.db.lookup(&g.mac) else {
            if !self.unknown.lock().unwrap().insert(g.mac) {
                return true;
            }
            self.metrics.unknown_mac.inc();
            tracing::debug!(mac = %MacFmt(&g.mac), ip = %g.ip, vendor_class = ?g.vendor_class, "management lease with an unknown mac prefix; ignored");
            return true;
        };
        // Another writer in between (the Endpoint changed, or was created meanwhile):
        // read again and redo.
        let raced = |e: &StoreError| {
            matches!(
                e,
                StoreError::Conflict { .. } | StoreError::AlreadyExists { .. }
            )
        };
        match retry_if(3, raced, || self.upsert_endpoint(g, entry)).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(mac = %MacFmt(&g.mac), error = %e, "writing the endpoint failed");
                false
            }
        }
    }

    /// Whether the lease was taken (`false`: over the cap).
    async fn upsert_endpoint(&self, g: &Grant, entry: &Entry) -> Result<bool, StoreError> {
        let name = endpoint_name(&g.mac);
        let ip = g.ip.to_string();
        match self.store.get(&self.t_endpoint, None, &name) {
            Ok(cur) => self.observe_lease(&cur, &ip).await.map(|()| true),
            Err(StoreError::NotFound { .. }) => {
                if !self.take_slot() {
                    return Ok(false);
                }
                let mut obj = json!({
                    "apiVersion": self.t_endpoint.api_version(),
                    "kind": "Endpoint",
                    "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "bootplane"}},
                    "spec": {"macAddress": MacFmt(&g.mac).to_string(), "ip": ip},
                });
                let pending = !self.approved.contains(&ip);
                if pending {
                    obj["metadata"]["labels"][APPROVAL_LABEL] = json!(APPROVAL_PENDING);
                }
                self.store.create(&self.t_endpoint, obj).await?;
                self.metrics.endpoints_created.inc();
                tracing::info!(endpoint = %name, %ip, manufacturer = %entry.manufacturer, awaiting_approval = pending, "endpoint created from a management lease");
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// A lease of a known Endpoint's MAC at `ip`: nothing when it is the pinned address
    /// (and no move is pending); else `status.leaseIP` and the condition [`PINNED`]
    /// record it, the address stays.
    async fn observe_lease(&self, cur: &Arc<Value>, ip: &str) -> Result<(), StoreError> {
        let e: Endpoint = read(cur);
        let pinned = e.spec.ip.as_deref().unwrap_or("");
        if pinned.is_empty() {
            // No address yet (an Endpoint made by hand with a MAC only): the first one.
            let mut next = (**cur).clone();
            next["spec"]["ip"] = json!(ip);
            let p = crate::store::Part::Main;
            self.store
                .update_from(&self.t_endpoint, cur.clone(), next, p)
                .await?;
            return Ok(());
        }
        if e.status.lease_ip.as_deref().unwrap_or(pinned) == ip {
            return Ok(());
        }
        let mut st = cur.get("status").cloned().unwrap_or_else(|| json!({}));
        st["leaseIP"] = json!(ip);
        let name = meta::name(cur);
        if pinned == ip {
            set_condition(
                &mut st,
                PINNED,
                true,
                "LeaseReturned",
                &format!("the MAC's lease is at the pinned address {ip} again"),
            );
        } else {
            let msg = format!("the MAC's lease moved from {pinned} to {ip}; the BMC is still reached at {pinned}: to accept the move, set spec.ip to {ip}");
            set_condition(&mut st, PINNED, false, "LeaseMoved", &msg);
            self.events
                .warning(&self.t_endpoint, cur, "LeaseMoved", msg);
            self.metrics.endpoints_moved.inc();
            tracing::warn!(endpoint = %name, pinned, lease = %ip, "management lease moved; the endpoint keeps its pinned address until an operator accepts the move");
        }
        self.store.update_status(&self.t_endpoint, cur, st).await?;
        Ok(())
    }

    /// Whether one more Endpoint may be created in this interval ([`Cap`]); counts it.
    fn take_slot(&self) -> bool {
        let mut w = self.window.lock().unwrap();
        if w.start.elapsed() >= self.cap.interval {
            *w = Window {
                start: std::time::Instant::now(),
                created: 0,
                warned: false,
            };
        }
        if w.created < self.cap.max {
            w.created += 1;
            return true;
        }
        self.metrics.capped.inc();
        if !std::mem::replace(&mut w.warned, true) {
            tracing::warn!(max = self.cap.max, interval_secs = self.cap.interval.as_secs(), "discovery.max_new_endpoints reached: further management leases are not made Endpoints until the interval ends (they are taken at their next renewal)");
        }
        false
    }

    /// An operator accepted a move (`spec.ip` set to `status.leaseIP`): the condition
    /// [`PINNED`] True again.
    async fn accept_move(&self, ep: &Arc<Value>) -> Result<(), StoreError> {
        let e: Endpoint = read(ep);
        let (ip, lease) = (e.spec.ip.as_deref(), e.status.lease_ip.as_deref());
        let moved = (e.status.conditions.iter())
            .any(|c| c.type_ == PINNED && c.status == ConditionStatus::False);
        if !moved || ip.is_none() || ip != lease {
            return Ok(());
        }
        let mut st = ep.get("status").cloned().unwrap_or_else(|| json!({}));
        let msg = format!("the move to {} was accepted", ip.unwrap_or(""));
        set_condition(&mut st, PINNED, true, "Accepted", &msg);
        self.events.normal(&self.t_endpoint, ep, "Accepted", msg);
        match self.store.update_status(&self.t_endpoint, ep, st).await {
            Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// An Endpoint with a known prefix → its BMCSecret and BMC (created once).
    async fn reconcile(&self, name: &String) -> Result<Next, StoreError> {
        let ep = match self.store.get(&self.t_endpoint, None, name) {
            Ok(e) => e,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        if meta::is_deleting(&ep) {
            return Ok(Next::Done);
        }
        self.accept_move(&ep).await?;
        if !self.approval(&ep).await? {
            return Ok(Next::Done);
        }
        let mac = read::<Endpoint>(&ep).spec.mac_address;
        let Some(entry) = parse_mac(&mac).ok().and_then(|m| self.db.lookup(&m)) else {
            return Ok(Next::Done);
        };
        let owner = controller_ref(&self.t_endpoint, &ep);
        if !self.exists(&self.t_secret, name)? {
            let default = match self.store.get(
                &self.t_secret,
                None,
                &entry.default_credentials_secret,
            ) {
                Ok(s) => s,
                Err(StoreError::NotFound { .. }) => {
                    tracing::warn!(endpoint = %name, secret = %entry.default_credentials_secret, "default-credentials BMCSecret not found; waiting for it");
                    return Ok(Next::After(SECRET_RETRY));
                }
                Err(e) => return Err(e),
            };
            let secret = json!({
                "apiVersion": self.t_secret.api_version(),
                "kind": "BMCSecret",
                "metadata": {"name": name, "ownerReferences": owner},
                "data": default.get("data").cloned().unwrap_or_else(|| json!({})),
            });
            ignore_exists(self.store.create(&self.t_secret, secret).await)?;
        }
        if !self.exists(&self.t_bmc, name)? {
            let bmc = json!({
                "apiVersion": self.t_bmc.api_version(),
                "kind": "BMC",
                "metadata": {"name": name, "ownerReferences": owner},
                "spec": {
                    "endpointRef": {"name": name},
                    "bmcSecretRef": {"name": name},
                    "protocol": {"name": entry.protocol.name(), "port": entry.port},
                },
            });
            if ignore_exists(self.store.create(&self.t_bmc, bmc).await)? {
                self.metrics.bmcs_created.inc();
                tracing::info!(bmc = %name, manufacturer = %entry.manufacturer, protocol = entry.protocol.name(), port = entry.port, "bmc created from its endpoint");
            }
        }
        Ok(Next::Done)
    }

    /// Whether the Endpoint may be sent credentials (not `pending`, or its address is
    /// approved); the condition [`APPROVED`] says so when it waits or waited.
    async fn approval(&self, ep: &Arc<Value>) -> Result<bool, StoreError> {
        let view = read::<Endpoint>(ep);
        let ip = view.spec.ip.as_deref().unwrap_or("");
        let pending =
            view.metadata.labels.get(APPROVAL_LABEL).map(String::as_str) == Some(APPROVAL_PENDING);
        let ok = !pending || self.approved.contains(ip);
        let waited = (view.status.conditions.iter()).any(|c| c.type_ == APPROVED);
        if ok && !waited {
            return Ok(true);
        }
        let (reason, msg) = if ok {
            (
                "Approved",
                "approved: the BMC is sent its credentials".to_string(),
            )
        } else {
            ("AwaitingApproval", format!("the address {ip} is not in discovery.approved_bmcs: no credentials are sent to it (no BMC, no BMCSecret) until an operator changes the label {APPROVAL_LABEL} from {APPROVAL_PENDING} to approved"))
        };
        let set = |_: &Arc<Value>, st: &mut Value| set_condition(st, APPROVED, ok, reason, &msg);
        match (self.store)
            .modify_status(&self.t_endpoint, None, meta::name(ep), set)
            .await
        {
            // The Event once, with the condition it explains.
            Ok(Modified::Written { .. }) if !ok => {
                (self.events).warning(&self.t_endpoint, ep, reason, msg.clone())
            }
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(ok)
    }

    fn exists(&self, t: &ResourceType, name: &str) -> Result<bool, StoreError> {
        match self.store.get(t, None, name) {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A create that lost a race to another writer is fine: `Ok(created)`.
fn ignore_exists(r: Result<Arc<Value>, StoreError>) -> Result<bool, StoreError> {
    match r {
        Ok(_) => Ok(true),
        Err(StoreError::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DB: &str = "macPrefixes:
- {macPrefix: \"52:54:00\", protocol: Redfish, port: 8443, defaultCredentialsSecret: vendor}
";

    const CAP: Cap = Cap {
        max: 64,
        interval: Duration::from_secs(60),
    };

    /// A store in a temporary directory and the intake over it, with `cap` and the
    /// approved BMC prefixes `approved`.
    fn intake(cap: Cap, approved: &[&str]) -> (tempfile::TempDir, Store, Arc<Management>) {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let approved = approved.iter().map(|a| a.parse().unwrap()).collect();
        let inputs = Inputs {
            db: Arc::new(MacDb::parse(DB).unwrap()),
            metrics: Metrics::default(),
            cap,
            approved: super::super::settings::ApprovedBmcs(approved),
            leases: LeaseIndex::default(),
            wake: Arc::default(),
        };
        (d, store.clone(), Management::new(store, inputs))
    }

    fn lease_of(last: u8, ip: [u8; 4], expires: u64) -> crate::dhcp::Lease {
        crate::dhcp::Lease {
            ip: ip.into(),
            mac: [0x52, 0x54, 0, 0, 0, last],
            hostname: None,
            expires,
            state: crate::dhcp::LeaseState::Bound,
        }
    }

    #[tokio::test]
    async fn the_intake_takes_each_lease_of_the_index_once_until_it_changes() {
        use crate::dhcp::leases::Change;
        let cap = Cap {
            max: 1,
            interval: Duration::from_secs(3600),
        };
        let (_d, store, m) = intake(cap, &["10.0.0.0/8"]);
        let later = crate::sys::unix_now() + 600;
        // Leases in the scope's index, however they got there (on etcd: granted by any
        // appliance); an expired one is not taken.
        m.leases.apply(&[
            Change::Put(lease_of(1, [10, 0, 0, 5], later)),
            Change::Put(lease_of(2, [10, 0, 0, 6], later)),
            Change::Put(lease_of(3, [10, 0, 0, 7], 1)),
        ]);
        m.intake().await;
        let names = || -> Vec<String> {
            let (items, _) = store.list(&m.t_endpoint, None, None);
            items.map(|o| meta::name(&o).to_string()).collect()
        };
        assert_eq!(
            names(),
            ["bmc-525400000001"],
            "one slot: the second is capped"
        );
        assert_eq!(m.metrics.capped.get(), 1);
        // Looked at again: the taken lease is not read again, the capped one is retried.
        m.intake().await;
        assert_eq!(m.metrics.capped.get(), 2);
        let past = std::time::Instant::now().checked_sub(Duration::from_secs(3600));
        m.window.lock().unwrap().start = past.expect("a monotonic clock an hour old");
        m.intake().await;
        assert_eq!(names(), ["bmc-525400000001", "bmc-525400000002"]);
        // A renewal (a new expiry) at another address is seen: the move is recorded.
        m.leases.apply(&[
            Change::Forget([10, 0, 0, 5].into()),
            Change::Put(lease_of(1, [10, 0, 0, 9], later + 60)),
        ]);
        m.intake().await;
        let e = store.get(&m.t_endpoint, None, "bmc-525400000001").unwrap();
        assert_eq!(e["status"]["leaseIP"], "10.0.0.9", "{e}");
        assert_eq!(
            m.taken.lock().unwrap().len(),
            2,
            "one per lease the index holds"
        );
    }

    fn grant(last: u8, ip: [u8; 4]) -> Grant {
        Grant {
            mac: [0x52, 0x54, 0, 0, 0, last],
            ip: ip.into(),
            hostname: None,
            vendor_class: None,
        }
    }

    #[tokio::test]
    async fn leases_make_endpoints_whose_address_is_pinned_and_unknown_ones_are_counted() {
        let (_d, store, m) = intake(CAP, &["10.0.0.0/8"]);
        let get = |n: &str| store.get(&m.t_endpoint, None, n).unwrap();
        m.lease(&grant(1, [10, 0, 0, 5])).await;
        let e = get("bmc-525400000001");
        assert_eq!(e["spec"]["ip"], "10.0.0.5");
        assert_eq!(e["spec"]["macAddress"], "52:54:00:00:00:01");
        // The same lease again writes nothing; a new address is a condition, not a move.
        m.lease(&grant(1, [10, 0, 0, 5])).await;
        assert_eq!(get("bmc-525400000001"), e);
        m.lease(&grant(1, [10, 0, 0, 6])).await;
        let moved = get("bmc-525400000001");
        assert_eq!(moved["spec"]["ip"], "10.0.0.5");
        assert_eq!(moved["status"]["leaseIP"], "10.0.0.6");
        let cond = |o: &Value| o["status"]["conditions"][0].clone();
        assert_eq!(cond(&moved)["type"], PINNED);
        assert_eq!(cond(&moved)["status"], "False");
        assert_eq!(cond(&moved)["reason"], "LeaseMoved");
        assert_eq!(moved["metadata"]["uid"], e["metadata"]["uid"]);
        assert_eq!(m.metrics.endpoints_moved.get(), 1);
        // Renewals of the moved lease write nothing more.
        m.lease(&grant(1, [10, 0, 0, 6])).await;
        assert_eq!(get("bmc-525400000001"), moved);
        assert_eq!(m.metrics.endpoints_moved.get(), 1);
        // Unknown prefix: counted, nothing written.
        let mut other = grant(2, [10, 0, 0, 7]);
        other.mac[0] = 0x02;
        m.lease(&other).await;
        assert_eq!(m.metrics.unknown_mac.get(), 1);
        // Its renewal is the same unknown device: not counted again.
        m.lease(&other).await;
        assert_eq!(m.metrics.unknown_mac.get(), 1);
        assert_eq!(m.metrics.endpoints_created.get(), 1);
        assert!(store.get(&m.t_endpoint, None, "bmc-025400000002").is_err());

        // Endpoint → BMC + BMCSecret: waits for the default secret, then creates both once.
        let name = "bmc-525400000001".to_string();
        assert!(matches!(m.reconcile(&name).await, Ok(Next::After(_))));
        assert!(store.get(&m.t_bmc, None, &name).is_err());
        let vendor = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMCSecret",
            "metadata": {"name": "vendor"}, "stringData": {"username": "root", "password": "calvin"}});
        store.create(&m.t_secret, vendor).await.unwrap();
        assert_eq!(m.reconcile(&name).await.unwrap(), Next::Done);
        let bmc = store.get(&m.t_bmc, None, &name).unwrap();
        assert_eq!(
            bmc["spec"]["protocol"],
            json!({"name": "Redfish", "port": 8443})
        );
        assert_eq!(bmc["spec"]["endpointRef"]["name"], name.as_str());
        assert_eq!(
            bmc["metadata"]["ownerReferences"][0]["uid"],
            e["metadata"]["uid"]
        );
        let secret = store.get(&m.t_secret, None, &name).unwrap();
        let vendor = store.get(&m.t_secret, None, "vendor").unwrap();
        assert_eq!(secret["data"], vendor["data"]);
        assert_eq!(m.reconcile(&name).await.unwrap(), Next::Done);
        assert_eq!(store.get(&m.t_bmc, None, &name).unwrap(), bmc);
        assert_eq!(m.metrics.bmcs_created.get(), 1);

        // An operator accepts the move by setting spec.ip: the condition turns True.
        let cur = get(&name);
        let mut next = (*cur).clone();
        next["spec"]["ip"] = json!("10.0.0.6");
        let p = crate::store::Part::Main;
        store
            .update_from(&m.t_endpoint, cur, next, p)
            .await
            .unwrap();
        assert_eq!(m.reconcile(&name).await.unwrap(), Next::Done);
        let accepted = get(&name);
        assert_eq!(cond(&accepted)["status"], "True");
        assert_eq!(cond(&accepted)["reason"], "Accepted");
        assert_eq!(accepted["spec"]["ip"], "10.0.0.6");
    }

    #[tokio::test]
    async fn new_endpoints_are_capped_per_interval() {
        let cap = Cap {
            max: 2,
            interval: Duration::from_secs(3600),
        };
        let (_d, store, m) = intake(cap, &[]);
        for i in 1..=5 {
            m.lease(&grant(i, [10, 0, 0, i])).await;
        }
        assert_eq!(m.metrics.endpoints_created.get(), 2);
        assert_eq!(m.metrics.capped.get(), 3);
        assert_eq!(store.list(&m.t_endpoint, None, None).0.count(), 2);
        // Known Endpoints' renewals are not new objects: not capped.
        m.lease(&grant(1, [10, 0, 0, 1])).await;
        assert_eq!(m.metrics.capped.get(), 3);
        // A new interval takes more.
        let past = std::time::Instant::now().checked_sub(Duration::from_secs(3600));
        m.window.lock().unwrap().start = past.expect("a monotonic clock an hour old");
        m.lease(&grant(3, [10, 0, 0, 3])).await;
        assert_eq!(m.metrics.endpoints_created.get(), 3);
    }

    #[tokio::test]
    async fn an_endpoint_outside_approved_bmcs_gets_no_credentials_until_approved() {
        let (_d, store, m) = intake(CAP, &["10.1.0.0/24"]);
        let vendor = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "BMCSecret",
            "metadata": {"name": "vendor"}, "stringData": {"username": "root", "password": "calvin"}});
        store.create(&m.t_secret, vendor).await.unwrap();
        m.lease(&grant(1, [10, 1, 0, 5])).await;
        m.lease(&grant(2, [10, 2, 0, 5])).await;
        let (ok, held) = (
            "bmc-525400000001".to_string(),
            "bmc-525400000002".to_string(),
        );
        let ep = store.get(&m.t_endpoint, None, &ok).unwrap();
        assert!(ep["metadata"]["labels"].get(APPROVAL_LABEL).is_none());
        let ep = store.get(&m.t_endpoint, None, &held).unwrap();
        assert_eq!(ep["metadata"]["labels"][APPROVAL_LABEL], APPROVAL_PENDING);
        for n in [&ok, &held] {
            assert_eq!(m.reconcile(n).await.unwrap(), Next::Done);
        }
        // The approved address: BMC and secret; the other: neither, and a condition.
        assert!(store.get(&m.t_bmc, None, &ok).is_ok());
        assert!(store.get(&m.t_secret, None, &ok).is_ok());
        assert!(store.get(&m.t_bmc, None, &held).is_err());
        assert!(store.get(&m.t_secret, None, &held).is_err());
        let ep = store.get(&m.t_endpoint, None, &held).unwrap();
        let c = &ep["status"]["conditions"][0];
        assert_eq!(
            (&c["type"], &c["status"]),
            (&json!(APPROVED), &json!("False"))
        );
        assert_eq!(c["reason"], "AwaitingApproval");
        assert!(!ep.to_string().contains("calvin"));
        // Again: nothing more written.
        m.reconcile(&held).await.unwrap();
        assert_eq!(store.get(&m.t_endpoint, None, &held).unwrap(), ep);
        // Approved by an operator: created, and the condition turns True.
        let mut next = (*ep).clone();
        next["metadata"]["labels"][APPROVAL_LABEL] = json!("approved");
        let p = crate::store::Part::Main;
        store.update_from(&m.t_endpoint, ep, next, p).await.unwrap();
        assert_eq!(m.reconcile(&held).await.unwrap(), Next::Done);
        assert!(store.get(&m.t_bmc, None, &held).is_ok());
        assert!(store.get(&m.t_secret, None, &held).is_ok());
        let ep = store.get(&m.t_endpoint, None, &held).unwrap();
        assert_eq!(ep["status"]["conditions"][0]["status"], "True");
        assert_eq!(m.metrics.bmcs_created.get(), 2);
    }
}
