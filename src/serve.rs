//! `bootplane serve`: opens the store, starts the listeners and the controllers,
//! reloads what can change safely on SIGHUP ([`Services::reload`]) and drains them on
//! SIGINT/SIGTERM.
//!
//! The one composition root: every service below is started here with its own config
//! section, the handles it needs (store, indexes, metrics) and a shutdown handle, and
//! nothing outside `main.rs` imports this module.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};

use tokio::task::JoinSet;

use crate::api::preview::BootSlot;
use crate::config::Config;
use crate::controller::bootside::CatalogResolver;
use crate::dhcp::leases::LeaseIndex;
use crate::shutdown::Coordinator;
use crate::store::Store;

/// The API token: configured, or read from / generated into `<state_dir>/api-token`
/// (mode 0600).
pub fn api_token(config: &Config) -> Result<String> {
    if let Some(t) = &config.api.token {
        return Ok(t.clone());
    }
    let path = config.state_dir.join("api-token");
    load_or_create_token(&path)
}

fn load_or_create_token(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let token: String = {
        use rand::RngCore;
        let mut b = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut b);
        hex::encode(b)
    };
    crate::statedir::write_private(path, token.as_bytes())?;
    tracing::info!(path = %path.display(), "generated a new API token");
    Ok(token)
}

/// The management scope's lease log in the state directory (the provisioning scope's
/// is [`crate::dhcp::LEASE_FILE`]).
pub const MANAGEMENT_LEASE_FILE: &str = "dhcp-management-leases.log";

/// What SIGHUP needs from `main`: the config read again the way it was at start
/// (file, flags, environment) and the log filter's handle.
pub struct Reload {
    pub config: Arc<dyn Fn() -> Result<Config> + Send + Sync>,
    pub log_filter: crate::logging::FilterHandle,
}

/// `http.public_url` as machines should get it (the DHCP interface's address when the
/// boot listener is on every address and none is configured), or a warning that they
/// are told a loopback URL.
fn with_reachable_url(mut config: Config) -> Config {
    let dhcp_addr = match (config.dhcp.enabled, &config.dhcp.interface) {
        (true, Some(ifname)) => config
            .dhcp
            .server_ip
            .or_else(|| crate::dhcp::interface_ipv4(ifname).ok().map(|(ip, _)| ip)),
        _ => None,
    };
    let r = config.http.reachable_url(dhcp_addr);
    if let Some(w) = r.warning {
        tracing::warn!("{w}");
    }
    if let Some(u) = r.public_url {
        tracing::info!(public_url = %u, "http.public_url derived from the DHCP interface's address");
        config.http.public_url = Some(u);
    }
    config
}

/// The NFS images directory below the state dir when `provision.images_dir` is unset.
const NFS_IMAGES_DIR: &str = "nfs-images";

/// Run every enabled service until SIGINT/SIGTERM arrives, then drain (bounded);
/// SIGHUP reloads.
pub async fn run(config: Config, reload: Reload) -> Result<()> {
    // Caught from here on: a signal during start-up drains once start-up is done.
    let signals = crate::shutdown::Signals::install().context("installing signal handlers")?;
    let config = with_reachable_url(config);
    // Private (0700, files 0600) before anything secret is written into it.
    // (The NFS images tree below it, when there, keeps the modes the NFS server serves.)
    let nfs_images = (config.provision.images_dir.clone())
        .unwrap_or_else(|| config.state_dir.join(NFS_IMAGES_DIR));
    crate::statedir::prepare(&config.state_dir, &[&nfs_images])?;
    let token = api_token(&config)?;
    let store = Store::from_config(&config.store, &config.state_dir).await?;
    let mut s = Services {
        #[cfg(feature = "etcd")]
        leader_metrics: Default::default(),
        seal_metrics: Default::default(),
        resolver: boot_resolver(&config)?,
        runner: crate::provision::from_config(&config.provision)?,
        store,
        coord: Coordinator::new(),
        tasks: JoinSet::new(),
        boot_slot: BootSlot::default(),
        http_metrics: Arc::new(crate::http::Metrics::new()),
        leases: LeaseIndex::default(),
        dhcp_metrics: crate::dhcp::Metrics::default(),
        tftp_metrics: Arc::new(crate::tftp::Metrics::default()),
        redfish_metrics: Arc::default(),
        mgmt_dhcp_metrics: crate::dhcp::Metrics::default(),
        mgmt_leases: LeaseIndex::default(),
        mgmt_wake: Default::default(),
        discovery_metrics: Default::default(),
        ready: Default::default(),
        reloads: Default::default(),
        power_metrics: Default::default(),
    };
    s.start_api(&config, token).await?;
    s.start_key_rotation();
    s.start_event_collection(&config);
    s.start_controller_groups(&config)?;
    s.start_boot_http(&config)?;
    if config.dhcp.enabled {
        s.start_dhcp(&config)?;
    }
    if config.tftp.enabled {
        s.start_tftp(&config);
    }
    if config.discovery.management() {
        s.start_management(&config)?;
    }
    tracing::info!(state_dir = %config.state_dir.display(), "bootplane started");
    s.ready.store(true, std::sync::atomic::Ordering::Release);
    s.wait_and_drain(signals, config, reload).await
}

