//! Configuration: one TOML file with documented defaults, overridden by flags and
//! environment variables, validated into a [`Config`] before anything starts.
//!
//! Each subsystem defines its own section type (with its defaults and checks) next to
//! its code: [`ApiConfig`] in `api`, [`HttpConfig`] and [`BootConfig`] in `http`,
//! [`DhcpConfig`] in `dhcp`, [`TftpConfig`] in `tftp`, [`ControllerConfig`] in
//! `controller`, `NfsConfig`, `ProvisionConfig` and `PowerConfig` in theirs. This
//! module only aggregates them (plus `state_dir` and `[log]`), applies the overrides
//! and runs each section's `validate` and the checks that span sections.
//!
//! Precedence (lowest to highest): built-in defaults → TOML file → `--set` → env vars →
//! flags. Flags and env vars are declared once, on [`Overrides`] (clap `env = ...`),
//! which `main.rs` flattens into `serve`, `check-config` and `store migrate`, so both
//! arrive here as one value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::api::ApiConfig;
use crate::controller::ControllerConfig;
use crate::dhcp::{DhcpConfig, DhcpMode};
use crate::http::{BootConfig, HttpConfig};
use crate::tftp::TftpConfig;

/// What `check-config` prints in place of a secret value.
pub const REDACTED: &str = "<redacted>";

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
    /// Discovery (`[discovery]`, see `crate::controller::discovery`).
    pub discovery: crate::controller::discovery::DiscoveryConfig,
    /// Wiping released Servers (`[cleanup]`, see `crate::controller::cleanup`).
    pub cleanup: crate::controller::cleanup::CleanupConfig,
    /// The store's engine (`[store]`, see `crate::store::settings`).
    pub store: crate::store::settings::StoreConfig,
    /// Events kept in the store (`[events]`, see `crate::store::events`).
    pub events: crate::store::events::EventSettings,
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
            discovery: Default::default(),
            cleanup: Default::default(),
            store: Default::default(),
            events: Default::default(),
        }
    }
}

