//! Configuration: one TOML file with documented defaults, overridden by flags and
//! environment variables, validated into a [`Config`] before anything starts.
//!
//! Precedence (lowest to highest): built-in defaults → TOML file → env vars → flags.
//! Flags and env vars are declared on the `serve` subcommand in `main.rs` (clap
//! `env = ...`), so both arrive here as one [`Overrides`] value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The whole configuration. Every field has a default, so an empty file is valid.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Directory holding the store, the API token and other state.
    pub state_dir: PathBuf,
    pub api: ApiConfig,
    pub http: HttpConfig,
    pub dhcp: DhcpConfig,
    pub tftp: TftpConfig,
    pub boot: BootConfig,
    pub controller: ControllerConfig,
    pub log: LogConfig,
    /// NFS export backend (`[nfs]`, see `crate::nfs`).
    pub nfs: crate::nfs::NfsConfig,
    /// Provisioning job runner (`[provision]`, see `crate::provision`).
    pub provision: crate::provision::ProvisionConfig,
    /// Power driver settings (`[power.qemu]`, see `crate::power`).
    pub power: crate::power::PowerConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from("./var/bootplane"),
            api: ApiConfig::default(),
            http: HttpConfig::default(),
            dhcp: DhcpConfig::default(),
            tftp: TftpConfig::default(),
            boot: BootConfig::default(),
            controller: ControllerConfig::default(),
            log: LogConfig::default(),
            nfs: crate::nfs::NfsConfig::default(),
            provision: crate::provision::ProvisionConfig::default(),
            power: crate::power::PowerConfig::default(),
        }
    }
}

/// The operator-facing listener: REST API, `/metrics`, `/healthz`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// Bearer token. When absent, one is generated into `<state_dir>/api-token` (mode 0600).
    pub token: Option<String>,
    /// Maximum concurrent API connections. When reached, a new client still gets in:
    /// the oldest idle connection of the source holding the most is closed for it.
    pub max_connections: usize,
    /// Connections one source (IPv4 address, IPv6 /64) may hold (at most
    /// `max_connections`); beyond it its own oldest idle connection makes room, or
    /// (none idle) the new one is refused.
    pub max_connections_per_source: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout_ms: u64,
    /// How long a connection may wait for a request's first byte, after the accept and
    /// between keep-alive requests (a watch in progress is not idle).
    pub idle_timeout_ms: u64,
    /// A request body must be complete within this long of its head (408 after it).
    pub body_read_timeout_ms: u64,
    /// Maximum request body size in bytes (413 beyond it, before the body is read;
    /// YAML aliases may not expand a body by more than this either).
    pub max_body_bytes: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: "127.0.0.1:9090".parse().unwrap(),
            token: None,
            max_connections: 512,
            max_connections_per_source: 128,
            header_read_timeout_ms: 5_000,
            idle_timeout_ms: 60_000,
            body_read_timeout_ms: 30_000,
            // Kubernetes' limit; a stored object is at most 1.5 MiB anyway.
            max_body_bytes: 3 << 20,
        }
    }
}