/// The catalog and Ignition templates behind the boot index.
fn boot_resolver(config: &Config) -> Result<Arc<CatalogResolver>> {
    let catalog = crate::http::catalog::load(&config.boot.images_dir)?;
    let templates = crate::ignition::templates::TemplateSet::load(&config.boot.ignition_templates)
        .with_context(|| {
            format!(
                "loading ignition templates from {}",
                config.boot.ignition_templates.display()
            )
        })?;
    // Disk images are installed through the agent image (the cleanup's, by default the
    // discovery image).
    let agent =
        crate::controller::cleanup::Cleanup::agent_image(&config.cleanup, &config.discovery);
    Ok(Arc::new(
        CatalogResolver::with_templates(
            catalog,
            crate::http::catalog::FileHasher::new(&config.boot.images_dir),
            templates,
        )
        .with_agent_image(agent),
    ))
}

/// The boot listener's signed per-machine URLs, for the Redfish driver's one-time
/// UEFI HTTP and virtual-media boots (resolved at each call: the listener starts after
/// the controllers).
struct BootTargets(BootSlot);

impl crate::power::redfish::BootTargets for BootTargets {
    fn http_boot_uri(
        &self,
        server: &str,
        artifact: crate::power::redfish::HttpBootArtifact,
    ) -> Option<String> {
        use crate::power::redfish::HttpBootArtifact as A;
        let artifact = match artifact {
            A::Iso => crate::http::BootArtifact::Iso,
            A::Efi => crate::http::BootArtifact::Efi,
        };
        self.0.get().map(|b| b.signed_boot_url(server, artifact))
    }
    fn media_uri(&self, server: &str) -> Option<String> {
        let iso = crate::http::BootArtifact::Iso;
        self.0.get().map(|b| b.signed_boot_url(server, iso))
    }
    fn owns(&self, uri: &str) -> bool {
        self.0
            .get()
            .is_some_and(|b| uri.starts_with(&format!("{}/", b.base_url())))
    }
}

/// The top-level config keys (`section.key`) whose values differ between `old` and
/// `new`, besides `log.filter` (which SIGHUP applies) and `http.public_url` when it was
/// derived at start-up.
fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    let flat = |c: &Config| -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        if let Ok(toml::Value::Table(t)) = toml::Value::try_from(c) {
            for (k, v) in t {
                match v {
                    toml::Value::Table(sub) => {
                        for (k2, v2) in sub {
                            out.insert(format!("{k}.{k2}"), v2.to_string());
                        }
                    }
                    v => {
                        out.insert(k, v.to_string());
                    }
                }
            }
        }
        out
    };
    let (a, b) = (flat(old), flat(new));
    let keys: std::collections::BTreeSet<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .filter(|k| *k != "log.filter")
        .filter(|k| !(*k == "http.public_url" && new.http.public_url.is_none()))
        .collect();
    keys.into_iter().cloned().collect()
}

/// The configured DHCP subnets (none when DHCP is off): the lease list's pool usage and
/// the inventory writer's dynamic ranges.
fn dhcp_pools(config: &Config) -> Vec<crate::dhcp::settings::Subnet> {
    if !config.dhcp.enabled {
        return Vec::new();
    }
    crate::dhcp::DhcpSettings::from_config(&config.dhcp, &config.public_http_url())
        .map(|s| s.subnets)
        .unwrap_or_default()
}

