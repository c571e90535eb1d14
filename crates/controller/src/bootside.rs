//! The boot side's view of the store: a [`crate::http::BootIndex`] kept current by
//! watching Servers, ServerBootConfigurations and Secrets (the boot listener answers
//! from memory and never waits on the store), boot-progress conditions written back
//! onto the ServerBootConfiguration off the hot path, and the catalog-based
//! [`BootResolver`] that decides `Ready`/`Error`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::{set_condition, BootResolver};
use crate::http::catalog::{Catalog, FileHasher};
use crate::http::index::MemoryIndex;
use crate::http::{
    BootEvent, BootFiles, BootIndex, BootState, IgnitionData, MachineBoot, MachineId,
};
use crate::ignition::templates::{TemplateSet, HOSTNAME_LABEL};
use crate::ignition::{MachineFacts, RenderCache, RenderKey};
use crate::model::meta;
use crate::model::registry::ResourceType;
use crate::model::views::{
    condition, nics, read, BootConfigurationState, PowerState, Server, ServerBootConfiguration,
    ServerClaim, ServerState,
};
use crate::shutdown::Shutdown;
use crate::store::watcher::{Batch, Events, Watcher};
use crate::store::{secret_data, Modified, Store, StoreError};

/// Resolves a boot configuration's image against the catalog (every file present with
/// its SHA-256) and renders the machine's Ignition: the operator template picked by
/// [`crate::ignition::templates`] filled with the machine's facts, with the claim's
/// ignition secret merged on top. The secret is translated and validated once per
/// resourceVersion; the rendered config is cached per (server, secret resourceVersion,
/// template revision) and the machine facts it came from. The controller and the boot
/// index share both caches.
pub struct CatalogResolver {
    /// Replaced whole on SIGHUP ([`CatalogResolver::reload`]).
    catalog: RwLock<Arc<Catalog>>,
    pub hasher: FileHasher,
    /// Bumped when the catalog or the templates are replaced: the boot index re-derives
    /// its entries.
    changes: tokio::sync::watch::Sender<u64>,
    secrets: Mutex<HashMap<(String, String), (u64, SecretResult)>>,
    templates: RwLock<Arc<TemplateSet>>,
    renders: RenderCache,
    /// The agent image's catalog reference (disk images are installed through it).
    agent_image: String,
}

type SecretResult = Result<Arc<Value>, (String, String)>;

/// A boot configuration's Ignition secret as last translated: its resourceVersion and
/// the config, `None` when the configuration names no secret; or `(reason, message)`.
type SecretConfig = Result<Option<(u64, Arc<Value>)>, (String, String)>;

impl CatalogResolver {
    /// A resolver without Ignition templates (the claim's secret alone is served).
    pub fn new(catalog: Catalog, hasher: FileHasher) -> CatalogResolver {
        Self::with_templates(catalog, hasher, TemplateSet::empty(Path::new("")))
    }

    pub fn with_templates(
        catalog: Catalog,
        hasher: FileHasher,
        templates: TemplateSet,
    ) -> CatalogResolver {
        CatalogResolver {
            catalog: RwLock::new(Arc::new(catalog)),
            hasher,
            changes: tokio::sync::watch::Sender::new(0),
            secrets: Mutex::new(HashMap::new()),
            templates: RwLock::new(Arc::new(templates)),
            renders: RenderCache::new(),
            agent_image: String::new(),
        }
    }

    /// With `image` as the agent image disk images are installed through.
    pub fn with_agent_image(mut self, image: &str) -> CatalogResolver {
        self.agent_image = image.to_string();
        self
    }

    /// The agent image's catalog reference.
    pub(crate) fn agent_image(&self) -> &str {
        &self.agent_image
    }

    /// The rendered-config cache (the boot index invalidates it from its watch).
    pub(crate) fn renders(&self) -> &RenderCache {
        &self.renders
    }

