//! The BMC reconciler: keeps each `BMC`'s status current from what its Redfish service
//! says, on the one [`super::runtime`].
//!
//! Every `[power.redfish] poll_interval_secs` (and whenever the BMC or its BMCSecret
//! changes) it reads the service root, the systems, the first system's manager and
//! virtual media, and writes `status`: `state` (`Enabled` or `Error`), `manufacturer`,
//! `model`, `serialNumber`, `firmwareVersion`, `powerState`, `ip`, and the conditions
//! `Reachable` (reason `Unreachable`, `Timeout`, `TLSError`, `MalformedResponse`,
//! `BMCError`), `Authenticated` (`CredentialsRefused`), `Configured` (`BMCNotFound`,
//! `SecretNotFound`, `SecretIncomplete`, `NoAddress`, `UnsupportedProtocol`) and
//! `BootModes` (False, reason `FeatureMissing`, naming what the BMC lacks of Pxe,
//! UefiHttp and virtual media).
//!
//! With `[discovery] enabled`, each look also registers the BMC's systems as Servers
//! ([`super::systems`]), and the BMC's condition `SystemsDiscovered` says how many: at
//! most `discovery.max_systems_per_bmc` Servers name one BMC; beyond that the condition
//! is False (reason `TooManySystems`) and a Warning Event says how many were left out.
//!
//! **Invariant:** nothing written here carries a credential: the secret is read only to
//! build the client target.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

use super::queue::WorkQueue;
use super::runtime::Runtime;
use super::systems::{self, Seen, SyncError, SystemIndex};
use super::{set_condition, Next};
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views::{self, read, BmcState, Endpoint};
use crate::power::redfish::bmc_target;
use crate::redfish::{self, Bmc, PowerState};
use crate::shutdown::Shutdown;
use crate::store::{Store, StoreError};

/// What a BMC's reconcile follows besides its polling: `(generation, annotations)`.
type SpecSeen = (i64, BTreeMap<String, String>);

/// The BMC controller set.
pub struct BmcControllers {
    store: Store,
    pool: redfish::Pool,
    poll: Duration,
    queue: Arc<WorkQueue<String>>,
    /// BMCSecret → the BMCs naming it.
    by_secret: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Endpoint → the BMCs naming it in `spec.endpointRef` (a moved lease reaches its BMC
    /// at once, not at the next poll).
    by_endpoint: Mutex<HashMap<String, BTreeSet<String>>>,
    t_endpoint: Arc<ResourceType>,
    /// Per BMC, the generation and annotations last seen: its own status writes (which
    /// change neither) do not make it look at the BMC again.
    seen_spec: Mutex<HashMap<String, SpecSeen>>,
    t_bmc: Arc<ResourceType>,
    t_secret: Arc<ResourceType>,
    t_server: Arc<ResourceType>,
    /// Register the BMCs' systems as Servers (`[discovery] enabled`): `Some`.
    discover: Option<Discover>,
    systems: SystemIndex,
    seen: Seen,
    /// Warning Events (too many systems).
    events: crate::store::events::Recorder,
}

use crate::discovery::settings::Discover;

/// What one look at a BMC found.
#[derive(Default)]
struct Observed {
    manufacturer: Option<String>,
    model: Option<String>,
    serial: Option<String>,
    firmware: Option<String>,
    power: Option<PowerState>,
    missing: Vec<&'static str>,
    systems: usize,
    /// The `@odata.id`s of the systems the BMC lists.
    ids: Vec<String>,
}

impl BmcControllers {
    pub fn new(
        store: Store,
        pool: redfish::Pool,
        poll: Duration,
        discover: Option<Discover>,
    ) -> Arc<BmcControllers> {
        let reg = store.registry();
        Arc::new(BmcControllers {
            events: crate::store::events::Recorder::spawn(store.clone(), "bootplane-bmc"),
            t_bmc: reg.resolve("bmc").expect("bmc type"),
            t_secret: reg.resolve("bmcsecret").expect("bmcsecret type"),
            t_server: reg.resolve("server").expect("server type"),
            discover,
            systems: SystemIndex::default(),
            seen: Seen::default(),
            store,
            pool,
            poll,
            queue: WorkQueue::new(),
            by_secret: Mutex::new(HashMap::new()),
            by_endpoint: Mutex::new(HashMap::new()),
            seen_spec: Mutex::new(HashMap::new()),
            t_endpoint: reg.resolve("endpoint").expect("endpoint type"),
        })
    }

    pub async fn run(self: Arc<Self>, workers: usize, shutdown: Shutdown) {
        let mut types = vec![
            self.t_bmc.clone(),
            self.t_secret.clone(),
            self.t_endpoint.clone(),
        ];
        if self.discover.is_some() {
            types.push(self.t_server.clone());
        }
        Runtime::new(self.clone(), self.store.clone(), workers.clamp(1, 64))
            .watch(types, |c: &BmcControllers, t, o, del| c.dispatch(t, o, del))
            .reconciler("bmc", self.queue.clone(), |c, k| async move {
                c.reconcile(&k).await
            })
            .run(shutdown)
            .await;
    }