/// With the store on etcd, a DHCP scope's leases are there too, shared with the other
/// appliances under `{prefix}dhcp/{scope}/` (`crate::dhcp::cluster`); else in its lease log.
fn shared_leases(config: &Config, scope: &str) -> Option<crate::dhcp::Shared> {
    use crate::store::settings::BackendKind;
    (config.store.backend == BackendKind::Etcd).then(|| crate::dhcp::Shared {
        etcd: config.store.etcd.clone(),
        scope: scope.into(),
    })
}

/// What the services share, built once in [`run`]; each `start_*` step spawns one
/// service into `tasks` with the inputs it needs, handed over explicitly.
struct Services {
    store: Store,
    coord: Coordinator,
    tasks: JoinSet<Result<()>>,
    resolver: Arc<CatalogResolver>,
    runner: Arc<dyn crate::provision::JobRunner>,
    /// The boot listener's app, for the API's render preview (set once it exists).
    boot_slot: BootSlot,
    http_metrics: Arc<crate::http::Metrics>,
    leases: LeaseIndex,
    dhcp_metrics: crate::dhcp::Metrics,
    tftp_metrics: Arc<crate::tftp::Metrics>,
    redfish_metrics: Arc<crate::power::redfish::metrics::Metrics>,
    /// The management DHCP scope's and the Endpoint intake's (`[discovery.dhcp]`).
    mgmt_dhcp_metrics: crate::dhcp::Metrics,
    /// The management scope's leases (on etcd, the cluster's), which the Endpoint
    /// intake reads, and what wakes it when a lease is granted here.
    mgmt_leases: LeaseIndex,
    mgmt_wake: Arc<tokio::sync::Notify>,
    discovery_metrics: crate::controller::discovery::endpoints::Metrics,
    /// `bootplane_store_leader{group}` (etcd backend).
    #[cfg(feature = "etcd")]
    leader_metrics: crate::store::etcd::election::Metrics,
    /// Set once every service has started: `/readyz` answers 200 from then on.
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// `bootplane_store_secrets_by_key{key}` (key rotation, secrets at rest).
    seal_metrics: crate::store::rotate::Metrics,
    /// SIGHUP's fan-out to the tasks that reload on their own (TLS files, key file).
    reloads: crate::shutdown::Reloads,
    /// `bootplane_power_requests_total` (every driver).
    power_metrics: crate::power::metrics::Metrics,
}

/// The controller groups: each runs on one appliance at a time when the store is on
/// etcd (the leader of its election), on this appliance otherwise.
const GROUPS: [(&str, StartGroup); 2] = [
    ("metal", Controllers::start_metal),
    ("provisioning", Controllers::start_provisioning),
];

/// Starts one group's reconcilers on `store` under `coord`, into `tasks`.
type StartGroup = fn(&Controllers, Store, &Coordinator, &mut JoinSet<Result<()>>) -> Result<()>;

/// What the controller groups are built from, again at each term of leadership.
struct Controllers {
    config: Config,
    resolver: Arc<CatalogResolver>,
    runner: Arc<dyn crate::provision::JobRunner>,
    boot_slot: BootSlot,
    redfish_metrics: Arc<crate::power::redfish::metrics::Metrics>,
    power_metrics: crate::power::metrics::Metrics,
    /// The Endpoint intake and reconciler of the management network (`[discovery.dhcp]`).
    management: Option<crate::controller::discovery::endpoints::Inputs>,
}