/// The machine-facing HTTP boot listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    /// URL machines use to reach this listener (e.g. `http://10.0.0.1:8080`); when
    /// absent it is derived from the listen address.
    pub public_url: Option<String>,
    /// Root of `/assets/` (iPXE binaries, image files).
    pub assets_dir: PathBuf,
    /// Connections open at once. When reached, a new client still gets in: the oldest
    /// idle connection of the source holding the most is closed for it.
    pub max_connections: usize,
    /// Connections one source (IPv4 address, IPv6 /64) may hold; beyond it its own
    /// oldest idle connection makes room, or (none idle) the new one is refused.
    pub max_connections_per_source: usize,
    /// Request head limit (431 beyond it); at least 8192.
    pub max_header_bytes: usize,
    /// A request head must be complete within this long of its first byte.
    pub header_read_timeout_ms: u64,
    /// How long a connection may wait for a request's first byte, after the accept and
    /// between keep-alive requests (default 30 s; nginx waits 60 s).
    pub idle_timeout_ms: u64,
    /// Threads serving the listener, each with its own runtime and `SO_REUSEPORT`
    /// socket on `listen` (as nginx's worker processes); 0 (default) = one per core.
    pub workers: usize,
    /// Script for unknown / unclaimed / failed machines: `exit` (local disk), `retry`
    /// (sleep `retry_secs`, chain `/boot.ipxe` again) or `discovery` (boot `discovery_image`).
    pub unknown_action: String,
    pub retry_secs: u32,
    /// Image catalog reference booted by `unknown_action = "discovery"`.
    pub discovery_image: Option<String>,
    /// Console arguments appended to every kernel command line.
    pub console: String,
    /// Lifetime of the signed per-boot URLs minted into scripts (a rendered script, and so
    /// its token, is reused for at most half of this).
    pub token_ttl_secs: u64,
    /// Put a signed per-boot token into each script's Ignition URL, so the machine can
    /// fetch its Ignition even from an address not registered for it (default true).
    pub sign_ignition_urls: bool,
    /// HMAC key file for per-boot tokens; default `<state_dir>/http-token-key` (created, 0600).
    pub token_key_file: Option<PathBuf>,
    /// How file data reaches the socket: `sendfile` (default), `mmap` or `read`.
    pub file_io: String,
    /// Memory budget for file data in flight across all downloads: each download's chunk
    /// is this divided by the number of downloads, clamped to 8 KiB..1 MiB.
    pub stream_budget_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "0.0.0.0:8080".parse().unwrap(),
            public_url: None,
            assets_dir: PathBuf::from("ipxe"),
            max_connections: 4096,
            max_connections_per_source: 512,
            max_header_bytes: 16 << 10,
            header_read_timeout_ms: 5_000,
            idle_timeout_ms: 30_000,
            workers: 0,
            unknown_action: "exit".into(),
            retry_secs: 10,
            discovery_image: None,
            console: "console=tty0 console=ttyS0,115200".into(),
            token_ttl_secs: 3600,
            sign_ignition_urls: true,
            token_key_file: None,
            file_io: "sendfile".into(),
            stream_budget_bytes: 8 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DhcpMode {
    #[default]
    Proxy,
    Authoritative,
}

impl std::str::FromStr for DhcpMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "proxy" => Ok(DhcpMode::Proxy),
            "authoritative" => Ok(DhcpMode::Authoritative),
            other => bail!("unknown dhcp mode {other:?} (expected proxy or authoritative)"),
        }
    }
}

/// DHCP server (disabled unless `enabled` or `--dhcp-interface` is given).
/// The DHCP module owns the meaning of these keys; see `dhcp::settings` for the
/// full example and `dhcp::DhcpSettings` for the validated form.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DhcpConfig {
    pub enabled: bool,
    pub interface: Option<String>,
    pub mode: DhcpMode,
    /// Authoritative pool range `START-END` for the interface's subnet (shorthand for one subnet).
    pub range: Option<String>,
    /// Our address (option 54); default: the interface's first IPv4 address.
    pub server_ip: Option<std::net::Ipv4Addr>,
    /// Prefix length of the `range` subnet (default 24).
    pub prefix_len: Option<u8>,
    /// Lease time in seconds (default 3600).
    pub lease_time_secs: Option<u32>,
    /// How long an offered address is held (default 30 s).
    pub offer_hold_secs: Option<u32>,
    pub router: Option<std::net::Ipv4Addr>,
    pub dns: Vec<std::net::Ipv4Addr>,
    pub domain: Option<String>,
    pub subnets: Vec<crate::dhcp::settings::SubnetConfig>,
    pub reservations: Vec<crate::dhcp::settings::ReservationConfig>,
    pub boot: crate::dhcp::settings::BootFilesConfig,
    /// Packets per second accepted from one MAC (default 20, burst 2x).
    pub rate_limit_per_mac: Option<u32>,
    /// Most packets read and handled per wakeup before replies go out (default 64).
    pub max_batch: Option<usize>,
    /// Group-commit window: least milliseconds between the starts of two lease-log
    /// commits (default 2; 0 = commit as soon as the previous one is done).
    pub commit_window_ms: Option<u64>,
}

