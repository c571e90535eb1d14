//! The `redfish` power driver: Servers whose spec names a BMC (`spec.bmcRef` → `BMC` →
//! `BMCSecret`, or inline `spec.bmc`) are powered through it, the others by the
//! configured driver ([`PerServer`] chooses per Server, so a fleet can mix them).
//!
//! - **Asynchronous, one operation per Server**: [`Redfish::set_power`] is called by
//!   the Server reconciler and returns at once (`Pending`); a task per Server drives
//!   the BMC (one-time boot override, reset, waiting for the reported state) and
//!   writes `status.powerState` and the `PowerReady` / `BootOverride` conditions when
//!   done. A second call for the same state joins the running operation; a call for
//!   the other state supersedes it (the old task stops at its next step).
//! - **On**: the one-time network boot chosen by the Server's annotation
//!   `bootplane.dev/boot-mode` (`Pxe`, `UefiHttp`, `VirtualMedia`, `None`; default
//!   `[power.redfish] boot_mode`), then `Reset On`, then the BMC is polled until it
//!   reports On. `UefiHttp` sets `HttpBootUri` to the machine's own signed URL on the
//!   boot listener; `VirtualMedia` inserts the machine's signed boot ISO, boots `Cd`
//!   once and ejects the media once the machine has fetched its script (or at the next
//!   power-off). A BMC lacking the mode falls back to `Pxe` (and `Pxe` to the
//!   machine's own boot order) with condition `BootOverride` False, reason
//!   `ModeUnsupported`.
//! - **Off**: `GracefulShutdown`, then `ForceOff` after `shutdown_timeout_secs`.
//! - **Failures** set `PowerReady` False with the reason (`Unreachable`,
//!   `CredentialsRefused`, `BMCNotFound`, ...) and are retried with exponential backoff
//!   and jitter up to `retry_max_secs` between attempts, re-reading the BMC and its
//!   secret each time (a fixed secret is picked up without a restart).
//! - **Polling** ([`Redfish::run`]): every `poll_interval_secs` the power state of each
//!   Server with a BMC is read and a change made behind bootplane's back is written to
//!   `status.powerState` with `PowerReady` False, reason `ChangedOutsideBootplane`; the
//!   Server reconciler then applies `spec.power` again where it must.
//!
//! **Invariant:** credentials are read from the store for each attempt and live only in
//! [`crate::redfish::Target`] (whose password prints as `<redacted>`); no message this
//! driver writes or logs carries them.

pub mod metrics;
mod resolve;
mod settings;

pub use resolve::{bmc_target, has_bmc, scheme_of, server_target, ResolveError};
pub use settings::*;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rand::Rng;
use serde_json::{json, Value};

use super::{Outcome, Power, PowerDriver};
use crate::model::meta::{self, set_condition};
use crate::model::registry::ResourceType;
use crate::redfish::{self, Bmc, BootOverride, BootTarget, PowerState, ResetType, System};
use crate::shutdown::Shutdown;
use crate::store::{Modified, Store, StoreError};

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Redfish(#[from] redfish::Error),
    #[error("the BMC did not report {0} within {1} s")]
    NotReached(&'static str, u64),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl AttemptError {
    fn reason(&self) -> &'static str {
        match self {
            AttemptError::Resolve(e) => e.reason(),
            AttemptError::Redfish(e) => e.reason(),
            AttemptError::NotReached(..) => "StateNotReached",
            AttemptError::Store(_) => "StoreError",
        }
    }
}

/// What the boot override did.
struct BootNote {
    asked: BootMode,
    used: BootMode,
    message: String,
}

/// The most systems of one BMC read to find a Server's (blade chassis hold tens).
const MAX_SYSTEMS: usize = 1024;

/// What an operation brings a Server to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Power(Power),
    /// Restart (or start) it with the one-time boot.
    Reset,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Power(p) => p.as_str(),
            Action::Reset => "Reset",
        }
    }
    /// The power state once done.
    fn ends(self) -> Power {
        match self {
            Action::Power(p) => p,
            Action::Reset => Power::On,
        }
    }
}