impl Services {
    /// The operator API, with `/metrics` of every enabled service.
    async fn start_api(&mut self, config: &Config, token: String) -> Result<()> {
        let mut metrics = prometheus_client::registry::Registry::default();
        #[cfg(feature = "etcd")]
        let on_etcd = matches!(self.store.kv(), crate::store::Backend::Etcd(_));
        #[cfg(feature = "etcd")]
        let groups = GROUPS.map(|(group, _)| group);
        let controllers = config.controller.enabled;
        let api_conns = crate::metrics::register(
            &mut metrics,
            crate::metrics::Families {
                http: &self.http_metrics,
                dhcp: &self.dhcp_metrics,
                tftp: &self.tftp_metrics,
                power: &self.power_metrics,
                seal: &self.seal_metrics,
                management: (config.discovery.management())
                    .then_some((&self.mgmt_dhcp_metrics, &self.discovery_metrics)),
                redfish: controllers.then_some(&*self.redfish_metrics),
                #[cfg(feature = "etcd")]
                leader: (controllers && on_etcd).then_some((&self.leader_metrics, &groups[..])),
            },
        );
        let audit = crate::api::audit::Audit::start(
            crate::api::audit::AuditSettings {
                path: (config.api.audit_log.clone())
                    .unwrap_or_else(|| config.state_dir.join("audit.log")),
                max_bytes: config.api.audit_max_bytes,
                keep: config.api.audit_keep,
                unauthenticated_interval: Duration::from_millis(
                    config.api.audit_unauthenticated_interval_ms,
                ),
            },
            metrics.sub_registry_with_prefix(crate::metrics::API_PREFIX),
        )?;
        let roles = crate::api::authz::Roles::new(&config.api.roles)
            .map_err(|e| anyhow::anyhow!("api.roles: {e}"))?;
        let api_state = Arc::new(crate::api::state::ApiState {
            store: self.store.clone(),
            token,
            roles,
            audit,
            watches: crate::api::guard::Watches::new(
                config.api.max_watches_per_user,
                config.api.max_watches_per_connection,
            ),
            token_use: Default::default(),
            max_body_bytes: config.api.max_body_bytes,
            body_read_timeout: Duration::from_millis(config.api.body_read_timeout_ms),
            shutdown: self.coord.handle(),
            metrics,
            ready: self.ready.clone(),
        });
        let (api_cfg, dir) = (config.api.clone(), config.state_dir.clone());
        let tls =
            tokio::task::spawn_blocking(move || crate::tls::setup(&api_cfg.tls_settings(), &dir))
                .await?
                .context("api tls")?;
        let tls = tls.map(|t| {
            let acceptor = tokio_rustls::TlsAcceptor::from(t.config.clone());
            let (s, r) = (self.coord.handle(), self.reloads.subscribe());
            self.tasks.spawn(async move {
                t.watch(s, r).await;
                Ok(())
            });
            crate::listen::router::Tls {
                acceptor,
                peer: crate::tls::peer_extensions,
            }
        });
        let listener = tokio::net::TcpListener::bind(config.api.listen)
            .await
            .with_context(|| format!("binding api listener {}", config.api.listen))?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(addr = %listener.local_addr()?, scheme, "api listening");
        // The lease list reports pool usage per configured subnet.
        let pools = dhcp_pools(config);
        let extra = crate::provision::router(self.runner.clone())
            .merge(crate::dhcp::api::leases_router(self.leases.clone(), pools))
            .merge(crate::api::preview::router(self.boot_slot.clone()));
        if let Some(addr) = config.api.metrics_listen {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding metrics listener {addr}"))?;
            tracing::info!(addr = %l.local_addr()?, "metrics listening (no authentication)");
            let app = crate::api::rest::metrics_router(api_state.clone());
            let admission = crate::listen::Admission::new(
                "metrics",
                config.api.limits(),
                crate::listen::ConnMetrics::default(),
            );
            let s = self.coord.handle();
            self.tasks.spawn(async move {
                crate::listen::router::serve_router(l, app, admission, None, 8, s)
                    .await
                    .context("metrics server")
            });
        }
        let app = crate::api::rest::router(api_state, Some(extra));
        let admission = crate::listen::Admission::new("api", config.api.limits(), api_conns);
        let s = self.coord.handle();
        let streams = config.api.http2_max_concurrent_streams;
        self.tasks.spawn(async move {
            crate::listen::router::serve_router(listener, app, admission, tls, streams, s)
                .await
                .context("api server")
        });
        Ok(())
    }

    /// Events: keep the store's within `[events]` (every appliance; deletes are
    /// idempotent).
    fn start_event_collection(&mut self, config: &Config) {
        let (store, settings, mut s) = (
            self.store.clone(),
            config.events.clone(),
            self.coord.handle(),
        );
        self.tasks.spawn(async move {
            crate::store::events::collect(store, settings, async move { s.recv().await }).await;
            Ok(())
        });
    }

