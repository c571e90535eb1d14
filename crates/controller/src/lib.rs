//! Reconcilers, and the metal ones' controller set ([`Controllers`]: claims, servers,
//! boot configurations) on the one [`runtime`].
//!
//! The set's watches keep in-memory indexes current (claimable servers, claim →
//! bound server) and enqueue the keys each event concerns; the runtime's workers
//! take keys off the per-reconciler [`queue::WorkQueue`]s and call the reconcilers,
//! which are level-triggered and idempotent: they read the current objects, act,
//! and write with compare-and-swap; a failed reconcile is retried with backoff, and
//! a restart at any point just reconciles again from what is stored.
//!
//! The crate `bootplane-controller` (layer L4, ARCHITECTURE.md's crate map): it depends on
//! the protocol layer, the store and the model, and nothing above it (the API, the CLI,
//! config, serve) can be imported here. The `bootplane` package re-exports it as
//! `bootplane::controller`.

pub mod bmc;
pub mod bootconfig;
pub mod bootside;
pub mod claim;
pub mod cleanup;
pub mod discovery;
pub mod firstboot;
pub mod install;
pub mod inventory;
pub mod powerstate;
#[path = "provisioning.bootplane.dev/mod.rs"]
pub mod provisioning;
pub mod reports;
pub mod runtime;
pub mod server;
pub mod settings;
pub mod systems;

pub use runtime::{queue, Next};

// The layers below under their module names, for this crate's own paths
// (`crate::store::Store`, `crate::http::BootIndex`); private, so they add nothing to
// `bootplane::controller`'s API.
use bootplane_model as model;
use bootplane_proto::{dhcp, http, ignition, nfs, power, provision, redfish, shutdown, sys};
use bootplane_store as store;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views::{
    read, Candidate, PowerState, Server, ServerBootConfiguration, ServerState,
};
use crate::power::PowerDriver;
use crate::shutdown::Shutdown;
use crate::store::events::Recorder;
use crate::store::Store;
use queue::WorkQueue;
use runtime::Runtime;

pub use crate::model::meta::set_condition;
pub use settings::ControllerConfig;

/// `(namespace, name)`.
pub(crate) type Key = (String, String);

/// Finalizer the claim reconciler puts on every ServerClaim.
pub(crate) const CLAIM_FINALIZER: &str = "metal.ironcore.dev/serverclaim";

/// Decides whether a ServerBootConfiguration can be `Ready`: the boot side plugs in
/// the image catalog and Ignition validation here.
pub trait BootResolver: Send + Sync {
    /// `Ok(())` when the configuration can boot, or `Err((reason, message))`.
    fn resolve(&self, store: &Store, sbc: &Value) -> Result<(), (String, String)>;
}

/// In-memory indexes kept current by the watches.
#[derive(Default)]
pub struct Indexes {
    /// Servers that a claim could take now (state Available, unclaimed, Off, not
    /// unclaimable), by name, as [`claimable_view`]s (what choosing a candidate reads:
    /// labels and taints; the candidate itself is read from the store). A whole Server
    /// per entry cost ~10 KiB per registered machine.
    pub claimable: BTreeMap<String, Arc<Candidate>>,
    /// Claim → the server whose `spec.serverClaimRef` names it.
    pub bound: HashMap<Key, String>,
    /// The reverse of `bound`.
    pub bound_by_server: HashMap<String, Key>,
    /// Claims waiting for a server.
    pub waiting: BTreeSet<Key>,
    /// Every Server, as its [`claimable_view`] and why it cannot be claimed now (`None`:
    /// claimable): what a waiting claim's reason is computed from, without reading
    /// the store.
    pub servers: BTreeMap<String, (Arc<Candidate>, Option<String>)>,
    /// When each waiting claim's reason was last worked out (at most every
    /// [`EXPLAIN_EVERY`]).
    pub explained: HashMap<Key, std::time::Instant>,
}

/// How often a waiting claim's reason is worked out again.
pub(crate) const EXPLAIN_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The label a Server discovered from a BMC not in `discovery.approved_bmcs` carries
/// ([`APPROVAL_PENDING`]) until an operator approves it (any other value, or none): it is
/// not booted for discovery and not claimable before.
pub const APPROVAL_LABEL: &str = "bootplane.dev/approval";
/// The value of [`APPROVAL_LABEL`] that holds a Server back.
pub const APPROVAL_PENDING: &str = "pending";