    /// The image catalog in force.
    pub(crate) fn catalog(&self) -> Arc<Catalog> {
        self.catalog
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Told each time the catalog or the templates are replaced.
    pub(crate) fn subscribe_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// SIGHUP: read the image catalog from `images_dir` and the Ignition templates
    /// again, whether or not they look changed (blocking file I/O). What does not load
    /// keeps the previous version and is said in the report.
    pub fn reload(&self, images_dir: &Path) -> Reloaded {
        let catalog = match crate::http::catalog::load(images_dir) {
            Ok(c) => {
                let n = c.images.len();
                *self.catalog.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(c);
                Ok(n)
            }
            Err(e) => Err(format!("{e:#}")),
        };
        let dir = self.template_set().dir.clone();
        let templates = match TemplateSet::load(&dir) {
            Ok(t) => {
                let n = t.len();
                *self.templates.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
                Ok(n)
            }
            Err(e) => Err(format!("{e:#}")),
        };
        self.renders.clear();
        self.changes.send_modify(|g| *g += 1);
        Reloaded { catalog, templates }
    }

    fn template_set(&self) -> Arc<TemplateSet> {
        self.templates
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the template directory when a file in it changed. Returns true when
    /// the set was replaced (every cached render is then dropped). A directory that no
    /// longer compiles keeps the previous set and logs why.
    pub(crate) fn reload_templates_if_changed(&self) -> bool {
        let cur = self.template_set();
        if !cur.changed_on_disk() {
            return false;
        }
        match TemplateSet::load(&cur.dir) {
            Ok(t) => {
                tracing::info!(dir = %cur.dir.display(), "ignition templates changed, reloaded");
                *self.templates.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(t);
                self.renders.clear();
                true
            }
            Err(e) => {
                tracing::error!(dir = %cur.dir.display(), error = %format!("{e:#}"), "ignition templates changed but do not load; keeping the previous ones");
                false
            }
        }
    }

    /// The Ignition payload a boot configuration hands out (`None` when there is
    /// neither a template nor a secret). Without `format` the secret's `ignition` key
    /// is Ignition JSON, as boot-operator has it; `format: fcos` is Butane.
    pub(crate) fn ignition_payload(
        &self,
        store: &Store,
        sbc: &Value,
    ) -> Result<Option<IgnitionData>, (String, String)> {
        let secret = self.secret_config(store, sbc)?;
        let reg = store.registry();
        let ns = meta::namespace(sbc).unwrap_or("default");
        let server_name = read::<ServerBootConfiguration>(sbc).spec.server_ref.name;
        let server_name = server_name.as_str();
        let server = reg
            .resolve("server")
            .and_then(|t| store.get(&t, None, server_name).ok());
        let facts = machine_facts(server.as_deref(), sbc);
        let claim_labels = match (&facts.claim_namespace, &facts.claim_name) {
            (Some(cns), Some(cn)) => reg
                .resolve("serverclaim")
                .and_then(|t| store.get(&t, Some(cns), cn).ok())
                .map(|c| labels(&c))
                .unwrap_or_default(),
            _ => BTreeMap::new(),
        };
        let set = self.template_set();
        let template = set
            .select(&claim_labels, &facts.labels)
            .map_err(|e| ("IgnitionTemplateMissing".to_string(), e.message))?;
        if template.is_none() && secret.is_none() {
            return Ok(None);
        }
        let key = RenderKey {
            server: if server_name.is_empty() {
                format!("{ns}/{}", meta::name(sbc))
            } else {
                server_name.to_string()
            },
            secret_revision: secret
                .as_ref()
                .map(|(rv, _)| rv.to_string())
                .unwrap_or_default(),
            template_revision: template.map(|t| set.revision(t)).unwrap_or_default(),
        };
        let rendered = self
            .renders
            .get_or_render_for(&key, &facts, || {
                set.renderer.render_with(
                    template.map(|t| t.name.as_str()),
                    &facts,
                    secret.as_ref().map(|(_, c)| &**c),
                )
            })
            .map_err(|e| {
                (
                    e.reason().to_string(),
                    format!("rendering ignition for server {}: {e}", key.server),
                )
            })?;
        Ok(Some(IgnitionData {
            data: rendered.json.clone(),
            content_type: "application/json".into(),
        }))
    }

    /// The boot configuration's ignition secret, translated and validated (cached per
    /// resourceVersion): `(resourceVersion, config)`, or `None` when it names none.
    fn secret_config(&self, store: &Store, sbc: &Value) -> SecretConfig {
        let ns = meta::namespace(sbc).unwrap_or("default");
        let Some(r) = read::<ServerBootConfiguration>(sbc)
            .spec
            .ignition_secret_ref
        else {
            return Ok(None);
        };
        let name = r.name.as_str();
        let t = store.registry().resolve("secret").expect("secret type");
        let secret = store.get(&t, Some(ns), name).map_err(|_| {
            (
                "IgnitionSecretMissing".to_string(),
                format!("secret {ns}/{name} not found"),
            )
        })?;
        let rv = meta::resource_version(&secret).unwrap_or(0);
        let key = (ns.to_string(), name.to_string());
        if let Some((crv, r)) = self
            .secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            if *crv == rv {
                return r.clone().map(|c| Some((rv, c)));
            }
        }
        let r = translate_secret(ns, name, &secret).map(Arc::new);
        self.secrets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (rv, r.clone()));
        r.map(|c| Some((rv, c)))
    }
}