    /// Secrets at rest: re-encrypt under the key file's first key (every appliance).
    fn start_key_rotation(&mut self) {
        let (store, metrics, mut s) = (
            self.store.clone(),
            self.seal_metrics.clone(),
            self.coord.handle(),
        );
        let reload = self.reloads.subscribe();
        self.tasks.spawn(async move {
            crate::store::rotate::run(store, metrics, async move { s.recv().await }, reload).await;
            Ok(())
        });
    }

    /// The controller groups: here, or (etcd) each under its leader election. With
    /// the controllers off, only the NFS backend runs (on every appliance).
    fn start_controller_groups(&mut self, config: &Config) -> Result<()> {
        let management = match config.discovery.management() {
            false => None,
            true => {
                let d = &config.discovery;
                let db = crate::controller::discovery::endpoints::load_db(d.mac_db.as_deref())?;
                tracing::info!(prefixes = db.len(), "management network discovery on");
                Some(crate::controller::discovery::endpoints::Inputs {
                    db: Arc::new(db),
                    metrics: self.discovery_metrics.clone(),
                    cap: d.cap(),
                    approved: d.approved()?,
                    leases: self.mgmt_leases.clone(),
                    wake: self.mgmt_wake.clone(),
                })
            }
        };
        let c = Arc::new(Controllers {
            config: config.clone(),
            resolver: self.resolver.clone(),
            runner: self.runner.clone(),
            boot_slot: self.boot_slot.clone(),
            redfish_metrics: self.redfish_metrics.clone(),
            power_metrics: self.power_metrics.clone(),
            management,
        });
        #[cfg(feature = "etcd")]
        if let crate::store::Backend::Etcd(e) = self.store.kv() {
            if config.controller.enabled {
                let etcd = e.client().clone();
                for (group, start) in GROUPS {
                    let election = crate::store::etcd::election::Election::new(
                        etcd.clone(),
                        &config.store.etcd,
                        group,
                    );
                    let lead = Lead {
                        election,
                        store: self.store.clone(),
                        controllers: c.clone(),
                        start,
                        metrics: self.leader_metrics.clone(),
                    };
                    let s = self.coord.handle();
                    self.tasks.spawn(lead.run(s));
                }
                return Ok(());
            }
        }
        for (_, start) in GROUPS {
            start(&c, self.store.clone(), &self.coord, &mut self.tasks)?;
        }
        Ok(())
    }

    /// The boot listener over the store-backed boot index.
    fn start_boot_http(&mut self, config: &Config) -> Result<()> {
        let dhcp_leases = config.dhcp.enabled.then(|| self.leases.clone());
        // Agent boots: first boots (the discovery image's script and the agent's
        // inventory) and cleanups (the agent wipes, reports), both reports written by
        // the report writer.
        let d = &config.discovery;
        let first_boots = d.enabled && d.first_boot;
        // A Server or a claim may ask for a wipe whatever the default, so the cleanup
        // agent is served whenever the controller runs.
        let wipes = config.controller.enabled;
        let agent = (first_boots || wipes).then(|| {
            let (tx, rx) = tokio::sync::mpsc::channel(crate::controller::reports::QUEUE);
            let (store, s) = (self.store.clone(), self.coord.handle());
            // Addresses of the dynamic pools are not registered from inventories.
            let pools = dhcp_pools(config);
            self.tasks.spawn(async move {
                crate::controller::reports::run(store, rx, pools, s).await;
                Ok(())
            });
            crate::controller::bootside::AgentImages {
                discovery: first_boots.then(|| d.image.clone()),
                cleanup: wipes.then(|| {
                    crate::controller::cleanup::Cleanup::agent_image(&config.cleanup, d).to_string()
                }),
                reports: tx,
            }
        });
        let index = crate::controller::bootside::StoreBootIndex::start(
            self.store.clone(),
            self.resolver.clone(),
            config.public_http_url(),
            dhcp_leases,
            agent,
            self.coord.handle(),
        );
        let app = Arc::new(
            crate::http::BootHttp::from_config(
                &config.http,
                &config.boot,
                &config.state_dir,
                index,
                self.http_metrics.clone(),
            )?
            .with_discovery(d.lldp_wait_secs),
        );
        let _ = self.boot_slot.set(app.clone());
        let (http, s) = (config.http.clone(), self.coord.handle());
        self.tasks.spawn(async move {
            crate::http::run(&http, app, s)
                .await
                .context("boot http server")
        });
        Ok(())
    }