    fn dispatch(&self, t: &ResourceType, o: &Arc<Value>, deleted: bool) {
        let name = meta::name(o).to_string();
        if t.kind == "Server" {
            self.systems.on_server(o, deleted);
            return;
        }
        match t.kind.as_str() {
            "BMC" => {
                let b: views::Bmc = read(o);
                let (secret, endpoint) = b.refs();
                for (idx, target) in [(&self.by_secret, secret), (&self.by_endpoint, endpoint)] {
                    let mut idx = idx.lock().unwrap();
                    for set in idx.values_mut() {
                        set.remove(&name);
                    }
                    if !deleted && !target.is_empty() {
                        idx.entry(target.to_string())
                            .or_default()
                            .insert(name.clone());
                    }
                }
                let mut seen = self.seen_spec.lock().unwrap();
                if deleted {
                    seen.remove(&name);
                    drop(seen);
                    self.seen.forget(&name);
                } else {
                    let now = (b.metadata.generation, b.metadata.annotations.clone());
                    if seen.get(&name) != Some(&now) {
                        seen.insert(name.clone(), now);
                        drop(seen);
                        self.queue.add(name);
                    }
                }
            }
            kind => {
                let idx = if kind == "Endpoint" {
                    &self.by_endpoint
                } else {
                    &self.by_secret
                };
                let bmcs = idx.lock().unwrap().get(&name).cloned().unwrap_or_default();
                for b in bmcs {
                    self.queue.add(b);
                }
            }
        }
    }

    fn next_poll(&self) -> Next {
        let jitter = rand::thread_rng().gen_range(Duration::ZERO..=self.poll / 10);
        Next::After(self.poll + jitter)
    }

    async fn reconcile(&self, name: &str) -> Result<Next, StoreError> {
        let bmc = match self.store.get(&self.t_bmc, None, name) {
            Ok(b) => b,
            Err(StoreError::NotFound { .. }) => return Ok(Next::Done),
            Err(e) => return Err(e),
        };
        if meta::is_deleting(&bmc) {
            return Ok(Next::Done);
        }
        let mut st = bmc.get("status").cloned().unwrap_or_else(|| json!({}));
        if let Some(ip) = self.address(&bmc) {
            st["ip"] = json!(ip);
        }
        match bmc_target(&self.store, &bmc) {
            Err(e) => {
                st["state"] = json!(BmcState::Error);
                set_condition(&mut st, "Configured", false, e.reason(), &e.to_string());
            }
            Ok(target) => {
                set_condition(
                    &mut st,
                    "Configured",
                    true,
                    "Resolved",
                    "address and credentials found",
                );
                let client = self.pool.bmc(target);
                match observe(&client).await {
                    Ok(o) => {
                        write_observed(&mut st, &o);
                        if let Some(d) = &self.discover {
                            let ok = self.address(&bmc).is_some_and(|a| d.approved.contains(&a));
                            let new = (&*bmc, !ok);
                            self.sync_systems(new, &client, &o.ids, &mut st).await?;
                        }
                    }
                    Err(e) => write_error(&mut st, &e),
                }
            }
        }
        if Some(&st) != bmc.get("status") {
            match self.store.update_status(&self.t_bmc, &bmc, st).await {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.next_poll())
    }
}

impl BmcControllers {
    /// The BMC's IP: `spec.access.ip`, else its Endpoint's `spec.ip`.
    fn address(&self, bmc: &Value) -> Option<String> {
        let bmc: views::Bmc = read(bmc);
        if let Some(ip) = bmc.spec.access.and_then(|a| a.ip) {
            return Some(ip);
        }
        let ep = bmc.spec.endpoint_ref?;
        let e = self.store.get(&self.t_endpoint, None, &ep.name).ok()?;
        read::<Endpoint>(&e).spec.ip
    }