fn labels(o: &Value) -> BTreeMap<String, String> {
    meta::labels(o)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// What a template may use about a machine, from its Server (and, when the Server
/// names no claim, the boot configuration's own name and namespace, which are the
/// claim's). MACs are lowercase colon-separated, the boot NIC (first listed) first.
pub(crate) fn machine_facts(server: Option<&Value>, sbc: &Value) -> MachineFacts {
    let mut f = MachineFacts {
        name: read::<ServerBootConfiguration>(sbc).spec.server_ref.name,
        claim_name: Some(meta::name(sbc).to_string()),
        claim_namespace: Some(meta::namespace(sbc).unwrap_or("default").to_string()),
        ..Default::default()
    };
    let Some(s) = server else {
        return f;
    };
    let sv: Server = read(s);
    f.name = meta::name(s).to_string();
    f.uuid =
        (sv.spec.system_uuid.as_deref()).map(|u| valid_uuid(u).unwrap_or_else(|| u.to_string()));
    f.labels = labels(s);
    f.hostname = f.labels.get(HOSTNAME_LABEL).cloned();
    for nic in nics(s) {
        if let Some(m) = nic.mac {
            f.macs.push(crate::model::ident::MacFmt(&m).to_string());
        }
        for a in nic.ips {
            let a = a.to_string();
            if !f.ips.contains(&a) {
                f.ips.push(a);
            }
        }
    }
    if let Some(r) = sv.spec.server_claim_ref.filter(|r| !r.name.is_empty()) {
        let (ns, name) = r.key();
        (f.claim_namespace, f.claim_name) = (Some(ns), Some(name));
    }
    f
}

impl BootResolver for CatalogResolver {
    fn resolve(&self, store: &Store, sbc: &Value) -> Result<(), (String, String)> {
        let image = read::<ServerBootConfiguration>(sbc).spec.image;
        let image = image.as_str();
        if image.is_empty() {
            return Err(("NoImage".into(), "spec.image is empty".into()));
        }
        if let Some(plan) = super::install::plan(
            (&self.catalog(), &self.hasher, &self.agent_image),
            image,
            "",
        ) {
            plan?;
            return self.ignition_payload(store, sbc).map(|_| ());
        }
        match self.hasher.resolve(&self.catalog(), image) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err((e.reason().into(), e.to_string())),
            Err(e) => return Err(("ImageIOError".into(), format!("reading image files: {e}"))),
        }
        self.ignition_payload(store, sbc).map(|_| ())
    }
}

/// What [`CatalogResolver::reload`] did: the number of images and templates loaded,
/// or why the previous ones were kept.
#[derive(Debug)]
pub struct Reloaded {
    pub catalog: Result<usize, String>,
    pub templates: Result<usize, String>,
}

/// Decode, translate (Butane) or parse, and validate a secret's `ignition` key, so an
/// invalid config puts the boot configuration into Error instead of being served.
fn translate_secret(ns: &str, name: &str, secret: &Value) -> Result<Value, (String, String)> {
    let data = secret_data(secret, "ignition").ok_or_else(|| {
        (
            "IgnitionKeyMissing".to_string(),
            format!("secret {ns}/{name} has no data key \"ignition\""),
        )
    })?;
    let format = secret_data(secret, "format")
        .map(|f| String::from_utf8_lossy(&f).trim().to_string())
        .filter(|f| !f.is_empty());
    let text = String::from_utf8(data).map_err(|_| {
        (
            "InvalidIgnition".to_string(),
            format!("secret {ns}/{name}: key \"ignition\" is not UTF-8"),
        )
    })?;
    // Butane (`format: fcos`) is translated, plain Ignition JSON parsed; both are
    // validated against their spec version's schema and Ignition's rules, so an invalid
    // config puts the boot configuration into Error instead of being served.
    let parsed = crate::ignition::render::IgnitionSecret {
        ignition: text,
        format,
    };
    parsed
        .to_config(&crate::ignition::FilesDir::default())
        .map_err(|e| (e.reason().to_string(), format!("secret {ns}/{name}: {e}")))
}

fn valid_uuid(s: &str) -> Option<String> {
    crate::model::ident::parse_uuid(s).ok()
}