    /// DHCP, with the config file's reservations plus the registered Servers'.
    fn start_dhcp(&mut self, config: &Config) -> Result<()> {
        let settings =
            crate::dhcp::DhcpSettings::from_config(&config.dhcp, &config.public_http_url())?;
        let r =
            crate::dhcp::reservations::start(self.store.clone(), &settings, self.coord.handle());
        // iPXE on a known machine's MAC gets a token for its script (the boot listener
        // mints it, when `http.sign_ignition_urls` is on).
        let slot = self.boot_slot.clone();
        let scripts = crate::dhcp::MachineScripts(Arc::new(move |mac, addr, now| {
            slot.get()?.machine_script_token(mac, addr, now)
        }));
        let scope = crate::dhcp::Scope {
            log_path: config.state_dir.join(crate::dhcp::LEASE_FILE),
            grants: None,
            shared: shared_leases(config, "boot"),
            machine_scripts: Some(scripts),
        };
        let (l, s, metrics) = (
            self.leases.clone(),
            self.coord.handle(),
            self.dhcp_metrics.clone(),
        );
        self.tasks.spawn(async move {
            crate::dhcp::run_scope(settings, scope, metrics, l, Some(r), s)
                .await
                .context("dhcp server")
        });
        Ok(())
    }

    /// The management scope (`[discovery.dhcp]`: a second DHCP server on its own
    /// interface and lease log), whose leases the Endpoint intake reads (in the `metal`
    /// controller group); each lease granted here wakes it.
    fn start_management(&mut self, config: &Config) -> Result<()> {
        use crate::controller::discovery::endpoints::{wake_on_grants, GRANT_QUEUE};
        let d = &config.discovery;
        let settings = crate::dhcp::DhcpSettings::from_config(&d.dhcp, &config.public_http_url())
            .context("discovery.dhcp")?;
        let (tx, rx) = tokio::sync::mpsc::channel(GRANT_QUEUE);
        let scope = crate::dhcp::Scope {
            log_path: config.state_dir.join(MANAGEMENT_LEASE_FILE),
            grants: Some(tx),
            shared: shared_leases(config, "management"),
            machine_scripts: None,
        };
        let (metrics, s) = (self.mgmt_dhcp_metrics.clone(), self.coord.handle());
        let index = self.mgmt_leases.clone();
        self.tasks.spawn(async move {
            crate::dhcp::run_scope(settings, scope, metrics, index, None, s)
                .await
                .context("management dhcp server")
        });
        let (wake, s) = (self.mgmt_wake.clone(), self.coord.handle());
        self.tasks.spawn(async move {
            wake_on_grants(rx, wake, s).await;
            Ok(())
        });
        Ok(())
    }

    fn start_tftp(&mut self, config: &Config) {
        let (tftp, s) = (config.tftp.clone(), self.coord.handle());
        let metrics = self.tftp_metrics.clone();
        self.tasks.spawn(async move {
            crate::tftp::run(&tftp, metrics, s)
                .await
                .context("tftp server")
        });
    }

