//! Request handling for the boot listener: route, identity check, render or stream,
//! then one access log line and the metrics. Independent of the socket loop
//! ([`super::server`]), so unit tests and fuzz targets call it without a socket.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::files::{self, FileBody, FileIo, Root, StreamBudget};
use super::metrics::RouteLabels;
use super::respond::{
    bad_request, header_value, ranged_response, route, strip_body, text, Query, Resp, Source,
};
use super::token::{Purpose, TokenSigner};
use super::{BootEvent, BootIndex, BootState, MachineBoot, MachineId, Metrics};
use crate::ipxe::{DefaultAction, MachineScript, Renderer};
use crate::model::ident::{parse_mac, parse_uuid, MacFmt};
use crate::model::meta::valid_object_name;
use crate::sys::unix_now;

/// Where iPXE binaries come from when the assets directory lacks them.
pub(crate) const IPXE_SYSTEM_DIR: &str = "/usr/lib/ipxe";
/// The iPXE binaries served from [`IPXE_SYSTEM_DIR`] as a fallback.
pub(crate) const IPXE_BINARIES: [&str; 3] = ["undionly.kpxe", "ipxe.efi", "snponly.efi"];

/// Everything [`BootHttp`] needs, explicit so tests can build one without a config file.
pub struct Settings {
    /// URL machines use to reach this listener, without a trailing slash.
    pub base_url: String,
    pub console: String,
    pub default_action: DefaultAction,
    pub token_ttl_secs: u64,
    pub signer: TokenSigner,
    /// Operator templates (name, text) overriding the built-in ones.
    pub templates: Vec<(String, String)>,
    pub assets_dir: Option<PathBuf>,
    pub images_dir: Option<PathBuf>,
    pub ipxe_fallback_dir: Option<PathBuf>,
    pub file_io: FileIo,
    pub stream_budget_bytes: usize,
    /// Put a signed token into the Ignition URL of every script (default), and ask one of
    /// every request for a script that carries a machine's secret (its DHCP reply has
    /// one, [`BootHttp::machine_script_token`]). Without it the script and the
    /// Ignition are served to the machine's registered addresses only.
    pub sign_ignition_urls: bool,
}

/// The boot listener's application state.
pub struct BootHttp {
    pub(super) index: Arc<dyn BootIndex>,
    pub(super) renderer: Renderer,
    pub(super) signer: TokenSigner,
    pub(super) metrics: Arc<Metrics>,
    pub(super) base_url: String,
    pub(super) console: String,
    default_action: DefaultAction,
    pub(super) token_ttl: u64,
    /// `bootplane.lldp_wait=` in discovery scripts ([`BootHttp::with_discovery`]).
    pub(super) lldp_wait_secs: u32,
    assets: Option<Root>,
    images: Option<Root>,
    ipxe_fallback: Option<PathBuf>,
    budget: Arc<StreamBudget>,
    boot_script: Bytes,
    sign_ignition_urls: bool,
    /// `http.ignition_once`: a machine's Ignition is served once per boot
    /// ([`BootIndex::take_ignition`]).
    ignition_once: bool,
    scripts: std::sync::RwLock<std::collections::HashMap<String, CachedScript>>,
    pub(super) boot_iso: super::bootiso::BootIso,
}

/// A rendered per-machine script, reused while the machine entry is unchanged (same
/// `Arc`) and its token has at least half its lifetime left: rendering and signing per
/// request would cost more than the request itself.
struct CachedScript {
    machine: Arc<MachineBoot>,
    body: Bytes,
    minted: u64,
}

/// Cached scripts beyond this are dropped wholesale (entries are per machine).
const SCRIPT_CACHE_MAX: usize = 100_000;