/// Pause before boot-progress writes the store refused as unavailable are tried again.
const PROGRESS_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// Boot-progress status writes issued together.
const PROGRESS_BATCH: usize = 256;

/// Store events taken together before the affected servers' boot entries are
/// refreshed (a bound, so shutdown and the template poll are not held off).
const COALESCE_MAX: usize = 4096;

/// How often the Ignition template directory is checked for changes.
pub(crate) const TEMPLATE_POLL: Duration = Duration::from_secs(2);

/// Keeps a [`MemoryIndex`] equal to what the store says each machine should boot.
pub struct StoreBootIndex {
    pub mem: MemoryIndex,
    store: Store,
    resolver: Arc<CatalogResolver>,
    base_url: String,
    /// Unbounded, yet bounded by `queued`: a key is sent only when it enters the map,
    /// so at most one entry per (machine, event) waits, and no fetch is ever lost.
    progress: mpsc::UnboundedSender<(String, BootEvent)>,
    /// Progress events waiting for the writer, with the latest client address: a
    /// machine that fetches the same thing again while its first event is still queued
    /// costs no extra status write (boot storms retry a lot).
    queued: std::sync::Mutex<HashMap<(String, BootEvent), IpAddr>>,
    /// DHCP leases (when bootplane's DHCP server runs): a machine's leased address
    /// counts as its own for the identity check.
    leases: Option<crate::dhcp::leases::LeaseIndex>,
    /// Agent boots (first boots, cleanups): their images and the queue to the report
    /// writer ([`super::reports::run`]).
    agent: Option<AgentImages>,
    t_server: Arc<ResourceType>,
    t_sbc: Arc<ResourceType>,
    /// `ScriptServed` / `IgnitionServed` on the Server, once per boot configuration
    /// change (when the condition is first set).
    events: crate::store::events::Recorder,
    /// The power state and reset request (the annotation's value) last seen per
    /// server, so each power-off or reset counts as one power cycle however many
    /// versions carry it.
    resets: Mutex<HashMap<String, (String, String)>>,
}

/// What agent boots the boot side serves: the discovery image (first boots, when on),
/// the cleanup agent's image (when releases may wipe), and the queue to the writer of
/// the agents' reports.
pub struct AgentImages {
    pub discovery: Option<String>,
    pub cleanup: Option<String>,
    pub reports: mpsc::Sender<crate::http::AgentReport>,
}

impl BootIndex for StoreBootIndex {
    fn lookup(&self, id: &MachineId) -> Option<Arc<MachineBoot>> {
        let now = crate::sys::unix_now();
        // The entry is returned as stored (never a per-request copy), so the listener's
        // per-machine script cache keeps hitting for lease-identified machines.
        self.mem.lookup(id).or_else(|| {
            let MachineId::Ip(IpAddr::V4(ip)) = id else {
                return None;
            };
            let l = self.leases.as_ref()?.by_ip(*ip).filter(|l| l.active(now))?;
            self.mem.lookup(&MachineId::Mac(l.mac))
        })
    }

    fn owns(&self, m: &MachineBoot, client: IpAddr) -> bool {
        if m.ips.contains(&client) {
            return true;
        }
        let (Some(leases), IpAddr::V4(ip)) = (&self.leases, client) else {
            return false;
        };
        let now = crate::sys::unix_now();
        leases
            .by_ip(ip)
            .is_some_and(|l| l.active(now) && m.macs.contains(&l.mac))
    }

    fn take_ignition(&self, m: &MachineBoot) -> bool {
        self.mem.take_ignition(m)
    }

    fn lease_mac(&self, client: IpAddr) -> Option<crate::model::ident::Mac> {
        let (Some(leases), IpAddr::V4(ip)) = (&self.leases, client) else {
            return None;
        };
        let now = crate::sys::unix_now();
        leases.by_ip(ip).filter(|l| l.active(now)).map(|l| l.mac)
    }

    fn record_progress(&self, server: &str, event: BootEvent, client: IpAddr) {
        self.mem.record_progress(server, event, client);
        // Never block the request: the writer catches up with the queue.
        let key = (server.to_string(), event);
        {
            let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = q.get_mut(&key) {
                *c = client;
                return;
            }
            q.insert(key.clone(), client);
        }
        // Fails only once the writer has stopped (shutdown).
        let _ = self.progress.send(key);
    }

    fn record_report(&self, report: crate::http::AgentReport) -> bool {
        match &self.agent {
            Some(a) => a.reports.try_send(report).is_ok(),
            None => false,
        }
    }
}