    /// SIGHUP: the log filter (from the config read again), the image catalog and
    /// the Ignition templates here; the API's TLS files and the encryption key file by
    /// their own tasks (told through `reloads`). Nothing else changes at run time: a
    /// changed config key other than `log.filter` is named in a warning. What fails to
    /// load keeps its previous version. Never stops the process.
    async fn reload(&self, config: &mut Config, reload: &Reload) {
        self.reloads.notify();
        let (resolver, images) = (self.resolver.clone(), config.boot.images_dir.clone());
        let boot = tokio::task::spawn_blocking(move || resolver.reload(&images)).await;
        let read = reload.config.clone();
        let fresh = tokio::task::spawn_blocking(move || read())
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("reading the config: {e}")));
        let log_filter = match fresh {
            Err(e) => {
                tracing::error!(
                    error = format!("{e:#}"),
                    "config not read again on SIGHUP; the log filter stays {:?}",
                    config.log.filter
                );
                "unchanged (config error)".to_string()
            }
            Ok(new) => {
                let changed = changed_keys(config, &new);
                if !changed.is_empty() {
                    tracing::warn!(keys = ?changed, "config keys changed that take effect only at restart");
                }
                if new.log.filter == config.log.filter {
                    "unchanged".to_string()
                } else {
                    match reload.log_filter.set(&new.log.filter) {
                        Ok(()) => {
                            config.log.filter = new.log.filter.clone();
                            format!("now {:?}", new.log.filter)
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "log.filter not changed");
                            "unchanged (invalid)".to_string()
                        }
                    }
                }
            }
        };
        let show = |r: &Result<usize, String>, what: &str| match r {
            Ok(n) => format!("{n} {what}"),
            Err(e) => format!("kept the previous ones ({e})"),
        };
        match boot {
            Ok(b) => tracing::info!(
                templates = %show(&b.templates, "loaded"),
                catalog = %show(&b.catalog, "images"),
                log_filter = %log_filter,
                "SIGHUP: reloaded the Ignition templates, the image catalog and the log filter; the API's TLS files and the encryption key file are read again"
            ),
            Err(e) => {
                tracing::error!(error = %e, log_filter = %log_filter, "SIGHUP: reloading the catalog and templates failed")
            }
        }
    }

    /// Until SIGINT/SIGTERM or a service ending on its own (reloading on each SIGHUP);
    /// then drain every service (bounded) and close the store.
    async fn wait_and_drain(
        mut self,
        mut signals: crate::shutdown::Signals,
        mut config: Config,
        reload: Reload,
    ) -> Result<()> {
        use crate::shutdown::Caught;
        let failed = loop {
            let caught = tokio::select! {
                c = signals.recv() => Ok(c),
                Some(res) = self.tasks.join_next() => Err(res),
            };
            match caught {
                Ok(Caught::Stop) => break None,
                Ok(Caught::Reload) => self.reload(&mut config, &reload).await,
                Err(res) => break Some(res),
            }
        };
        if !self.coord.drain(Duration::from_secs(10)).await {
            tracing::warn!("some tasks did not finish within 10s of shutdown");
        }
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let st = self.store.clone();
        tokio::task::spawn_blocking(move || st.close()).await.ok();
        if let Some(res) = failed {
            res.context("service task panicked")??;
            anyhow::bail!("a service stopped unexpectedly");
        }
        tracing::info!("bootplane stopped");
        Ok(())
    }
}

impl Controllers {
    /// The metal reconcilers (claims, servers, boot configurations, BMCs) and power.
    fn start_metal(
        &self,
        store: Store,
        coord: &Coordinator,
        tasks: &mut JoinSet<Result<()>>,
    ) -> Result<()> {
        let config = &self.config;
        // The management network's Endpoints: one intake for the cluster (this group's
        // leader's), whether or not the other controllers run.
        if let Some(inputs) = &self.management {
            let mgmt = crate::controller::discovery::Management::new(store.clone(), inputs.clone());
            let (s, workers) = (coord.handle(), config.controller.workers);
            tasks.spawn(async move {
                mgmt.run(workers, s).await;
                Ok(())
            });
        }
        if !config.controller.enabled {
            return Ok(());
        }
        let default = crate::power::from_config(
            &config.controller.power_driver,
            &config.power,
            &config.state_dir,
        )?;
        // Servers naming a BMC are powered through Redfish, the rest by the default.
        let targets = Arc::new(BootTargets(self.boot_slot.clone()));
        let redfish = crate::power::redfish::Redfish::new(
            store.clone(),
            config.power.redfish.clone(),
            targets,
            self.redfish_metrics.clone(),
        )?;
        let bmcs = crate::controller::bmc::BmcControllers::new(
            store.clone(),
            redfish.pool().clone(),
            Duration::from_secs(config.power.redfish.poll_interval_secs),
            (config.discovery.enabled)
                .then(|| config.discovery.systems_policy())
                .transpose()?,
        );
        let power = Arc::new(crate::power::metrics::Metered {
            inner: Arc::new(crate::power::redfish::PerServer {
                default,
                redfish: redfish.clone(),
            }),
            metrics: self.power_metrics.clone(),
        });
        let ctrl = crate::controller::Controllers::new(
            store.clone(),
            power,
            self.resolver.clone(),
            (
                crate::controller::firstboot::FirstBoot::from_config(&config.discovery),
                Some(crate::controller::cleanup::Cleanup::from_config(
                    &config.cleanup,
                    &config.discovery,
                )),
            ),
            crate::store::events::Recorder::spawn(store.clone(), "bootplane-controller"),
        );
        let s = coord.handle();
        tasks.spawn(async move {
            redfish.run(s).await;
            Ok(())
        });
        let (s, workers) = (coord.handle(), config.controller.workers);
        tasks.spawn(async move {
            bmcs.run(workers, s).await;
            Ok(())
        });
        let (s, workers) = (coord.handle(), config.controller.workers);
        tasks.spawn(async move {
            ctrl.run(workers, s).await;
            Ok(())
        });
        Ok(())
    }