    /// Register the BMC's systems as Servers; the outcome goes into the BMC's
    /// `SystemsDiscovered` condition (a Redfish failure there too; a store failure is
    /// the reconcile's error, retried).
    /// `bmc`: the BMC, and whether its new Servers wait for approval.
    async fn sync_systems(
        &self,
        (obj, pending): (&Value, bool),
        client: &Bmc,
        ids: &[String],
        st: &mut Value,
    ) -> Result<(), StoreError> {
        let max = self.discover.as_ref().map_or(0, |d| d.max_systems);
        let r = systems::sync(
            &self.store,
            &self.t_server,
            (&self.systems, &self.seen),
            (meta::name(obj), pending, max),
            client,
            ids,
        )
        .await;
        match r {
            Ok(s) => {
                let mut msg = format!(
                    "{} system(s) registered as Servers",
                    ids.len().saturating_sub(s.without_uuid + s.capped)
                );
                if s.created > 0 {
                    msg.push_str(&format!(", {} new", s.created));
                }
                if s.gone > 0 {
                    msg.push_str(&format!("; {} Server(s) whose system is gone", s.gone));
                }
                if s.without_uuid > 0 {
                    msg.push_str(&format!(
                        "; {} system(s) without a UUID skipped",
                        s.without_uuid
                    ));
                }
                if s.capped > 0 {
                    let msg = format!("the BMC lists {} system(s), more than discovery.max_systems_per_bmc ({max}) Servers may name one BMC: {} not registered; {msg}", ids.len(), s.capped);
                    let was = condition_reason(st, "SystemsDiscovered");
                    set_condition(st, "SystemsDiscovered", false, "TooManySystems", &msg);
                    if was.as_deref() != Some("TooManySystems") {
                        tracing::warn!(bmc = meta::name(obj), listed = ids.len(), max, "a BMC lists more systems than discovery.max_systems_per_bmc; the rest are not registered");
                        self.events.warning(&self.t_bmc, obj, "TooManySystems", msg);
                    }
                } else {
                    set_condition(st, "SystemsDiscovered", true, "Registered", &msg);
                }
            }
            Err(SyncError::Redfish(e)) => {
                set_condition(st, "SystemsDiscovered", false, e.reason(), &e.to_string());
            }
            Err(SyncError::Store(e)) => return Err(e),
        }
        Ok(())
    }
}

/// The reason of condition `ty` in `st`, when there is one.
fn condition_reason(st: &Value, ty: &str) -> Option<String> {
    st.get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)?
        .get("reason")?
        .as_str()
        .map(String::from)
}

/// Read what the status shows from the BMC.
async fn observe(bmc: &Bmc) -> Result<Observed, redfish::Error> {
    let root = bmc.service_root().await?;
    let ids = bmc.systems().await?;
    let mut o = Observed {
        manufacturer: root.vendor.clone(),
        model: root.product.clone(),
        systems: ids.len(),
        ids: ids.clone(),
        ..Observed::default()
    };
    let Some(first) = ids.first() else {
        return Ok(o);
    };
    let sys = bmc.system(first).await?;
    o.manufacturer = sys.manufacturer.clone().or(o.manufacturer);
    o.model = sys.model.clone().or(o.model);
    o.serial = sys.serial_number.clone();
    o.power = sys.power_state;
    if let Some(m) = sys.managers.first() {
        if let Ok(m) = bmc.manager(m).await {
            o.firmware = m.firmware_version;
            o.manufacturer = m.manufacturer.or(o.manufacturer);
            o.model = m.model.or(o.model);
        }
    }
    let allowed = &sys.boot.allowed_targets;
    for t in ["Pxe", "UefiHttp"] {
        if !allowed.is_empty() && !allowed.iter().any(|a| a == t) {
            o.missing.push(t);
        }
    }
    let has_cd = match bmc.virtual_media(&sys).await {
        Ok(v) => v
            .iter()
            .any(|d| d.media_types.iter().any(|t| t == "CD" || t == "DVD")),
        Err(redfish::Error::Unsupported(_)) => false,
        Err(e) => return Err(e),
    };
    if !has_cd {
        o.missing.push("VirtualMedia");
    }
    Ok(o)
}

fn write_observed(st: &mut Value, o: &Observed) {
    st["state"] = json!(BmcState::Enabled);
    for (k, v) in [
        ("manufacturer", &o.manufacturer),
        ("model", &o.model),
        ("serialNumber", &o.serial),
        ("firmwareVersion", &o.firmware),
    ] {
        if let Some(v) = v {
            st[k] = json!(v);
        }
    }
    if let Some(p) = o.power {
        st["powerState"] = json!(p.as_str());
    }
    answered(st);
    set_condition(
        st,
        "Authenticated",
        true,
        "CredentialsAccepted",
        &format!("credentials accepted; {} system(s)", o.systems),
    );
    if o.missing.is_empty() {
        set_condition(
            st,
            "BootModes",
            true,
            "Available",
            "Pxe, UefiHttp and virtual media available",
        );
    } else {
        let msg = format!(
            "the BMC lacks {} (one-time boots asking for it fall back to Pxe)",
            o.missing.join(", ")
        );
        set_condition(st, "BootModes", false, "FeatureMissing", &msg);
    }
}

/// The BMC answered (whatever it said).
fn answered(st: &mut Value) {
    set_condition(
        st,
        "Reachable",
        true,
        "Answered",
        "the Redfish service answered",
    );
}

fn write_error(st: &mut Value, e: &redfish::Error) {
    st["state"] = json!(BmcState::Error);
    let msg = e.to_string();
    match e {
        redfish::Error::Unauthorized(_) | redfish::Error::AuthThrottled { .. } => {
            answered(st);
            set_condition(st, "Authenticated", false, e.reason(), &msg);
        }
        _ => {
            set_condition(st, "Reachable", false, e.reason(), &msg);
        }
    }
}