impl StoreBootIndex {
    /// Build the index and start its watch and progress-writer tasks.
    pub fn start(
        store: Store,
        resolver: Arc<CatalogResolver>,
        base_url: String,
        leases: Option<crate::dhcp::leases::LeaseIndex>,
        agent: Option<AgentImages>,
        shutdown: Shutdown,
    ) -> Arc<StoreBootIndex> {
        let (tx, rx) = mpsc::unbounded_channel();
        let reg = store.registry();
        let idx = Arc::new(StoreBootIndex {
            mem: MemoryIndex::new(),
            events: crate::store::events::Recorder::spawn(store.clone(), "bootplane-boot"),
            store,
            resolver,
            base_url,
            progress: tx,
            queued: Default::default(),
            leases,
            agent,
            t_server: reg.resolve("server").expect("server"),
            t_sbc: reg.resolve("sbc").expect("sbc"),
            resets: Default::default(),
        });
        let i = idx.clone();
        let s1 = shutdown.child();
        tokio::spawn(async move { i.watch(s1).await });
        let i = idx.clone();
        tokio::spawn(async move { i.write_progress(rx, shutdown).await });
        idx
    }

    /// Recompute one server's entry from the store.
    pub(crate) fn refresh(&self, server: &str) {
        match self.store.get(&self.t_server, None, server) {
            Ok(s) => self.index(server, &s),
            Err(_) => {
                self.mem.remove(server);
                let mut r = self.resets.lock().unwrap_or_else(|p| p.into_inner());
                r.remove(server);
            }
        }
    }

    /// A version of Server `server` whose power went to Off (from another state seen
    /// before), or with a reset request not seen before: its next boot is a new one
    /// for the one-shot Ignition (`http.ignition_once`).
    fn note_power(&self, server: &str, s: &Value) {
        let s: Server = read(s);
        let power = s.status.power_state.as_ref().map_or("", PowerState::as_str);
        let reset = s.metadata.annotations.get(super::server::RESET_ANNOTATION);
        let mut seen = self.resets.lock().unwrap_or_else(|p| p.into_inner());
        let last = seen.entry(server.to_string()).or_default();
        let off = power == "Off" && !last.0.is_empty() && last.0 != "Off";
        let reset_new = reset.is_some_and(|r| *r != last.1);
        if power != last.0 {
            last.0 = power.to_string();
        }
        if let Some(r) = reset.filter(|_| reset_new) {
            last.1 = r.to_string();
        }
        if off || reset_new {
            self.mem.power_cycled(server);
        }
    }

    /// Put Server `s` (named `server`) into the boot index as the store has it now.
    fn index(&self, server: &str, s: &Value) {
        let mut ips: Vec<IpAddr> = Vec::new();
        let mut macs = Vec::new();
        for nic in nics(s) {
            macs.extend(nic.mac);
            ips.extend(nic.ips);
        }
        let sv: Server = read(s);
        let uuid = sv.spec.system_uuid.as_deref().and_then(valid_uuid);
        let mut boot_id = String::new();
        let (state, files, ignition) = self.boot_state((s, &sv), &mut boot_id);
        self.mem.upsert(MachineBoot {
            server: server.to_string(),
            uuid,
            ips,
            macs,
            state,
            boot_id,
            files,
            ignition,
        });
    }

    /// An agent boot in `state` of the agent image `image` (no files when the catalog
    /// lacks it: the default script then says so).
    fn agent_boot(
        &self,
        image: &str,
        state: BootState,
    ) -> (BootState, Option<BootFiles>, Option<IgnitionData>) {
        match self
            .resolver
            .hasher
            .resolve(&self.resolver.catalog(), image)
        {
            Ok(Ok(r)) => (state, Some(r.boot_files(&self.base_url)), None),
            Ok(Err(e)) => {
                tracing::warn!(image, error = %e, "agent image not in the catalog");
                (state, None, None)
            }
            Err(e) => {
                tracing::warn!(image, error = %e, "reading the agent image");
                (state, None, None)
            }
        }
    }