    /// The NFS export backend and the provisioning reconcilers.
    fn start_provisioning(
        &self,
        store: Store,
        coord: &Coordinator,
        tasks: &mut JoinSet<Result<()>>,
    ) -> Result<()> {
        let config = &self.config;
        let nfs = &config.nfs;
        let backend: Arc<dyn crate::nfs::ExportBackend> = if nfs.enabled {
            crate::nfs::from_config(nfs, &config.state_dir)?
        } else {
            Arc::new(crate::nfs::Disabled)
        };
        let p = &config.provision;
        let settings = crate::controller::provisioning::Settings {
            images_dir: p
                .images_dir
                .clone()
                .unwrap_or_else(|| config.state_dir.join(NFS_IMAGES_DIR)),
            nfs_server: p.nfs_server.clone(),
            job_address: p.job_address.clone(),
            nfs_enabled: nfs.enabled,
        };
        if nfs.enabled {
            std::fs::create_dir_all(&settings.images_dir)
                .with_context(|| format!("creating {}", settings.images_dir.display()))?;
        }
        let s = coord.handle();
        if config.controller.enabled {
            let c = crate::controller::provisioning::Provisioning::new(
                store.clone(),
                backend,
                self.runner.clone(),
                settings,
                crate::store::events::Recorder::spawn(store.clone(), "bootplane-provisioning"),
            );
            let (workers, run_backend) = (config.controller.workers, nfs.enabled);
            tasks.spawn(async move {
                c.run(workers, s, run_backend).await;
                Ok(())
            });
        } else if nfs.enabled {
            tasks.spawn(async move {
                backend.run(s).await;
                Ok(())
            });
        }
        Ok(())
    }
}

/// One controller group under its leader election (etcd backend): campaign, run the
/// group on the fenced store while leading, stop it when the lease is lost (or a
/// reconciler ends), resign, campaign again.
#[cfg(feature = "etcd")]
struct Lead {
    election: crate::store::etcd::election::Election,
    store: Store,
    controllers: Arc<Controllers>,
    start: StartGroup,
    metrics: crate::store::etcd::election::Metrics,
}

#[cfg(feature = "etcd")]
impl Lead {
    async fn run(self, mut shutdown: crate::shutdown::Shutdown) -> Result<()> {
        let group = self.election.group;
        let stop = tokio_util::sync::CancellationToken::new();
        loop {
            let leadership = tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                l = self.election.campaign(&stop) => l,
            };
            let Some(leadership) = leadership else {
                return Ok(());
            };
            tracing::info!(group, "became leader");
            self.metrics.set(group, true);
            let coord = Coordinator::new();
            let mut tasks = JoinSet::new();
            let fenced = self.store.fenced(leadership.fence.clone());
            let mut done = false;
            match (self.start)(&self.controllers, fenced, &coord, &mut tasks) {
                Err(e) => {
                    tracing::error!(group, error = %format!("{e:#}"), "starting the controllers failed")
                }
                Ok(()) => {
                    done = tokio::select! {
                        _ = shutdown.recv() => true,
                        _ = leadership.lost() => {
                            tracing::warn!(group, "lost leadership: election lease not renewed in time");
                            false
                        }
                        Some(r) = tasks.join_next() => {
                            tracing::error!(group, result = ?r.map(|r| r.map_err(|e| format!("{e:#}"))), "a controller stopped; resigning");
                            false
                        }
                    };
                }
            }
            self.metrics.set(group, false);
            if !coord.drain(Duration::from_secs(8)).await {
                tracing::warn!(group, "some controllers did not finish within 8s");
            }
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
            leadership.resign().await;
            tracing::info!(group, "stepped down");
            if done {
                return Ok(());
            }
            // Give another appliance the first chance.
            tokio::select! {
                _ = shutdown.recv() => return Ok(()),
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}