/// Whether a Server waits for an operator's approval ([`APPROVAL_LABEL`]).
pub(crate) fn awaiting_approval(s: &Server) -> bool {
    s.metadata.labels.get(APPROVAL_LABEL).map(String::as_str) == Some(APPROVAL_PENDING)
}

/// Why a Server cannot be claimed now, or `None` when it can ([`is_claimable`]).
pub(crate) fn unclaimable_reason(s: &Server) -> Option<String> {
    if s.metadata.is_deleting() {
        return Some("being deleted".into());
    }
    if awaiting_approval(s) {
        return Some(format!("awaiting approval (label {APPROVAL_LABEL})"));
    }
    if let Some((ns, n)) = claim_ref(s) {
        return Some(format!("claimed by {ns}/{n}"));
    }
    if s.spec.unclaimable {
        return Some("spec.unclaimable".into());
    }
    if s.status.state != Some(ServerState::Available) {
        let state = s.status.state.as_ref().map_or("", ServerState::as_str);
        return Some(format!(
            "state {}",
            if state.is_empty() { "unset" } else { state }
        ));
    }
    if s.status.power_state != Some(PowerState::Off) {
        let power = s.status.power_state.as_ref().map_or("", PowerState::as_str);
        return Some(format!(
            "power {}",
            if power.is_empty() { "unknown" } else { power }
        ));
    }
    None
}

pub struct Controllers {
    pub store: Store,
    pub power: Arc<dyn PowerDriver>,
    pub resolver: Arc<dyn BootResolver>,
    pub claims: Arc<WorkQueue<Key>>,
    pub servers: Arc<WorkQueue<String>>,
    pub sbcs: Arc<WorkQueue<Key>>,
    pub idx: Mutex<Indexes>,
    pub t_server: Arc<ResourceType>,
    pub t_claim: Arc<ResourceType>,
    pub t_sbc: Arc<ResourceType>,
    pub t_secret: Arc<ResourceType>,
    /// First boots of Servers with a BMC (`[discovery]`), when on.
    pub first_boot: Option<firstboot::FirstBoot>,
    /// Wiping released Servers (`[cleanup]`); `None`: releases never wipe.
    pub cleanup: Option<cleanup::Cleanup>,
    /// Events: claims binding or waiting, state, power and condition changes.
    pub events: Recorder,
}

pub(crate) fn is_claimable(s: &Server) -> bool {
    s.status.state == Some(ServerState::Available)
        && !s.spec.unclaimable
        && s.status.power_state == Some(PowerState::Off)
        && s.spec.server_claim_ref.is_none()
        && !s.metadata.is_deleting()
        && !awaiting_approval(s)
}

/// The part of a Server the claimable index keeps: `metadata.labels` and
/// `spec.taints` (what a claim's selector and tolerations read).
pub(crate) fn claimable_view(s: &Server) -> Arc<Candidate> {
    Arc::new(Candidate::of(s))
}

/// The claim a Server is bound to, `(namespace, name)`: `spec.serverClaimRef` when it
/// names both.
pub(crate) fn claim_ref(s: &Server) -> Option<Key> {
    let r = s.spec.server_claim_ref.as_ref()?;
    Some((r.namespace.clone()?, r.name.clone()))
}

impl Controllers {
    pub fn new(
        store: Store,
        power: Arc<dyn PowerDriver>,
        resolver: Arc<dyn BootResolver>,
        (first_boot, cleanup): (Option<firstboot::FirstBoot>, Option<cleanup::Cleanup>),
        events: Recorder,
    ) -> Arc<Controllers> {
        let reg = store.registry();
        Arc::new(Controllers {
            power,
            resolver,
            claims: WorkQueue::new(),
            servers: WorkQueue::new(),
            sbcs: WorkQueue::new(),
            idx: Mutex::new(Indexes::default()),
            t_server: reg.resolve("server").expect("server type"),
            t_claim: reg.resolve("serverclaim").expect("claim type"),
            t_sbc: reg.resolve("serverbootconfiguration").expect("sbc type"),
            t_secret: reg.resolve("secret").expect("secret type"),
            first_boot,
            cleanup,
            events,
            store,
        })
    }