    /// What the server's boot configuration says it boots; `boot_id` is set to
    /// [`super::powerstate::claimed_boot_id`] when there is one (signed tokens are bound to it, so they die
    /// with the claim, a change of the configuration or a power cycle).
    fn boot_state(
        &self,
        (s, sv): (&Value, &Server),
        boot_id: &mut String,
    ) -> (BootState, Option<BootFiles>, Option<IgnitionData>) {
        if let Some(a) = &self.agent {
            match (&sv.status.state, &a.discovery, &a.cleanup) {
                (Some(ServerState::Discovery), Some(image), _) => {
                    *boot_id = super::inventory::boot_id(s);
                    return self.agent_boot(image, BootState::Discovery);
                }
                (Some(ServerState::Cleanup), _, Some(image)) => {
                    *boot_id = super::cleanup::boot_id(s);
                    let policy = super::cleanup::wipe_policy(sv);
                    return self.agent_boot(image, BootState::Cleanup(policy));
                }
                _ => {}
            }
        }
        let Some(r) = &sv.spec.boot_configuration_ref else {
            return (BootState::NotClaimed, None, None);
        };
        let ns = r.namespace.as_deref().unwrap_or("default");
        let name = r.name.as_str();
        let Ok(sbc) = self.store.get(&self.t_sbc, Some(ns), name) else {
            return (
                BootState::Error(format!("ServerBootConfiguration {ns}/{name} not found")),
                None,
                None,
            );
        };
        let b: ServerBootConfiguration = read(&sbc);
        *boot_id = super::powerstate::claimed_boot_id(sv, &b);
        match b.status.state {
            Some(BootConfigurationState::Ready) => {}
            Some(BootConfigurationState::Error) => {
                let why = condition(&b.status.conditions, "Ready")
                    .map_or("boot configuration is in Error", |c| c.message.as_str());
                return (BootState::Error(why.to_string()), None, None);
            }
            _ => return (BootState::NotClaimed, None, None),
        }
        let image = b.spec.image.as_str();
        if let Some(plan) = super::install::plan(
            (
                &self.resolver.catalog(),
                &self.resolver.hasher,
                self.resolver.agent_image(),
            ),
            image,
            &self.base_url,
        ) {
            if super::install::installed(&b) {
                return (BootState::LocalBoot, None, None);
            }
            let plan = plan.and_then(|p| super::install::with_server_hints(p, sv));
            return match plan
                .and_then(|p| Ok((p, self.resolver.ignition_payload(&self.store, &sbc)?)))
            {
                Ok(((plan, files), ign)) => (BootState::Install(Arc::new(plan)), Some(files), ign),
                Err((_, msg)) => (BootState::Error(msg), None, None),
            };
        }
        let files = match self
            .resolver
            .hasher
            .resolve(&self.resolver.catalog(), image)
        {
            Ok(Ok(r)) => r.boot_files(&self.base_url),
            Ok(Err(e)) => return (BootState::Error(e.to_string()), None, None),
            Err(e) => {
                return (
                    BootState::Error(format!("reading image files: {e}")),
                    None,
                    None,
                )
            }
        };
        match self.resolver.ignition_payload(&self.store, &sbc) {
            Ok(ign) => (BootState::Ready, Some(files), ign),
            Err((_, msg)) => (BootState::Error(msg), None, None),
        }
    }