/// A running (or backing-off) operation on one Server.
struct Op {
    want: Action,
    gen: u64,
    message: String,
    /// The reason of the last failure, while retrying.
    failing: Option<&'static str>,
}

impl Op {
    fn outcome(&self) -> Outcome {
        match self.failing {
            Some(r) => Outcome::Retrying(r, self.message.clone()),
            None => Outcome::Pending(self.message.clone()),
        }
    }
}

/// See the module doc.
pub struct Redfish {
    me: Weak<Redfish>,
    /// Power and boot-override changes written here, as Events on the Server.
    events: crate::store::events::Recorder,
    store: Store,
    pool: redfish::Pool,
    cfg: RedfishConfig,
    targets: Arc<dyn BootTargets>,
    handle: tokio::runtime::Handle,
    ops: Mutex<HashMap<String, Op>>,
    gen: AtomicU64,
    /// `base_url` → system UUID (lowercase) → `@odata.id`.
    systems: Mutex<HashMap<String, HashMap<String, String>>>,
    /// `base_url` → the gate one listing of its systems holds.
    listing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    t_server: Arc<ResourceType>,
    t_sbc: Arc<ResourceType>,
    metrics: Arc<metrics::Metrics>,
}

impl Redfish {
    /// Must be called on the runtime the operations run on.
    pub fn new(
        store: Store,
        cfg: RedfishConfig,
        targets: Arc<dyn BootTargets>,
        metrics: Arc<metrics::Metrics>,
    ) -> anyhow::Result<Arc<Redfish>> {
        cfg.validate()?;
        let pool = redfish::Pool::new(cfg.client_settings()?)?;
        let reg = store.registry();
        let (t_server, t_sbc) = (
            reg.resolve("server").expect("server type"),
            reg.resolve("serverbootconfiguration").expect("sbc type"),
        );
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("the redfish driver needs a tokio runtime"))?;
        Ok(Arc::new_cyclic(|me| Redfish {
            me: me.clone(),
            events: crate::store::events::Recorder::spawn(store.clone(), "bootplane-redfish"),
            store,
            pool,
            cfg,
            targets,
            handle,
            ops: Mutex::new(HashMap::new()),
            gen: AtomicU64::new(0),
            systems: Mutex::new(HashMap::new()),
            listing: Mutex::new(HashMap::new()),
            t_server,
            t_sbc,
            metrics,
        }))
    }

    /// The client pool (shared with the BMC reconciler, so the limits are global).
    pub fn pool(&self) -> &redfish::Pool {
        &self.pool
    }

    pub fn config(&self) -> &RedfishConfig {
        &self.cfg
    }

    /// Operations running or backing off now.
    pub fn in_flight(&self) -> usize {
        self.ops.lock().unwrap().len()
    }

    fn boot_mode(&self, server: &Value) -> BootMode {
        server
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(BOOT_MODE_ANNOTATION))
            .and_then(Value::as_str)
            .and_then(BootMode::parse)
            .unwrap_or(self.cfg.boot_mode)
    }

    fn start(&self, name: &str, want: Action, message: String) -> Outcome {
        let mut ops = self.ops.lock().unwrap();
        if let Some(op) = ops.get(name) {
            if op.want == want {
                return op.outcome();
            }
        }
        let gen = self.gen.fetch_add(1, Ordering::Relaxed) + 1;
        ops.insert(
            name.to_string(),
            Op {
                want,
                gen,
                message: message.clone(),
                failing: None,
            },
        );
        self.metrics.operations_active.set(ops.len() as i64);
        if let Some(me) = self.me.upgrade() {
            self.handle.spawn(me.drive(name.to_string(), want, gen));
        }
        Outcome::Pending(message)
    }

    fn current(&self, name: &str, gen: u64) -> bool {
        self.ops
            .lock()
            .unwrap()
            .get(name)
            .is_some_and(|o| o.gen == gen)
    }

    /// Drive one operation to its end, retrying with backoff.
    async fn drive(self: Arc<Self>, name: String, want: Action, gen: u64) {
        let mut delay = Duration::from_secs(1);
        let cap = Duration::from_secs(self.cfg.retry_max_secs);
        let mut attempt = 0u32;
        while self.current(&name, gen) {
            attempt += 1;
            let r = self.attempt(&name, want).await;
            let result = match &r {
                Ok(_) => "ok",
                Err(e) => e.reason(),
            };
            self.metrics
                .attempts
                .get_or_create(&metrics::AttemptLabels {
                    action: want.as_str().into(),
                    result: result.into(),
                })
                .inc();
            match r {
                Ok(note) => {
                    self.record_done(&name, gen, want, note).await;
                    return;
                }
                Err(e) => {
                    let msg = format!("redfish: {} failed (attempt {attempt}): {e}", want.as_str());
                    tracing::warn!(server = %name, reason = e.reason(), "{msg}");
                    if let Some(op) = self.ops.lock().unwrap().get_mut(&name) {
                        if op.gen == gen {
                            op.message = msg.clone();
                            op.failing = Some(e.reason());
                        }
                    }
                    self.write_status(&name, |_, st| {
                        set_condition(st, "PowerReady", false, e.reason(), &msg);
                        true
                    })
                    .await;
                    let wait = rand::thread_rng().gen_range(delay / 2..=delay);
                    tokio::time::sleep(wait).await;
                    delay = (delay * 2).min(cap);
                }
            }
        }
    }

    /// One try at bringing the Server to `want`.
    async fn attempt(&self, name: &str, want: Action) -> Result<Option<BootNote>, AttemptError> {
        let server = match self.store.get(&self.t_server, None, name) {
            Ok(s) => s,
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (_, target) = server_target(&self.store, &server)?;
        let base = target.base_url.clone();
        let bmc = self.pool.bmc(target);
        let sys = self.system_of(&bmc, &base, &server).await?;
        match want {
            Action::Power(Power::On) | Action::Reset => {
                let on = sys.power_state == Some(PowerState::On);
                if on && want != Action::Reset {
                    return Ok(None);
                }
                let note = self.one_time_boot(&bmc, &sys, &server).await?;
                let kind = if !on {
                    ResetType::On
                } else if sys.reset_types.is_empty()
                    || sys.reset_types.iter().any(|t| t == "ForceRestart")
                {
                    ResetType::ForceRestart
                } else {
                    ResetType::PowerCycle
                };
                bmc.reset(&sys, kind).await?;
                let secs = self.cfg.power_wait_secs;
                if !self.wait_for(&bmc, &sys, PowerState::On, secs).await? {
                    return Err(AttemptError::NotReached("On", secs));
                }
                if note.used == BootMode::VirtualMedia {
                    if let Some(me) = self.me.upgrade() {
                        self.handle.spawn(me.eject_after_boot(
                            name.to_string(),
                            bmc.clone(),
                            sys.clone(),
                        ));
                    }
                }
                Ok(Some(note))
            }
            Action::Power(Power::Off) => {
                if sys.power_state != Some(PowerState::Off) {
                    self.power_off(&bmc, &sys).await?;
                }
                self.eject_ours(&bmc, &sys).await?;
                Ok(None)
            }
        }
    }

    /// The Server's system on its BMC: `spec.systemURI`, else by `spec.systemUUID`
    /// (the BMC's systems are listed once and remembered), else the only one.
    async fn system_of(
        &self,
        bmc: &Bmc,
        base: &str,
        server: &Value,
    ) -> Result<System, redfish::Error> {
        if let Some(uri) = server.pointer("/spec/systemURI").and_then(Value::as_str) {
            if !uri.is_empty() {
                return bmc.system(uri).await;
            }
        }
        let uuid = server
            .pointer("/spec/systemUUID")
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .map(str::to_ascii_lowercase);
        let Some(uuid) = uuid else {
            return bmc.find_system(None).await;
        };
        let base = base.to_string();
        let cached = |me: &Self| {
            me.systems
                .lock()
                .unwrap()
                .get(&base)
                .and_then(|m| m.get(&uuid).cloned())
        };
        let matches =
            |s: &System| s.uuid.as_deref().map(str::to_ascii_lowercase).as_deref() == Some(&uuid);
        if let Some(id) = cached(self) {
            if let Ok(s) = bmc.system(&id).await {
                if matches(&s) {
                    return Ok(s);
                }
            }
        }
        // One listing per BMC at a time: the Servers of a BMC looked up together wait
        // for the first one's listing instead of each listing every system.
        let gate = self
            .listing
            .lock()
            .unwrap()
            .entry(base.clone())
            .or_default()
            .clone();
        let _one = gate.lock().await;
        if let Some(id) = cached(self) {
            if let Ok(s) = bmc.system(&id).await {
                if matches(&s) {
                    return Ok(s);
                }
            }
        }
        // List the BMC's systems once for every Server on it.
        let mut found = None;
        let mut index = HashMap::new();
        // Bounded: a BMC listing more systems than any chassis holds is read only up
        // to MAX_SYSTEMS (each costs a request).
        for id in bmc.systems().await?.into_iter().take(MAX_SYSTEMS) {
            let s = bmc.system(&id).await?;
            if let Some(u) = &s.uuid {
                let u = u.to_ascii_lowercase();
                if u == uuid {
                    found = Some(s.clone());
                }
                index.insert(u, id);
            }
        }
        self.systems.lock().unwrap().insert(base, index);
        found.ok_or_else(|| {
            redfish::Error::Unsupported(format!("a system with UUID {uuid} (not on this BMC)"))
        })
    }

    /// Poll the BMC until it reports `want`, for at most `secs` seconds.
    async fn wait_for(
        &self,
        bmc: &Bmc,
        sys: &System,
        want: PowerState,
        secs: u64,
    ) -> Result<bool, AttemptError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut every = Duration::from_millis(500);
        loop {
            let s = bmc.system(&sys.odata_id).await?;
            if s.power_state == Some(want) {
                return Ok(true);
            }
            if tokio::time::Instant::now() + every > deadline {
                return Ok(false);
            }
            tokio::time::sleep(every).await;
            every = (every * 2).min(Duration::from_secs(5));
        }
    }

    /// Graceful shutdown (when the BMC offers it), `ForceOff` after the timeout.
    async fn power_off(&self, bmc: &Bmc, sys: &System) -> Result<(), AttemptError> {
        let graceful =
            sys.reset_types.is_empty() || sys.reset_types.iter().any(|t| t == "GracefulShutdown");
        if graceful && self.cfg.shutdown_timeout_secs > 0 {
            bmc.reset(sys, ResetType::GracefulShutdown).await?;
            if self
                .wait_for(bmc, sys, PowerState::Off, self.cfg.shutdown_timeout_secs)
                .await?
            {
                return Ok(());
            }
            tracing::info!(system = %sys.odata_id, "graceful shutdown timed out: ForceOff");
        }
        bmc.reset(sys, ResetType::ForceOff).await?;
        if self
            .wait_for(bmc, sys, PowerState::Off, self.cfg.power_wait_secs)
            .await?
        {
            Ok(())
        } else {
            Err(AttemptError::NotReached("Off", self.cfg.power_wait_secs))
        }
    }

    /// Set the one-time boot the Server asks for, falling back when the BMC lacks it.
    async fn one_time_boot(
        &self,
        bmc: &Bmc,
        sys: &System,
        server: &Value,
    ) -> Result<BootNote, redfish::Error> {
        let name = meta::name(server);
        let asked = self.boot_mode(server);
        let mut why = String::new();
        let mut mode = asked;
        loop {
            let r = match mode {
                BootMode::None => {
                    return Ok(BootNote {
                        asked,
                        used: mode,
                        message: if why.is_empty() {
                            "no one-time boot override asked for".into()
                        } else {
                            format!("{why}; booting by the machine's own boot order")
                        },
                    })
                }
                BootMode::Pxe => self.set_override(bmc, sys, BootTarget::Pxe, None).await,
                BootMode::UefiHttp => {
                    match self
                        .targets
                        .http_boot_uri(name, self.cfg.http_boot_artifact)
                    {
                        Some(uri) => {
                            self.set_override(bmc, sys, BootTarget::UefiHttp, Some(uri))
                                .await
                        }
                        None => Err(redfish::Error::Unsupported(
                            "UefiHttp here: the boot listener is disabled".into(),
                        )),
                    }
                }
                BootMode::VirtualMedia => self.insert_boot_media(bmc, sys, name).await,
            };
            match r {
                Ok(()) => {
                    let message = if why.is_empty() {
                        format!("one-time boot {} set", mode.as_str())
                    } else {
                        format!("{why}; one-time boot {} set instead", mode.as_str())
                    };
                    return Ok(BootNote {
                        asked,
                        used: mode,
                        message,
                    });
                }
                Err(redfish::Error::Unsupported(what)) => {
                    if !why.is_empty() {
                        why.push_str("; ");
                    }
                    why.push_str(&format!("{} not possible: BMC lacks {what}", mode.as_str()));
                    mode = match mode {
                        BootMode::UefiHttp | BootMode::VirtualMedia => BootMode::Pxe,
                        _ => BootMode::None,
                    };
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn set_override(
        &self,
        bmc: &Bmc,
        sys: &System,
        target: BootTarget,
        uri: Option<String>,
    ) -> Result<(), redfish::Error> {
        let o = BootOverride {
            target,
            once: true,
            http_boot_uri: uri,
            mode: None,
        };
        bmc.set_boot_override(sys, &o).await
    }

    /// Insert the machine's boot ISO into a CD/DVD virtual media device and boot `Cd`
    /// once.
    async fn insert_boot_media(
        &self,
        bmc: &Bmc,
        sys: &System,
        name: &str,
    ) -> Result<(), redfish::Error> {
        let Some(uri) = self.targets.media_uri(name) else {
            return Err(redfish::Error::Unsupported(
                "VirtualMedia here: the boot listener is disabled".into(),
            ));
        };
        let devices = bmc.virtual_media(sys).await?;
        let vm = devices
            .iter()
            .find(|d| d.media_types.iter().any(|t| t == "CD" || t == "DVD"))
            .ok_or_else(|| {
                redfish::Error::Unsupported("a CD or DVD virtual media device".into())
            })?;
        if vm.inserted {
            bmc.eject_media(vm).await?;
        }
        bmc.insert_media(vm, &uri).await?;
        self.set_override(bmc, sys, BootTarget::Cd, None).await
    }

    /// Eject media bootplane inserted.
    async fn eject_ours(&self, bmc: &Bmc, sys: &System) -> Result<(), redfish::Error> {
        let devices = match bmc.virtual_media(sys).await {
            Ok(d) => d,
            Err(redfish::Error::Unsupported(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        for vm in devices {
            if vm.inserted && vm.image.as_deref().is_some_and(|i| self.targets.owns(i)) {
                bmc.eject_media(&vm).await?;
            }
        }
        Ok(())
    }

    /// After a virtual-media boot: eject the ISO once the machine has fetched its
    /// script (its boot configuration's `IPXEScriptFetched`), so the next boot does
    /// not start from it again; gives up after `power_wait_secs` (the power-off ejects).
    async fn eject_after_boot(self: Arc<Self>, name: String, bmc: Bmc, sys: System) {
        let deadline =
            tokio::time::Instant::now() + Duration::from_secs(self.cfg.power_wait_secs.max(600));
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if self.script_fetched(&name) {
                match self.eject_ours(&bmc, &sys).await {
                    Ok(()) => {
                        tracing::info!(server = %name, "virtual media ejected after the boot")
                    }
                    Err(e) => tracing::warn!(server = %name, "ejecting virtual media: {e}"),
                }
                return;
            }
        }
    }

    fn script_fetched(&self, name: &str) -> bool {
        let Ok(s) = self.store.get(&self.t_server, None, name) else {
            return false;
        };
        let Some(r) = s.pointer("/spec/bootConfigurationRef") else {
            return false;
        };
        let ns = r
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let n = r.get("name").and_then(Value::as_str).unwrap_or("");
        self.store
            .get(&self.t_sbc, Some(ns), n)
            .ok()
            .and_then(|b| {
                b.pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .map(|l| {
                        l.iter().any(|c| {
                            c.get("type").and_then(Value::as_str) == Some("IPXEScriptFetched")
                                && c.get("status").and_then(Value::as_str) == Some("True")
                        })
                    })
            })
            .unwrap_or(false)
    }

    /// Write the result of a finished operation, then forget it.
    async fn record_done(&self, name: &str, gen: u64, want: Action, note: Option<BootNote>) {
        if self.current(name, gen) {
            self.write_status(name, |_, st| {
                st["powerState"] = json!(want.ends().as_str());
                set_condition(
                    st,
                    "PowerReady",
                    true,
                    "Applied",
                    &format!("power {} applied through the BMC (redfish)", want.as_str()),
                );
                if let Some(n) = &note {
                    let ok = n.used == n.asked;
                    let reason = if ok { "Set" } else { "ModeUnsupported" };
                    set_condition(st, "BootOverride", ok, reason, &n.message);
                }
                true
            })
            .await;
        }
        let mut ops = self.ops.lock().unwrap();
        if ops.get(name).is_some_and(|o| o.gen == gen) {
            ops.remove(name);
        }
        self.metrics.operations_active.set(ops.len() as i64);
    }

    /// Read-modify-write of a Server's status (retried on conflicts): `f` changes the
    /// status of the Server as it is now, or returns false to leave it; whether it was
    /// written.
    async fn write_status(&self, name: &str, f: impl Fn(&Value, &mut Value) -> bool) -> bool {
        let r = (self.store)
            .modify_status(&self.t_server, None, name, |cur, st| f(cur, st))
            .await;
        match r {
            Ok(Modified::Written { before, after }) => {
                let old = before.get("status");
                (self.events).status_change(&self.t_server, &before, old, &after["status"]);
                true
            }
            Ok(Modified::Unchanged(_)) | Err(StoreError::NotFound { .. }) => false,
            Err(e) => {
                tracing::warn!(server = %name, "writing power status: {e}");
                false
            }
        }
    }

    /// Read every Server's power state from its BMC every `poll_interval_secs`, until
    /// shutdown.
    pub async fn run(self: Arc<Self>, mut shutdown: Shutdown) {
        let every = Duration::from_secs(self.cfg.poll_interval_secs);
        loop {
            let jitter = rand::thread_rng().gen_range(Duration::ZERO..=every / 10);
            tokio::select! {
                _ = shutdown.recv() => return,
                _ = tokio::time::sleep(every + jitter) => {}
            }
            self.poll_once().await;
        }
    }

    /// One pass over the Servers with a BMC (no operation running for them).
    pub(crate) async fn poll_once(&self) {
        let names: Vec<String> = {
            let (objs, _) = self.store.list(&self.t_server, None, None);
            objs.filter(|s| has_bmc(s) && !meta::is_deleting(s))
                .map(|s| meta::name(&s).to_string())
                .collect()
        };
        let limit = Arc::new(tokio::sync::Semaphore::new(self.cfg.global_concurrency));
        let mut set = tokio::task::JoinSet::new();
        for name in names {
            if self.ops.lock().unwrap().contains_key(&name) {
                continue;
            }
            let Some(me) = self.me.upgrade() else { return };
            let permit = limit.clone().acquire_owned().await.expect("open");
            set.spawn(async move {
                me.poll_server(&name).await;
                drop(permit);
            });
        }
        while set.join_next().await.is_some() {}
    }

    async fn poll_server(&self, name: &str) {
        let Ok(server) = self.store.get(&self.t_server, None, name) else {
            return;
        };
        let Ok((_, target)) = server_target(&self.store, &server) else {
            return;
        };
        let base = target.base_url.clone();
        let bmc = self.pool.bmc(target);
        let observed = match self.system_of(&bmc, &base, &server).await {
            Ok(s) => s.power_state,
            Err(e) => {
                tracing::debug!(server = %name, "power poll: {e}");
                return;
            }
        };
        self.metrics.polls.inc();
        let observed = match observed {
            Some(PowerState::On) => Power::On,
            Some(PowerState::Off) => Power::Off,
            _ => return,
        };
        self.record_observed(&server, observed).await;
    }

    /// Record the power state `observed` of the Server read as `read` (before the BMC was
    /// asked) when it differs from the state recorded then.
    ///
    /// **Invariant:** an observation never overwrites a later write. The answer may have
    /// been read from the BMC before an operation changed the power and arrive after the
    /// operation recorded its result (a loaded appliance, a slow BMC): it is written only
    /// while the Server is still the version read before asking, with no operation
    /// running, and is otherwise dropped (the next poll asks again). A stale `Off` would
    /// end the boot just started (its boot generation moves on and its signed URLs die).
    async fn record_observed(&self, read: &Value, observed: Power) {
        let name = meta::name(read);
        let recorded = read.pointer("/status/powerState").and_then(Value::as_str);
        if recorded == Some(observed.as_str()) || self.ops.lock().unwrap().contains_key(name) {
            return;
        }
        let version = meta::resource_version(read);
        let msg = format!(
            "the BMC reports the server {}; it was {} (changed outside bootplane)",
            observed.as_str(),
            recorded.unwrap_or("unknown")
        );
        let stale = std::sync::atomic::AtomicBool::new(false);
        let written = self
            .write_status(name, |cur, st| {
                let running = self.ops.lock().unwrap().contains_key(name);
                if meta::resource_version(cur) != version || running {
                    stale.store(true, Ordering::Relaxed);
                    return false;
                }
                st["powerState"] = json!(observed.as_str());
                set_condition(st, "PowerReady", false, "ChangedOutsideBootplane", &msg);
                true
            })
            .await;
        if written {
            tracing::info!(server = %name, observed = observed.as_str(), "power state changed outside bootplane");
            self.metrics.changes_observed.inc();
        } else if stale.load(Ordering::Relaxed) {
            tracing::debug!(server = %name, "power poll answer dropped: the server changed while the BMC was asked");
            self.metrics.stale_observations.inc();
        }
    }
}

impl PowerDriver for Redfish {
    fn name(&self) -> &'static str {
        "redfish"
    }
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome> {
        let name = meta::name(server);
        let msg = format!(
            "redfish: asking the BMC to power the server {}",
            want.as_str()
        );
        Ok(self.start(name, Action::Power(want), msg))
    }
    fn reset(&self, server: &Value) -> anyhow::Result<Outcome> {
        let msg = "redfish: asking the BMC to restart the server".to_string();
        Ok(self.start(meta::name(server), Action::Reset, msg))
    }
}

/// Chooses the driver per Server: `redfish` for those naming a BMC, the configured
/// default for the rest.
pub struct PerServer {
    pub default: Arc<dyn PowerDriver>,
    pub redfish: Arc<Redfish>,
}

impl PowerDriver for PerServer {
    fn name(&self) -> &'static str {
        self.default.name()
    }
    fn name_for(&self, server: &Value) -> &'static str {
        if has_bmc(server) {
            "redfish"
        } else {
            self.default.name_for(server)
        }
    }
    fn set_power(&self, server: &Value, want: Power) -> anyhow::Result<Outcome> {
        if has_bmc(server) {
            self.redfish.set_power(server, want)
        } else {
            self.default.set_power(server, want)
        }
    }
    fn reset(&self, server: &Value) -> anyhow::Result<Outcome> {
        if has_bmc(server) {
            self.redfish.reset(server)
        } else {
            self.default.reset(server)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Part;

    struct NoTargets;
    impl BootTargets for NoTargets {
        fn http_boot_uri(&self, _: &str, _: HttpBootArtifact) -> Option<String> {
            None
        }
        fn media_uri(&self, _: &str) -> Option<String> {
            None
        }
        fn owns(&self, _: &str) -> bool {
            false
        }
    }

    async fn driver() -> (tempfile::TempDir, Store, Arc<Redfish>) {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let rt = store.registry().resolve("server").unwrap();
        let s = json!({"apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "Server",
                       "metadata": {"name": "s"},
                       "spec": {"systemUUID": "4c4c4544-0042-3510-8052-b4c04f4e4d32"}});
        let cur = store.create(&rt, s).await.unwrap();
        store
            .update_status(&rt, &cur, json!({"powerState": "On"}))
            .await
            .unwrap();
        let r = Redfish::new(
            store.clone(),
            RedfishConfig::default(),
            Arc::new(NoTargets),
            Arc::default(),
        )
        .unwrap();
        (d, store, r)
    }

    fn power(store: &Store) -> (String, Option<u64>) {
        let rt = store.registry().resolve("server").unwrap();
        let s = store.get(&rt, None, "s").unwrap();
        let p = s.pointer("/status/powerState").and_then(Value::as_str);
        (p.unwrap_or("").to_string(), meta::resource_version(&s))
    }

    #[tokio::test]
    async fn an_observation_is_recorded_only_onto_the_version_it_was_asked_for() {
        let (_d, store, r) = driver().await;
        let rt = store.registry().resolve("server").unwrap();
        // Read before the BMC is asked; meanwhile an operation records its result (the
        // server changes); the answer (Off, read before the operation) arrives after.
        let read = store.get(&rt, None, "s").unwrap();
        let patch = json!({"metadata": {"annotations": {"bootplane.dev/boot-generation": "1"}}});
        store
            .patch(&rt, None, "s", &patch, Part::Main)
            .await
            .unwrap();
        let before = power(&store);
        r.record_observed(&read, Power::Off).await;
        assert_eq!(power(&store), before, "a stale answer was written");
        assert_eq!(r.metrics.stale_observations.get(), 1);
        assert_eq!(r.metrics.changes_observed.get(), 0);

        // An operation running for it: its answer is not recorded either.
        let read = store.get(&rt, None, "s").unwrap();
        r.ops.lock().unwrap().insert(
            "s".into(),
            Op {
                want: Action::Reset,
                gen: 1,
                message: String::new(),
                failing: None,
            },
        );
        r.record_observed(&read, Power::Off).await;
        assert_eq!(power(&store).0, "On");
        r.ops.lock().unwrap().clear();

        // The version it was asked for: recorded, with the reason.
        let read = store.get(&rt, None, "s").unwrap();
        r.record_observed(&read, Power::Off).await;
        assert_eq!(power(&store).0, "Off");
        assert_eq!(r.metrics.changes_observed.get(), 1);
        let s = store.get(&rt, None, "s").unwrap();
        assert!(s.to_string().contains("ChangedOutsideBootplane"), "{s}");
        // The same answer again: nothing to write.
        r.record_observed(&s, Power::Off).await;
        assert_eq!(r.metrics.changes_observed.get(), 1);
    }
}