/// TFTP server (disabled unless `enabled` or `--tftp-listen` is given). Typed keys
/// are defined next to the server in `tftp::TftpConfig` (serde's `flatten` cannot be
/// combined with `deny_unknown_fields`, so the section is one typed struct).
pub use crate::tftp::TftpConfig;

/// What the boot side renders and serves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BootConfig {
    /// iPXE script templates.
    pub ipxe_templates: PathBuf,
    /// Ignition/Butane templates.
    pub ignition_templates: PathBuf,
    /// Image catalog directory.
    pub images_dir: PathBuf,
}

impl Default for BootConfig {
    fn default() -> Self {
        BootConfig {
            ipxe_templates: PathBuf::from("ipxe"),
            ignition_templates: PathBuf::from("ignition"),
            images_dir: PathBuf::from("images"),
        }
    }
}

/// Embedded controller settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ControllerConfig {
    /// Run the reconcilers inside `serve`.
    pub enabled: bool,
    /// Concurrent reconciles per controller (cheap async tasks; more of them means
    /// bigger group commits).
    pub workers: usize,
    /// Power driver for servers: `manual`, `test` (accepts every request at once) or
    /// `qemu` (a VM per server, see `[power.qemu]`).
    pub power_driver: String,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            enabled: true,
            workers: 64,
            power_driver: "manual".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `tracing` filter, e.g. `info,bootplane=debug`. `RUST_LOG` wins when set.
    pub filter: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            filter: "info".into(),
            format: "text".into(),
        }
    }
}

/// Values from flags/env that override the file. `None` = not given.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub state_dir: Option<PathBuf>,
    pub api_listen: Option<SocketAddr>,
    pub api_token: Option<String>,
    pub http_listen: Option<SocketAddr>,
    pub http_public_url: Option<String>,
    pub assets_dir: Option<PathBuf>,
    pub dhcp_interface: Option<String>,
    pub dhcp_mode: Option<DhcpMode>,
    pub dhcp_range: Option<String>,
    pub tftp_listen: Option<SocketAddr>,
    pub tftp_root: Option<PathBuf>,
    pub power_driver: Option<String>,
    pub log_filter: Option<String>,
    pub log_format: Option<String>,
    pub controller_enabled: Option<bool>,
    pub controller_workers: Option<usize>,
    /// Generic `section.key=value` overrides (values parsed as TOML, else strings),
    /// so that every key has a flag (`--set`) and an env var (`BOOTPLANE_SET`).
    pub set: Vec<String>,
}