    async fn watch(self: Arc<Self>, mut shutdown: Shutdown) {
        let reg = self.store.registry();
        let t = |k: &str| reg.resolve(k).expect("type");
        // Servers are listed; what the other types contribute is re-derived from them.
        let mut w = Watcher::new(self.store.clone(), "boot entries")
            .with(self.t_server.clone())
            .with_unlisted(t("sbc"))
            .with_unlisted(t("secret"))
            .with_unlisted(t("serverclaim"))
            .max_batch(COALESCE_MAX);
        // Template files are not in the store: an mtime/size check of the directory.
        let mut poll = tokio::time::interval(TEMPLATE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut changes = self.resolver.subscribe_changes();
        loop {
            let batch = tokio::select! {
                b = w.next() => b,
                Ok(()) = changes.changed() => {
                    w.relist();
                    continue;
                }
                _ = poll.tick() => {
                    let r = self.resolver.clone();
                    let reloaded = tokio::task::spawn_blocking(move || r.reload_templates_if_changed())
                        .await
                        .unwrap_or(false);
                    if reloaded {
                        w.relist();
                    }
                    continue;
                }
                _ = shutdown.recv() => return,
            };
            match batch {
                None => return,
                Some(Batch::Listed(servers)) => {
                    let mut listed = HashSet::new();
                    for (_, s) in servers {
                        // the listed object is the current one: no second read and parse
                        self.note_power(meta::name(&s), &s);
                        self.index(meta::name(&s), &s);
                        listed.insert(meta::name(&s).to_string());
                    }
                    // A Server deleted while this watch was behind the event log has no
                    // event left to say so: the listing is the whole truth.
                    self.mem.retain(|name| listed.contains(name));
                }
                Some(Batch::Events(changes)) => self.apply(changes),
            }
        }
    }

    /// Registering a fleet is a burst of events, several per server (its creation,
    /// claim, boot configuration and their status writes): the watcher hands out the
    /// events already waiting together, and each affected server is refreshed once,
    /// from the store's current state. One refresh per event made the boot index fall
    /// behind the store's event log and re-list during a 10,000-machine registration.
    fn apply(&self, changes: Events<'_>) {
        let mut refresh = HashSet::new();
        let mut invalidate = HashSet::new();
        for c in changes {
            let is_server = c.t.kind == "Server";
            // Each version as the event has it, in order: an Off or a reset later
            // undone is not missed when the refresh below reads only the newest.
            if is_server && !c.deleted() {
                self.note_power(meta::name(&c.event.object), &c.event.object);
            }
            for server in self.affected(&c.event.object) {
                // A Server update keeps its render when the facts it was rendered from
                // are unchanged (checked by the cache); a claim, boot configuration or
                // secret change, or a deleted Server, drops it.
                if !is_server || c.deleted() {
                    invalidate.insert(server.clone());
                }
                refresh.insert(server);
            }
        }
        for server in &invalidate {
            self.resolver.renders().invalidate(server);
        }
        for server in &refresh {
            self.refresh(server);
        }
    }

    /// Servers whose boot entry depends on this object.
    fn affected(&self, o: &Value) -> HashSet<String> {
        let mut out = HashSet::new();
        match o.get("kind").and_then(Value::as_str) {
            Some("Server") => {
                out.insert(meta::name(o).to_string());
            }
            Some("ServerBootConfiguration") => {
                out.insert(read::<ServerBootConfiguration>(o).spec.server_ref.name);
            }
            Some("ServerClaim") => {
                out.extend(read::<ServerClaim>(o).spec.server_ref.map(|r| r.name));
            }
            Some("Secret") => {
                let ns = meta::namespace(o).unwrap_or("default");
                let (sbcs, _) = self.store.list(&self.t_sbc, Some(ns), None);
                for b in sbcs {
                    let b: ServerBootConfiguration = read(&b);
                    if b.spec
                        .ignition_secret_ref
                        .is_some_and(|r| r.name == meta::name(o))
                    {
                        out.insert(b.spec.server_ref.name);
                    }
                }
            }
            _ => {}
        }
        out.remove("");
        out
    }

    /// Write `IPXEScriptFetched` / `IgnitionDataFetched` onto the machines' boot
    /// configurations: everything queued so far at once (up to [`PROGRESS_BATCH`]), so
    /// the store commits a storm's status writes together instead of one per sync.
    async fn write_progress(
        self: Arc<Self>,
        mut rx: mpsc::UnboundedReceiver<(String, BootEvent)>,
        mut shutdown: Shutdown,
    ) {
        let mut keys = Vec::with_capacity(PROGRESS_BATCH);
        loop {
            keys.clear();
            tokio::select! {
                n = rx.recv_many(&mut keys, PROGRESS_BATCH) => if n == 0 { return },
                _ = shutdown.recv() => return,
            }
            // Grouped by machine: its script and Ignition fetches usually land in the
            // same batch and become one status write (not two that conflict).
            let mut work: HashMap<String, Vec<(BootEvent, IpAddr)>> = HashMap::new();
            {
                let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
                for k in keys.drain(..) {
                    if let Some(client) = q.remove(&k) {
                        work.entry(k.0).or_default().push((k.1, client));
                    }
                }
            }
            let this = &self;
            let results =
                futures::future::join_all(work.into_iter().map(|(server, events)| async move {
                    match this.record_conditions(&server, &events).await {
                        Ok(()) => None,
                        // The store cannot take writes now (etcd without quorum): kept, and
                        // written once it can (the conditions are the machine's history).
                        Err(StoreError::Unavailable(_) | StoreError::OutcomeUnknown(_)) => {
                            Some((server, events))
                        }
                        Err(e) => {
                            tracing::warn!(server, error = %e, "recording boot progress");
                            None
                        }
                    }
                }))
                .await;
            let retry: Vec<_> = results.into_iter().flatten().collect();
            if !retry.is_empty() {
                tracing::warn!(
                    machines = retry.len(),
                    "store unavailable: boot progress kept for a retry"
                );
                tokio::select! {
                    _ = tokio::time::sleep(PROGRESS_RETRY) => {}
                    _ = shutdown.recv() => return,
                }
                for (server, events) in retry {
                    for (event, client) in events {
                        // A newer fetch queued meanwhile wins (its client is the latest).
                        let key = (server.clone(), event);
                        let fresh = {
                            let mut q = self.queued.lock().unwrap_or_else(|p| p.into_inner());
                            match q.entry(key.clone()) {
                                std::collections::hash_map::Entry::Occupied(_) => false,
                                std::collections::hash_map::Entry::Vacant(v) => {
                                    v.insert(client);
                                    true
                                }
                            }
                        };
                        if fresh {
                            let _ = self.progress.send(key);
                        }
                    }
                }
            }
        }
    }

    /// Set the conditions of `events` (each with the client that fetched) on the
    /// machine's boot configuration, in one status write.
    async fn record_conditions(
        &self,
        server: &str,
        events: &[(BootEvent, IpAddr)],
    ) -> Result<(), StoreError> {
        let s = self.store.get(&self.t_server, None, server)?;
        let Some(r) = read::<Server>(&s).spec.boot_configuration_ref else {
            return Ok(());
        };
        let (ns, name) = r.key();
        let written = self
            .store
            .modify_status(&self.t_sbc, Some(&ns), &name, |_, status| {
                let mut changed = false;
                for (event, client) in events {
                    let msg = format!("fetched by {client}");
                    changed |= set_condition(status, event.condition_type(), true, "Fetched", &msg);
                }
                changed
            })
            .await?;
        if let Modified::Written { .. } = written {
            for (event, client) in events {
                let (reason, what) = match event {
                    BootEvent::IpxeScriptFetched => ("ScriptServed", "iPXE script"),
                    BootEvent::IgnitionDataFetched => ("IgnitionServed", "Ignition config"),
                };
                self.events.normal(
                    &self.t_server,
                    &s,
                    reason,
                    format!("{what} fetched by {client} (boot configuration {ns}/{name})"),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_and_uuids() {
        let parse_mac = |m| crate::model::ident::parse_mac(m).ok();
        assert_eq!(
            parse_mac("52:54:00:AB:cd:01"),
            Some([0x52, 0x54, 0, 0xab, 0xcd, 1])
        );
        assert_eq!(
            parse_mac("52-54-00-ab-cd-01"),
            Some([0x52, 0x54, 0, 0xab, 0xcd, 1])
        );
        assert_eq!(parse_mac("52:54:00"), None);
        assert_eq!(
            valid_uuid("4C4C4544-0001-0001-0001-000000000001").as_deref(),
            Some("4c4c4544-0001-0001-0001-000000000001")
        );
        assert_eq!(valid_uuid("1234"), None);
    }

    #[test]
    fn facts_from_server_and_boot_configuration() {
        let sbc = serde_json::json!({"metadata": {"name": "c1", "namespace": "team"},
            "spec": {"serverRef": {"name": "s1"}}});
        let server = serde_json::json!({
            "metadata": {"name": "s1", "labels": {"rack": "r1", "bootplane.dev/hostname": "node-1"}},
            "spec": {"systemUUID": "4C4C4544-0001-0001-0001-000000000001",
                     "serverClaimRef": {"name": "claim-x", "namespace": "ns-x"}},
            "status": {"networkInterfaces": [
                {"macAddress": "52:54:00:AB:CD:01", "ip": "10.0.0.5", "ips": ["10.0.0.5", "fd00::5"]},
                {"macAddress": "bogus", "ip": "not-an-ip"}]}});
        let f = machine_facts(Some(&server), &sbc);
        assert_eq!(f.name, "s1");
        assert_eq!(f.hostname.as_deref(), Some("node-1"));
        assert_eq!(
            f.uuid.as_deref(),
            Some("4c4c4544-0001-0001-0001-000000000001")
        );
        assert_eq!(f.macs, vec!["52:54:00:ab:cd:01"]);
        assert_eq!(f.ips, vec!["10.0.0.5", "fd00::5"]);
        assert_eq!(f.labels["rack"], "r1");
        assert_eq!(
            (f.claim_namespace.as_deref(), f.claim_name.as_deref()),
            (Some("ns-x"), Some("claim-x"))
        );
        // No Server object: the boot configuration's own name/namespace are the claim's.
        let f = machine_facts(None, &sbc);
        assert_eq!(
            (
                f.name.as_str(),
                f.claim_namespace.as_deref(),
                f.claim_name.as_deref()
            ),
            ("s1", Some("team"), Some("c1"))
        );
    }
}