    fn on_server(&self, s: &Arc<Value>, deleted: bool) {
        let name = meta::name(s).to_string();
        let s: Server = read(s);
        let candidate = claimable_view(&s);
        let mut idx = self.idx.lock().unwrap();
        let became_claimable = !deleted && is_claimable(&s);
        if deleted {
            idx.servers.remove(&name);
        } else {
            idx.servers
                .insert(name.clone(), (candidate.clone(), unclaimable_reason(&s)));
        }
        if became_claimable {
            idx.claimable.insert(name.clone(), candidate);
        } else {
            idx.claimable.remove(&name);
        }
        if let Some(old) = idx.bound_by_server.remove(&name) {
            if idx.bound.get(&old) == Some(&name) {
                idx.bound.remove(&old);
            }
        }
        if !deleted {
            if let Some(k) = claim_ref(&s) {
                idx.bound.insert(k.clone(), name.clone());
                idx.bound_by_server.insert(name.clone(), k.clone());
                self.claims.add(k);
            }
        }
        if became_claimable {
            for k in idx.waiting.iter() {
                self.claims.add(k.clone());
            }
        }
        drop(idx);
        self.servers.add(name);
    }

    fn on_claim(&self, c: &Value) {
        let key = (
            meta::namespace(c).unwrap_or("default").to_string(),
            meta::name(c).to_string(),
        );
        self.claims.add(key);
    }

    fn on_sbc(&self, b: &Value) {
        let ns = meta::namespace(b).unwrap_or("default").to_string();
        self.sbcs.add((ns, meta::name(b).to_string()));
        let server = read::<ServerBootConfiguration>(b).spec.server_ref.name;
        if !server.is_empty() {
            self.servers.add(server);
        }
    }

    fn on_secret(&self, s: &Value) {
        let ns = meta::namespace(s).unwrap_or("default");
        let name = meta::name(s);
        let (sbcs, _) = self.store.list(&self.t_sbc, Some(ns), None);
        for b in sbcs {
            let b: ServerBootConfiguration = read(&b);
            if b.spec.ignition_secret_ref.is_some_and(|r| r.name == name) {
                self.sbcs.add((ns.to_string(), b.metadata.name));
            }
        }
    }

    /// Run the watches and reconcilers on the [`Runtime`] until shutdown.
    pub async fn run(self: Arc<Self>, workers: usize, shutdown: Shutdown) {
        let types = [
            self.t_server.clone(),
            self.t_claim.clone(),
            self.t_sbc.clone(),
            self.t_secret.clone(),
        ];
        Runtime::new(self.clone(), self.store.clone(), workers)
            .watch(types, |c: &Controllers, t, o, del| c.dispatch(t, o, del))
            .reconciler("serverclaim", self.claims.clone(), |c, k| async move {
                claim::reconcile(&c, &k).await
            })
            .reconciler("server", self.servers.clone(), |c, k| async move {
                server::reconcile(&c, &k).await
            })
            .reconciler(
                "serverbootconfiguration",
                self.sbcs.clone(),
                |c, k| async move { bootconfig::reconcile(&c, &k).await },
            )
            .run(shutdown)
            .await
    }

    fn dispatch(&self, t: &ResourceType, o: &Arc<Value>, deleted: bool) {
        match t.kind.as_str() {
            "Server" => self.on_server(o, deleted),
            "ServerClaim" => self.on_claim(o),
            "ServerBootConfiguration" => self.on_sbc(o),
            "Secret" => self.on_secret(o),
            _ => {}
        }
    }
}

/// `metadata.ownerReferences` naming `owner` (of type `rt`) as the controlling owner,
/// so deleting it cascades.
pub(crate) fn controller_ref(rt: &ResourceType, owner: &Value) -> Value {
    json!([{
        "apiVersion": rt.api_version(),
        "kind": rt.kind,
        "name": meta::name(owner),
        "uid": meta::uid(owner),
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}