/// `[log]`: how `main` sets up tracing.
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
///
/// The one list of the config flags: each field is a `serve` / `check-config` /
/// `store migrate` flag (`--state-dir`, ...) with its `BOOTPLANE_*` env var, declared
/// here (clap flattens it into those commands) and put into the config by
/// [`Config::apply`]. A new flag is a field here and a line there.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// State dir (store, TLS, tokens, leases).
    #[arg(long, env = "BOOTPLANE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// API listen address (`api.listen`).
    #[arg(long, env = "BOOTPLANE_API_LISTEN")]
    pub api_listen: Option<SocketAddr>,
    /// Bootstrap admin API token (`api.token`).
    #[arg(long, env = "BOOTPLANE_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Boot HTTP listen address (`http.listen`).
    #[arg(long, env = "BOOTPLANE_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// URL machines fetch boot files from (`http.public_url`).
    #[arg(long, env = "BOOTPLANE_HTTP_PUBLIC_URL")]
    pub http_public_url: Option<String>,
    /// Directory of boot assets served over HTTP (`http.assets_dir`).
    #[arg(long, env = "BOOTPLANE_ASSETS_DIR")]
    pub assets_dir: Option<PathBuf>,
    /// Interface the DHCP server serves (`dhcp.interface`).
    #[arg(long, env = "BOOTPLANE_DHCP_INTERFACE")]
    pub dhcp_interface: Option<String>,
    /// DHCP mode (`dhcp.mode`).
    #[arg(long, env = "BOOTPLANE_DHCP_MODE")]
    pub dhcp_mode: Option<DhcpMode>,
    /// Address range to lease, `FIRST-LAST` (`dhcp.range`).
    #[arg(long, env = "BOOTPLANE_DHCP_RANGE")]
    pub dhcp_range: Option<String>,
    /// TFTP listen address (`tftp.listen`).
    #[arg(long, env = "BOOTPLANE_TFTP_LISTEN")]
    pub tftp_listen: Option<SocketAddr>,
    /// Directory served over TFTP (`tftp.root`).
    #[arg(long, env = "BOOTPLANE_TFTP_ROOT")]
    pub tftp_root: Option<PathBuf>,
    /// Default power driver (`controller.power_driver`, e.g. `manual`).
    #[arg(long, env = "BOOTPLANE_POWER_DRIVER")]
    pub power_driver: Option<String>,
    /// Log filter, tracing-subscriber syntax (`log.filter`).
    #[arg(long, env = "BOOTPLANE_LOG")]
    pub log_filter: Option<String>,
    /// Log format: `text` or `json` (`log.format`).
    #[arg(long, env = "BOOTPLANE_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Run the controllers (`controller.enabled`).
    #[arg(long, env = "BOOTPLANE_CONTROLLER_ENABLED")]
    pub controller_enabled: Option<bool>,
    /// Controller worker count (`controller.workers`).
    #[arg(long, env = "BOOTPLANE_CONTROLLER_WORKERS")]
    pub controller_workers: Option<usize>,
    /// Set any config key: `--set section.key=value` (repeatable; env BOOTPLANE_SET,
    /// `;`-separated).
    // Generic `section.key=value` overrides (values parsed as TOML, else strings), so
    // that every key has a flag (`--set`) and an env var (`BOOTPLANE_SET`).
    #[arg(long = "set", env = "BOOTPLANE_SET", value_delimiter = ';')]
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

    /// Semantic checks that TOML typing cannot express: each section's own, then the
    /// ones spanning sections.
    pub fn validate(&self) -> Result<()> {
        if self.state_dir.as_os_str().is_empty() {
            bail!("state_dir must not be empty");
        }
        for (key, v) in [
            ("api.token", &self.api.token),
            ("nfs.ontap.password", &self.nfs.ontap.password),
        ] {
            if v.as_deref() == Some(REDACTED) {
                bail!("{key} is {REDACTED:?}, the placeholder check-config prints: set the real value (or a file holding it)");
            }
        }
        if self.api.listen == self.http.listen {
            bail!(
                "api.listen and http.listen must differ (both {})",
                self.api.listen
            );
        }
        self.api.validate()?;
        self.http.validate()?;
        self.dhcp.validate()?;
        self.dhcp.validate_ranges("dhcp")?;
        self.discovery.dhcp.validate_ranges("discovery.dhcp")?;
        self.controller.validate()?;
        self.nfs.validate()?;
        self.provision.validate()?;
        if self.controller.power_driver == "qemu" {
            self.power.qemu.validate()?;
        }
        self.power.redfish.validate()?;
        self.discovery.validate()?;
        self.cleanup.validate()?;
        self.store.validate()?;
        self.events.validate()?;
        if self.dhcp.enabled
            && self.discovery.dhcp.enabled
            && self.dhcp.interface == self.discovery.dhcp.interface
        {
            bail!("discovery.dhcp.interface must differ from dhcp.interface (one DHCP scope per interface)");
        }
        crate::logging::parse_filter(&self.log.filter)
            .map_err(|e| anyhow::anyhow!("log.filter: invalid filter {e}"))?;
        match self.log.format.as_str() {
            "text" | "json" => {}
            other => bail!("unknown log.format {other:?} (expected text or json)"),
        }
        Ok(())
    }

    /// A copy safe to print (`check-config`): every secret value (`api.token`,
    /// `nfs.ontap.password`) replaced by [`REDACTED`], which [`Config::validate`]
    /// refuses, so a printed config saved as a file cannot start with a placeholder.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        for s in [&mut c.api.token, &mut c.nfs.ontap.password] {
            if s.is_some() {
                *s = Some(REDACTED.to_string());
            }
        }
        c
    }

    /// The URL machines use to reach the boot listener (see
    /// [`HttpConfig::public_http_url`]).
    pub fn public_http_url(&self) -> String {
        self.http.public_http_url()
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
            // `[[api.roles]]`: an array of tables documents its key (`api.roles`).
            if let Some(h) = l.strip_prefix("[[").and_then(|h| h.split("]]").next()) {
                have.insert(h.to_string());
                section = h.to_string();
                continue;
            }
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

    /// `Overrides` is the one flag list: every field is a long flag of the same name
    /// with its `BOOTPLANE_*` env var (the names pinned here are the documented ones),
    /// and what the command line gives reaches the field.
    #[test]
    fn every_override_field_is_a_flag_with_an_env_var() {
        use clap::{Args, FromArgMatches};
        let cmd = Overrides::augment_args(clap::Command::new("serve"));
        // The struct's fields, by name, from its derived Debug.
        let debug = format!("{:?}", Overrides::default());
        let fields: Vec<&str> = debug
            .trim_start_matches("Overrides {")
            .trim_end_matches('}')
            .split(", ")
            .map(|f| f.split(':').next().unwrap().trim())
            .collect();
        let mut flags = Vec::new();
        for f in &fields {
            let arg = cmd.get_arguments().find(|a| a.get_id() == *f);
            let arg = arg.unwrap_or_else(|| panic!("Overrides.{f} is not a flag"));
            assert_eq!(arg.get_long(), Some(f.replace('_', "-").as_str()), "{f}");
            let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or("");
            flags.push(format!("--{} {env}", arg.get_long().unwrap()));
        }
        assert_eq!(cmd.get_arguments().count(), fields.len());
        let want = [
            "--state-dir BOOTPLANE_STATE_DIR",
            "--api-listen BOOTPLANE_API_LISTEN",
            "--api-token BOOTPLANE_API_TOKEN",
            "--http-listen BOOTPLANE_HTTP_LISTEN",
            "--http-public-url BOOTPLANE_HTTP_PUBLIC_URL",
            "--assets-dir BOOTPLANE_ASSETS_DIR",
            "--dhcp-interface BOOTPLANE_DHCP_INTERFACE",
            "--dhcp-mode BOOTPLANE_DHCP_MODE",
            "--dhcp-range BOOTPLANE_DHCP_RANGE",
            "--tftp-listen BOOTPLANE_TFTP_LISTEN",
            "--tftp-root BOOTPLANE_TFTP_ROOT",
            "--power-driver BOOTPLANE_POWER_DRIVER",
            "--log-filter BOOTPLANE_LOG",
            "--log-format BOOTPLANE_LOG_FORMAT",
            "--controller-enabled BOOTPLANE_CONTROLLER_ENABLED",
            "--controller-workers BOOTPLANE_CONTROLLER_WORKERS",
            "--set BOOTPLANE_SET",
        ];
        assert_eq!(flags, want);
        let m = cmd
            .try_get_matches_from([
                "serve",
                "--dhcp-mode",
                "proxy",
                "--controller-workers",
                "3",
                "--set",
                "a.b=1;c.d=2",
                "--set",
                "e.f=3",
            ])
            .unwrap();
        let o = Overrides::from_arg_matches(&m).unwrap();
        assert_eq!(o.dhcp_mode, Some(DhcpMode::Proxy));
        assert_eq!(o.controller_workers, Some(3));
        assert_eq!(o.set, ["a.b=1", "c.d=2", "e.f=3"]);
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

    #[test]
    fn redacted_hides_secrets_and_its_placeholder_is_refused() {
        let mut c = Config::default();
        c.api.token = Some("0123456789abcdef0123".into());
        c.nfs.ontap.password = Some("hunter2-ontap".into());
        let text = toml::to_string_pretty(&c.redacted()).unwrap();
        assert!(!text.contains("0123456789abcdef0123"), "{text}");
        assert!(!text.contains("hunter2-ontap"), "{text}");
        assert_eq!(text.matches(REDACTED).count(), 2, "{text}");
        // Unset secrets stay unset (nothing to hide, nothing to fill in).
        let plain = toml::to_string_pretty(&Config::default().redacted()).unwrap();
        assert!(!plain.contains(REDACTED), "{plain}");
        // The printed config, saved and loaded again, names the placeholder.
        let back = Config::from_toml(&text).unwrap();
        let e = back.validate().unwrap_err().to_string();
        assert!(e.contains("api.token") && e.contains(REDACTED), "{e}");
    }
}