impl Config {
    /// Parse TOML text (no overrides, no validation).
    pub fn from_toml(text: &str) -> Result<Config> {
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))
    }

    /// Read and parse a config file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        Config::from_toml(&text).with_context(|| format!("parsing config {}", path.display()))
    }

    /// File (optional) + overrides → validated config.
    pub fn resolve(path: Option<&Path>, o: Overrides) -> Result<Config> {
        let mut table: toml::Table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading config {}", p.display()))?;
                text.parse::<toml::Table>()
                    .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))
                    .with_context(|| format!("parsing config {}", p.display()))?
            }
            None => toml::Table::new(),
        };
        for kv in &o.set {
            set_key(&mut table, kv).with_context(|| format!("applying --set {kv}"))?;
        }
        let mut c: Config = table
            .try_into()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.to_string().trim_end()))
            .with_context(|| match path {
                Some(p) => format!("parsing config {}", p.display()),
                None => "parsing overrides".to_string(),
            })?;
        c.apply(o);
        c.validate()?;
        Ok(c)
    }

    pub fn apply(&mut self, o: Overrides) {
        if let Some(v) = o.state_dir {
            self.state_dir = v;
        }
        if let Some(v) = o.api_listen {
            self.api.listen = v;
        }
        if let Some(v) = o.api_token {
            self.api.token = Some(v);
        }
        if let Some(v) = o.http_listen {
            self.http.listen = v;
        }
        if let Some(v) = o.http_public_url {
            self.http.public_url = Some(v);
        }
        if let Some(v) = o.assets_dir {
            self.http.assets_dir = v;
        }
        if let Some(v) = o.dhcp_interface {
            self.dhcp.interface = Some(v);
            self.dhcp.enabled = true;
        }
        if let Some(v) = o.dhcp_mode {
            self.dhcp.mode = v;
        }
        if let Some(v) = o.dhcp_range {
            self.dhcp.range = Some(v);
        }
        if let Some(v) = o.tftp_listen {
            self.tftp.listen = v;
            self.tftp.enabled = true;
        }
        if let Some(v) = o.tftp_root {
            self.tftp.root = v;
        }
        if let Some(v) = o.power_driver {
            self.controller.power_driver = v;
        }
        if let Some(v) = o.log_filter {
            self.log.filter = v;
        }
        if let Some(v) = o.log_format {
            self.log.format = v;
        }
        if let Some(v) = o.controller_enabled {
            self.controller.enabled = v;
        }
        if let Some(v) = o.controller_workers {
            self.controller.workers = v;
        }
    }

    /// Semantic checks that TOML typing cannot express.
    pub fn validate(&self) -> Result<()> {
        if self.state_dir.as_os_str().is_empty() {
            bail!("state_dir must not be empty");
        }
        if self.api.listen == self.http.listen {
            bail!(
                "api.listen and http.listen must differ (both {})",
                self.api.listen
            );
        }
        if let Some(t) = &self.api.token {
            if t.len() < 16 {
                bail!("api.token must be at least 16 characters");
            }
        }
        if let Some(u) = &self.http.public_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                bail!("http.public_url must start with http:// or https:// (got {u:?})");
            }
        }
        for (key, max, per) in [
            (
                "api",
                self.api.max_connections,
                self.api.max_connections_per_source,
            ),
            (
                "http",
                self.http.max_connections,
                self.http.max_connections_per_source,
            ),
        ] {
            if max == 0 || per == 0 {
                bail!("{key}.max_connections and {key}.max_connections_per_source must be at least 1 (got {max} and {per})");
            }
        }
        for (key, ms) in [
            (
                "api.header_read_timeout_ms",
                self.api.header_read_timeout_ms,
            ),
            ("api.idle_timeout_ms", self.api.idle_timeout_ms),
            ("api.body_read_timeout_ms", self.api.body_read_timeout_ms),
            (
                "http.header_read_timeout_ms",
                self.http.header_read_timeout_ms,
            ),
            ("http.idle_timeout_ms", self.http.idle_timeout_ms),
        ] {
            if ms == 0 {
                bail!("{key} must be at least 1");
            }
        }
        if self.dhcp.enabled && self.dhcp.interface.is_none() {
            bail!("dhcp.enabled needs dhcp.interface");
        }
        if self.dhcp.mode == DhcpMode::Authoritative
            && self.dhcp.enabled
            && self.dhcp.range.is_none()
            && self.dhcp.subnets.is_empty()
        {
            bail!("authoritative dhcp needs dhcp.range or [[dhcp.subnets]]");
        }
        if self.controller.workers == 0 {
            bail!("controller.workers must be at least 1");
        }
        match self.controller.power_driver.as_str() {
            "manual" | "test" | "qemu" => {}
            other => {
                bail!("unknown controller.power_driver {other:?} (expected manual, test or qemu)")
            }
        }
        self.nfs.validate()?;
        self.provision.validate()?;
        if self.controller.power_driver == "qemu" {
            self.power.qemu.validate()?;
        }
        match self.log.format.as_str() {
            "text" | "json" => {}
            other => bail!("unknown log.format {other:?} (expected text or json)"),
        }
        Ok(())
    }

    /// The URL machines use to reach the boot listener.
    pub fn public_http_url(&self) -> String {
        if let Some(u) = &self.http.public_url {
            return u.trim_end_matches('/').to_string();
        }
        let addr = self.http.listen;
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            addr.ip().to_string()
        };
        format!("http://{}:{}", host, addr.port())
    }
}