impl BootHttp {
    pub fn new(
        s: Settings,
        index: Arc<dyn BootIndex>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<BootHttp> {
        let renderer = Renderer::new(&s.templates).context("compiling ipxe templates")?;
        let base_url = s.base_url.trim_end_matches('/').to_string();
        let boot_script = Bytes::from(
            renderer
                .boot_script(&base_url)
                .context("rendering boot.ipxe")?,
        );
        // Probe the default script once so a broken template fails at start, not per request.
        renderer
            .default_script(&s.default_action, "probe", &base_url, &s.console)
            .context("rendering default.ipxe")?;
        let root = |d: &Option<PathBuf>, what: &str| -> Option<Root> {
            let d = d.as_ref()?;
            match Root::new(d) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(dir = %d.display(), error = %e, "{what} directory not usable, not serving it");
                    None
                }
            }
        };
        Ok(BootHttp {
            index,
            assets: root(&s.assets_dir, "assets"),
            images: root(&s.images_dir, "images"),
            ipxe_fallback: s.ipxe_fallback_dir.clone(),
            renderer,
            signer: s.signer,
            metrics,
            base_url,
            console: s.console,
            default_action: s.default_action,
            token_ttl: s.token_ttl_secs,
            budget: Arc::new(StreamBudget::new(s.stream_budget_bytes, s.file_io)),
            boot_script,
            sign_ignition_urls: s.sign_ignition_urls,
            ignition_once: false,
            scripts: Default::default(),
            boot_iso: super::bootiso::BootIso::unconfigured(),
            lldp_wait_secs: 10,
        })
    }

    /// How long discovery agents listen for LLDP (`[discovery] lldp_wait_secs`).
    pub fn with_discovery(mut self, lldp_wait_secs: u32) -> BootHttp {
        self.lldp_wait_secs = lldp_wait_secs;
        self
    }

    /// Settings from the `[http]` and `[boot]` sections: templates from
    /// `boot.ipxe_templates`, token key from `http.token_key_file` (default
    /// `<state_dir>/http-token-key`, created when absent), discovery image from the catalog.
    pub fn from_config(
        h: &super::HttpConfig,
        boot: &super::BootConfig,
        state_dir: &Path,
        index: Arc<dyn BootIndex>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<BootHttp> {
        let base_url = h.public_http_url();
        let default_action = match h.unknown_action.as_str() {
            "exit" => DefaultAction::Exit,
            "retry" => DefaultAction::Retry {
                secs: h.retry_secs.max(1),
            },
            "discovery" => {
                let r = h
                    .discovery_image
                    .as_deref()
                    .context("http.unknown_action = \"discovery\" needs http.discovery_image")?;
                let catalog = super::catalog::load(&boot.images_dir)?;
                let hasher = super::catalog::FileHasher::new(&boot.images_dir);
                let img = hasher
                    .resolve(&catalog, r)
                    .with_context(|| format!("hashing discovery image {r}"))?
                    .with_context(|| format!("resolving discovery image {r}"))?;
                let f = img.boot_files(&base_url);
                DefaultAction::Discovery {
                    kernel_url: f.kernel_url,
                    initrd_url: f.initrd_url,
                    cmdline: f.cmdline,
                }
            }
            other => anyhow::bail!(
                "unknown http.unknown_action {other:?} (expected exit, retry or discovery)"
            ),
        };
        let file_io = match h.file_io.as_str() {
            "sendfile" => FileIo::Sendfile,
            "mmap" => FileIo::Mmap,
            "read" => FileIo::Read,
            other => {
                anyhow::bail!("unknown http.file_io {other:?} (expected sendfile, mmap or read)")
            }
        };
        let key_file = h
            .token_key_file
            .clone()
            .unwrap_or_else(|| state_dir.join("http-token-key"));
        let key = load_or_create_key(&key_file)?;
        let mut templates = Vec::new();
        for (name, _) in crate::ipxe::BUILTIN_TEMPLATES {
            let p = boot.ipxe_templates.join(name);
            match std::fs::read_to_string(&p) {
                Ok(t) => templates.push((name.to_string(), t)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("reading ipxe template {}", p.display()))
                }
            }
        }
        let settings = Settings {
            base_url,
            console: h.console.clone(),
            default_action,
            token_ttl_secs: h.token_ttl_secs,
            signer: TokenSigner::new(&key),
            templates,
            assets_dir: Some(h.assets_dir.clone()),
            images_dir: Some(boot.images_dir.clone()),
            ipxe_fallback_dir: Some(PathBuf::from(IPXE_SYSTEM_DIR)),
            file_io,
            stream_budget_bytes: h.stream_budget_bytes.max(files::MIN_CHUNK),
            sign_ignition_urls: h.sign_ignition_urls,
        };
        let iso = super::bootiso::BootIso::load(&h.boot_iso);
        Ok(BootHttp::new(settings, index, metrics)?
            .with_boot_iso(iso)
            .with_ignition_once(h.ignition_once))
    }

    /// Serve each machine's Ignition once per boot (`http.ignition_once`): a second
    /// fetch is refused until the driver power-cycles the machine or its boot
    /// configuration changes.
    pub(crate) fn with_ignition_once(mut self, once: bool) -> BootHttp {
        self.ignition_once = once;
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// A script URL carrying a signed token for `server`, bound to the boot the index
    /// holds for it now: it stops working when that boot configuration goes or changes,
    /// or the machine is power-cycled.
    pub fn signed_script_url(&self, server: &str) -> String {
        let boot = self
            .index
            .lookup(&MachineId::Server(server.to_string()))
            .map(|m| m.boot_id.clone())
            .unwrap_or_default();
        let t = self
            .signer
            .mint(Purpose::Script, server, &boot, unix_now(), self.token_ttl);
        format!(
            "{}/ipxe/script?server={}&token={}",
            self.base_url, server, t
        )
    }

    /// The script token the DHCP reply to an iPXE client on `mac` carries (option 224;
    /// `boot.ipxe` sends it on to `/ipxe/script`): for the script of the Server holding
    /// `mac`, minted at `now` (unix seconds) for its current boot, and bound to `addr`,
    /// the address the reply leases it, when there is one (the reply may be broadcast:
    /// bound, a copy read off the segment is no use from another address). `None`
    /// without signed URLs or when no Server holds `mac`.
    pub fn machine_script_token(
        &self,
        mac: crate::model::ident::Mac,
        addr: Option<std::net::Ipv4Addr>,
        now: u64,
    ) -> Option<String> {
        if !self.sign_ignition_urls {
            return None;
        }
        let m = self.index.lookup(&MachineId::Mac(mac))?;
        let fields = (m.server.as_str(), m.boot_id.as_str());
        let addr = addr.map(IpAddr::V4);
        Some((self.signer).mint_for(Purpose::Script, fields, addr, now, self.token_ttl))
    }

    /// Handle one request from `client`.
    pub async fn handle<B>(&self, req: Request<B>, client: IpAddr) -> Resp {
        self.handle_with_body(req, Bytes::new(), client).await
    }

    /// Handle one request whose body the connection loop read (only requests for which
    /// [`super::discovery::takes_body`] holds have one).
    pub(crate) async fn handle_with_body<B>(
        &self,
        req: Request<B>,
        body: Bytes,
        client: IpAddr,
    ) -> Resp {
        let start = Instant::now();
        let path = req.uri().path();
        let route = if path == "/boot.ipxe" {
            route::BOOT
        } else if path == "/ipxe/script" {
            route::SCRIPT
        } else if path.starts_with("/ignition/") {
            route::IGNITION
        } else if path.starts_with("/assets/") {
            route::ASSETS
        } else if path == "/boot.iso" || path == "/ipxe/boot.iso" {
            route::ISO
        } else if path == "/ipxe/boot.efi" {
            route::EFI
        } else if path.starts_with(super::respond::INVENTORY_PREFIX) {
            route::INVENTORY
        } else if path.starts_with(super::respond::WIPE_PREFIX) {
            route::WIPE
        } else if path.starts_with(super::respond::INSTALL_PREFIX) {
            route::INSTALL
        } else {
            route::OTHER
        };
        let mut server: Option<Arc<MachineBoot>> = None;
        let resp = if route == route::INVENTORY || route == route::WIPE || route == route::INSTALL {
            if req.method() == Method::POST && route == route::INVENTORY {
                let rest = &path[super::respond::INVENTORY_PREFIX.len()..];
                self.inventory(rest, &body, client, &mut server)
            } else if req.method() == Method::POST && route == route::WIPE {
                let rest = &path[super::respond::WIPE_PREFIX.len()..];
                self.wipe_report(rest, &body, client, &mut server)
            } else if req.method() == Method::POST {
                let rest = &path[super::respond::INSTALL_PREFIX.len()..];
                self.install_report(rest, &body, client, &mut server)
            } else {
                let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("POST"));
                r
            }
        } else if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            r
        } else {
            match route {
                route::BOOT => script_response(StatusCode::OK, self.boot_script.clone()),
                route::SCRIPT => {
                    self.machine_script(req.uri().query().unwrap_or(""), client, &mut server)
                }
                route::IGNITION => self.ignition(&path["/ignition/".len()..], client, &mut server),
                route::ASSETS => self.asset(&req, &path["/assets/".len()..]).await,
                route::ISO | route::EFI => self.boot_target(&req, client, &mut server).await,
                _ => text(StatusCode::NOT_FOUND, "not found\n"),
            }
        };
        let resp = if req.method() == Method::HEAD {
            strip_body(resp)
        } else {
            resp
        };
        let code = resp.status().as_u16();
        // The body's length is the Content-Length the handler set (HEAD bodies are empty).
        let bytes = if req.method() == Method::GET {
            resp.body().remaining()
        } else {
            0
        };
        let elapsed = start.elapsed();
        self.metrics
            .observe(route, code, bytes, elapsed.as_secs_f64());
        // The access line is only formatted when someone listens for it.
        if tracing::enabled!(target: "bootplane::http::access", tracing::Level::INFO) {
            // Never log a token: it is a bearer credential for the machine's Ignition.
            let p = req.uri().path();
            let p = match route {
                route::IGNITION => p.splitn(4, '/').take(3).collect::<Vec<_>>().join("/"),
                route::INVENTORY | route::WIPE | route::INSTALL => {
                    p.splitn(5, '/').take(4).collect::<Vec<_>>().join("/")
                }
                _ => p.to_string(),
            };
            let shown: String = p.chars().take(200).collect();
            tracing::info!(
                target: "bootplane::http::access",
                client = %client,
                method = %req.method(),
                path = %shown,
                status = code,
                bytes,
                micros = elapsed.as_micros() as u64,
                server = server.as_ref().map(|m| m.server.as_str()).unwrap_or("-"),
            );
        }
        resp
    }

    fn refuse(&self, route: &'static str, m: &MachineBoot, client: IpAddr, why: &str) -> Resp {
        self.metrics
            .identity_refused
            .get_or_create(&RouteLabels { route })
            .inc();
        tracing::warn!(server = %m.server, client = %client, route, why, "identity check refused a request");
        text(StatusCode::FORBIDDEN, "forbidden\n")
    }

    fn record(&self, server: &str, event: BootEvent, client: IpAddr) {
        self.metrics.progress(event);
        self.index.record_progress(server, event, client);
    }

    fn default_script(&self, reason: &str) -> Resp {
        script_response(StatusCode::OK, self.default_script_body(reason))
    }

    fn default_script_body(&self, reason: &str) -> Bytes {
        match self.renderer.default_script(
            &self.default_action,
            reason,
            &self.base_url,
            &self.console,
        ) {
            Ok(s) => Bytes::from(s),
            Err(e) => {
                tracing::error!(error = %e, "rendering default ipxe script");
                // Still a runnable script: leave network boot.
                Bytes::from_static(b"#!ipxe\necho bootplane: internal error\nexit\n")
            }
        }
    }

    fn machine_script(
        &self,
        query: &str,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Resp {
        let q = match Query::parse(query) {
            Ok(q) => q,
            Err(msg) => return bad_request(&msg),
        };
        // Every identifier is checked before any is looked up: a malformed one is a 400
        // whatever the others say. Looked up in this order, the first known one wins.
        let server = match q.server.as_deref() {
            Some(s) if !valid_object_name(s) => return bad_request("malformed server name"),
            Some(s) => Some(MachineId::Server(s.to_string())),
            None => None,
        };
        let uuid = match q.uuid.as_deref().map(parse_uuid) {
            Some(Ok(u)) => Some(MachineId::Uuid(u)),
            Some(Err(e)) => return bad_request(&e.to_string()),
            None => None,
        };
        let mac = match q.mac.as_deref().map(parse_mac) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => return bad_request(&e.to_string()),
            None => None,
        };
        let ids = [
            server,
            uuid,
            mac.map(MachineId::Mac),
            Some(MachineId::Ip(client)),
        ];
        let Some(m) = ids.iter().flatten().find_map(|id| self.index.lookup(id)) else {
            let who = match (&q.uuid, mac) {
                (Some(u), _) => format!("uuid {u}"),
                (None, Some(m)) => format!("mac {}", MacFmt(&m)),
                _ => format!("address {client}"),
            };
            tracing::info!(client = %client, who = %who, "unknown machine, serving default script");
            return self.default_script(&format!("unknown machine ({who})"));
        };
        *server_out = Some(m.clone());
        let now = unix_now();
        // With signed URLs a token, when there is one, is always checked, and a script
        // that carries a secret of the machine (its Ignition token, its inventory
        // token) needs one whatever the source address: the machine gets it in its
        // DHCP reply (`boot.ipxe` sends it on), its boot ISO or its HTTP boot URI
        // (docs/threat-model.md). Without signed URLs the machine's own address (or
        // its DHCP lease) is the identity.
        let ok = q.token.as_deref().map(|t| {
            let fields = (m.server.as_str(), m.boot_id.as_str());
            (self.signer).verify_from(t, Purpose::Script, fields, client, now)
        });
        match ok {
            Some(Ok(())) => {}
            Some(Err(e)) if self.sign_ignition_urls || !self.index.owns(&m, client) => {
                return self.refuse(route::SCRIPT, &m, client, &e.to_string())
            }
            Some(Err(_)) => {}
            None if self.sign_ignition_urls
                && matches!(
                    m.state,
                    BootState::Ready
                        | BootState::Discovery
                        | BootState::Cleanup(_)
                        | BootState::Install(_)
                ) =>
            {
                return self.refuse(route::SCRIPT, &m, client, "no token")
            }
            None if !self.index.owns(&m, client) => {
                return self.refuse(
                    route::SCRIPT,
                    &m,
                    client,
                    "source address not registered and no token",
                )
            }
            None => {}
        }
        let (body, machine_specific) = self.script_for(&m, now);
        if machine_specific {
            self.record(&m.server, BootEvent::IpxeScriptFetched, client);
        }
        script_response(StatusCode::OK, body)
    }

    /// The script `m` gets once its identity is established, and whether it is its own
    /// script (true) or the default one.
    fn script_for(&self, m: &Arc<MachineBoot>, now: u64) -> (Bytes, bool) {
        let default = |reason: &str| (self.default_script_body(reason), false);
        match (&m.state, &m.files) {
            (BootState::Ready, Some(files)) => match self.cached_script(m, files, now) {
                Ok(body) => (body, true),
                Err(e) => {
                    tracing::error!(server = %m.server, error = %e, "rendering machine script");
                    default(&format!("cannot render the script of {}", m.server))
                }
            },
            (BootState::Ready, None) => default(&format!("{} has no boot files", m.server)),
            (BootState::NotClaimed, _) => default(&format!("{} is not claimed", m.server)),
            (BootState::Discovery, Some(files)) => match self.discovery_script(m, files) {
                Ok(body) => (body, true),
                Err(e) => {
                    tracing::error!(server = %m.server, error = %e, "rendering discovery script");
                    default(&format!(
                        "cannot render the discovery script of {}",
                        m.server
                    ))
                }
            },
            (BootState::Discovery, None) => default(&format!(
                "{} is in Discovery but the discovery image is not available",
                m.server
            )),
            (BootState::Cleanup(policy), Some(files)) => {
                match self.cleanup_script(m, files, *policy) {
                    Ok(body) => (body, true),
                    Err(e) => {
                        tracing::error!(server = %m.server, error = %e, "rendering cleanup script");
                        default(&format!("cannot render the cleanup script of {}", m.server))
                    }
                }
            }
            (BootState::Cleanup(_), None) => default(&format!(
                "{} is in Cleanup but the agent image is not available",
                m.server
            )),
            (BootState::Install(plan), Some(files)) => {
                match self.install_script(m, files, plan, now) {
                    Ok(body) => (body, true),
                    Err(e) => {
                        tracing::error!(server = %m.server, error = %e, "rendering install script");
                        default(&format!("cannot render the install script of {}", m.server))
                    }
                }
            }
            (BootState::Install(_), None) => default(&format!(
                "{} is to install its disk image but the agent image is not available",
                m.server
            )),
            (BootState::LocalBoot, _) => {
                let reason = format!(
                    "{}: its disk image is installed, booting from disk",
                    m.server
                );
                let body = self
                    .renderer
                    .default_script(&DefaultAction::Exit, &reason, &self.base_url, &self.console)
                    .map(Bytes::from)
                    .unwrap_or_else(|e| {
                        tracing::error!(server = %m.server, error = %e, "rendering local boot script");
                        self.default_script_body(&reason)
                    });
                (body, true)
            }
            (BootState::Error(r), _) => {
                tracing::info!(server = %m.server, reason = %r, "boot configuration in error, serving default script");
                default(&format!(
                    "boot configuration of {} is not ready: {r}",
                    m.server
                ))
            }
        }
    }

    /// What server `name` would be served at `/ipxe/script` (its script, or the
    /// default script with the reason), for the operator's preview
    /// (`bootplane render ipxe`). Records no boot progress. `None`: unknown server.
    pub fn preview_script(&self, name: &str) -> Option<Bytes> {
        let m = self.index.lookup(&MachineId::Server(name.to_string()))?;
        Some(self.script_for(&m, unix_now()).0)
    }

    /// The machine index this listener answers from.
    pub fn index(&self) -> &Arc<dyn BootIndex> {
        &self.index
    }

    /// The machine's rendered script, from the cache when still fresh.
    fn cached_script(
        &self,
        m: &Arc<MachineBoot>,
        files: &super::BootFiles,
        now: u64,
    ) -> Result<Bytes, crate::ipxe::RenderError> {
        let fresh_for = self.token_ttl / 2;
        {
            let cache = self.scripts.read().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = cache.get(&m.server) {
                if Arc::ptr_eq(&c.machine, m) && now >= c.minted && now - c.minted < fresh_for {
                    return Ok(c.body.clone());
                }
            }
        }
        let ignition_url = if self.sign_ignition_urls {
            let token = self.signer.mint(
                Purpose::Ignition,
                &m.server,
                &m.boot_id,
                now,
                self.token_ttl,
            );
            format!("{}/ignition/{}/{}", self.base_url, m.server, token)
        } else {
            format!("{}/ignition/{}", self.base_url, m.server)
        };
        let ms = MachineScript {
            server: &m.server,
            image: &files.image,
            arch: &files.arch,
            kernel_url: &files.kernel_url,
            initrd_url: &files.initrd_url,
            rootfs_url: &files.rootfs_url,
            cmdline: &files.cmdline,
            ignition_url: &ignition_url,
            console: &self.console,
            base_url: &self.base_url,
        };
        let body = Bytes::from(self.renderer.machine_script(&ms)?);
        let mut cache = self.scripts.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= SCRIPT_CACHE_MAX {
            cache.clear();
        }
        cache.insert(
            m.server.clone(),
            CachedScript {
                machine: m.clone(),
                body: body.clone(),
                minted: now,
            },
        );
        Ok(body)
    }

    fn ignition(
        &self,
        rest: &str,
        client: IpAddr,
        server_out: &mut Option<Arc<MachineBoot>>,
    ) -> Resp {
        let (name, token) = match rest.split_once('/') {
            Some((n, t)) => (n, Some(t)),
            None => (rest, None),
        };
        if !valid_object_name(name) {
            return bad_request("malformed server name");
        }
        let Some(m) = self.index.lookup(&MachineId::Server(name.to_string())) else {
            return text(StatusCode::NOT_FOUND, "not found\n");
        };
        *server_out = Some(m.clone());
        // With signed URLs the token is the only credential: a registered source
        // address is not enough (anyone on the segment can take it; see
        // docs/threat-model.md). Without them the address is.
        let verified = token.map(|t| {
            self.signer
                .verify(t, Purpose::Ignition, &m.server, &m.boot_id, unix_now())
        });
        match verified {
            Some(Ok(())) => {}
            Some(Err(e)) if self.sign_ignition_urls || !self.index.owns(&m, client) => {
                return self.refuse(route::IGNITION, &m, client, &e.to_string())
            }
            Some(Err(_)) => {}
            None if self.sign_ignition_urls => {
                return self.refuse(route::IGNITION, &m, client, "no token")
            }
            None if !self.index.owns(&m, client) => {
                return self.refuse(
                    route::IGNITION,
                    &m,
                    client,
                    "source address not registered and no token",
                )
            }
            None => {}
        }
        match (&m.state, &m.ignition) {
            (BootState::Ready | BootState::Install(_), Some(_))
                if self.ignition_once && !self.index.take_ignition(&m) =>
            {
                self.refuse(
                    route::IGNITION,
                    &m,
                    client,
                    "ignition already served in this boot",
                )
            }
            (BootState::Ready | BootState::Install(_), Some(ign)) => {
                self.record(&m.server, BootEvent::IgnitionDataFetched, client);
                let mut r = Response::new(FileBody::bytes(ign.data.clone()));
                let h = r.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    header_value(&ign.content_type, "application/json"),
                );
                h.insert(
                    header::CONTENT_LENGTH,
                    HeaderValue::from(ign.data.len() as u64),
                );
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                r
            }
            _ => text(StatusCode::NOT_FOUND, "no ignition for this machine\n"),
        }
    }

    pub(super) async fn asset<B>(&self, req: &Request<B>, raw: &str) -> Resp {
        let rel = match files::sanitize(raw) {
            Ok(r) => r,
            Err(e) => return bad_request(&e.to_string()),
        };
        let (root, rel) = match rel.strip_prefix("images/") {
            Some(r) => (self.images.clone(), r.to_string()),
            None => (self.assets.clone(), rel),
        };
        let fallback = match &self.ipxe_fallback {
            Some(d) if IPXE_BINARIES.contains(&rel.as_str()) => Some(d.join(&rel)),
            _ => None,
        };
        let rel2 = rel.clone();
        let opened =
            tokio::task::spawn_blocking(move || -> std::io::Result<Option<files::OpenFile>> {
                if let Some(f) = root.as_ref().map(|r| r.open(&rel2)).transpose()?.flatten() {
                    return Ok(Some(f));
                }
                match fallback {
                    Some(p) => files::open_file(p),
                    None => Ok(None),
                }
            })
            .await;
        let f = match opened {
            Ok(Ok(Some(f))) => f,
            Ok(Ok(None)) => return text(StatusCode::NOT_FOUND, "not found\n"),
            Ok(Err(e)) => {
                tracing::warn!(path = %rel, error = %e, "opening asset");
                return text(StatusCode::NOT_FOUND, "not found\n");
            }
            Err(e) => {
                tracing::error!(error = %e, "asset open task failed");
                return text(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n");
            }
        };
        let meta = f.meta.clone();
        let ctype = files::content_type(&rel);
        ranged_response(req, &meta, ctype, Source::File(f.file, self.budget.clone()))
    }
}