/// Apply one `a.b.c=value` override to a TOML table.
fn set_key(table: &mut toml::Table, kv: &str) -> Result<()> {
    let (key, raw) = kv
        .split_once('=')
        .ok_or_else(|| anyhow::anyhow!("expected section.key=value"))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        bail!("bad key {key:?}");
    }
    let value: toml::Value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let e = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = e
            .as_table_mut()
            .ok_or_else(|| anyhow::anyhow!("{p} is not a section"))?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_defaults() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
        Config::default().validate().unwrap();
    }

    #[test]
    fn example_config_parses_and_validates() {
        let text = include_str!("../examples/bootplane.toml");
        let c = Config::from_toml(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.api.listen, "127.0.0.1:9090".parse().unwrap());
    }

    /// Every key of the configuration appears in the example (set, or commented out as
    /// `# key = ...`) under its section, so the example stays the reference.
    #[test]
    fn example_config_documents_every_key() {
        fn leaves(prefix: &str, v: &toml::Value, out: &mut Vec<(String, String)>) {
            match v {
                toml::Value::Table(t) => {
                    for (k, v) in t {
                        let p = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        match v {
                            toml::Value::Table(_) => leaves(&p, v, out),
                            _ => out.push((p, v.to_string())),
                        }
                    }
                }
                _ => unreachable!(),
            }
        }
        let mut want = Vec::new();
        leaves(
            "",
            &toml::Value::try_from(Config::default()).unwrap(),
            &mut want,
        );
        let text = include_str!("../examples/bootplane.toml");
        let mut have = std::collections::HashSet::new();
        let mut section = String::new();
        for line in text.lines() {
            let l = line.trim_start_matches('#').trim();
            if let Some(h) = l.strip_prefix('[').and_then(|h| h.split(']').next()) {
                if !h.is_empty()
                    && h.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                {
                    section = h.to_string();
                    continue;
                }
            }
            if let Some((k, _)) = l.split_once('=') {
                let k = k.trim().trim_matches('"');
                if !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                {
                    have.insert(if section.is_empty() {
                        k.to_string()
                    } else {
                        format!("{section}.{k}")
                    });
                }
            }
        }
        let missing: Vec<String> = want
            .iter()
            .filter(|(k, _)| !have.contains(k))
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        assert!(
            missing.is_empty(),
            "keys missing from examples/bootplane.toml:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_toml("[api]\nlisten_addr = \"1.2.3.4:5\"\n").unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
    }

    #[test]
    fn overrides_win() {
        let mut c = Config::from_toml("state_dir = \"/a\"\n").unwrap();
        c.apply(Overrides {
            state_dir: Some("/b".into()),
            ..Default::default()
        });
        assert_eq!(c.state_dir, PathBuf::from("/b"));
    }

    #[test]
    fn connection_shares_must_be_positive() {
        for key in ["api", "http"] {
            let o = Overrides {
                set: vec![format!("{key}.max_connections_per_source=0")],
                ..Default::default()
            };
            let e = Config::resolve(None, o).unwrap_err().to_string();
            assert!(e.contains("max_connections_per_source"), "{e}");
        }
    }

    #[test]
    fn generic_set_reaches_every_key() {
        let o = Overrides {
            set: vec![
                "api.max_connections=7".into(),
                "log.format=json".into(),
                "http.public_url=http://10.0.0.1:8080".into(),
            ],
            ..Default::default()
        };
        let c = Config::resolve(None, o).unwrap();
        assert_eq!(c.api.max_connections, 7);
        assert_eq!(c.log.format, "json");
        assert_eq!(c.http.public_url.as_deref(), Some("http://10.0.0.1:8080"));
        let o = Overrides {
            set: vec!["api.nope=1".into()],
            ..Default::default()
        };
        assert!(format!("{:#}", Config::resolve(None, o).unwrap_err()).contains("nope"));
    }

    #[test]
    fn bad_values_rejected() {
        let mut c = Config::default();
        c.controller.power_driver = "ipmi".into();
        assert!(c.validate().unwrap_err().to_string().contains("ipmi"));
        let mut c = Config::default();
        c.http.listen = c.api.listen;
        assert!(c.validate().is_err());
    }
}