/// A script, or the text that stands for one. No `Content-Length` here: the connection
/// writes the body's own (one header value fewer to allocate on the hottest route).
fn script_response(status: StatusCode, body: Bytes) -> Resp {
    let mut r = Response::new(FileBody::bytes(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Read the token key, or create 32 random bytes (mode 0600) when the file is absent. A
/// key group or others may read is refused, as the encryption key file is: whoever reads
/// it mints boot tokens.
fn load_or_create_key(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::MetadataExt as _;
    match std::fs::metadata(path).map(|m| m.mode() & 0o7777) {
        Ok(mode) if mode & 0o077 != 0 => anyhow::bail!(
            "token key {} has mode {mode:04o}: group or others may read it; make it 0600 (chmod 600) and restart",
            path.display()
        ),
        _ => {}
    }
    match std::fs::read(path) {
        Ok(k) if k.len() >= 32 => return Ok(k),
        Ok(_) => anyhow::bail!("token key {} is shorter than 32 bytes", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading token key {}", path.display())),
    }
    use rand::RngCore;
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut key = vec![0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut key);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating token key {}", path.display()))?;
    f.write_all(&key)
        .with_context(|| format!("writing token key {}", path.display()))?;
    Ok(key)
}

#[cfg(test)]
#[path = "handler_tests.rs"]
mod tests;
