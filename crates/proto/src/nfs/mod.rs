//! NFS export backends: make a directory (or a storage volume) available over NFS and
//! enforce export-policy rules by client address.
//!
//! One trait, [`ExportBackend`], with three implementations selected by `[nfs] backend`:
//!
//! - [`ganesha`] (the default): bootplane runs nfs-ganesha (and its own rpcbind) itself,
//!   writes `ganesha.conf` with one `EXPORT` block per export and one `CLIENT` block per
//!   rule, and makes ganesha re-read its exports on every rule change. Tested end to end
//!   with real NFS clients (`nfs-ls`/`nfs-cat`) in `tests/it/nfs_ganesha.rs`.
//! - [`knfsd`]: the Linux kernel NFS server, via `/etc/exports.d/bootplane-*.exports` and
//!   `exportfs -r`. Rendering is unit-tested; the kernel server is not available here.
//! - [`ontap`]: NetApp ONTAP's REST API (`/api/protocols/nfs/export-policies` and
//!   `/rules`), written from the published API reference and tested against a fake
//!   HTTP server only, never against a real ONTAP system.
//!
//! Rules are evaluated in `index` order, first match wins, and a client that matches
//! no rule is denied: every backend renders "no rule" as "no access". `set_rules` takes
//! one path for every backend (`nfs/rules.rs`): normalise, compare with the rules in
//! force, apply and record a change.

pub mod ganesha;
pub mod knfsd;
pub mod ontap;
mod rules;

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Errors callers branch on (bad rule vs unknown export vs backend failure).
#[derive(Debug, thiserror::Error)]
pub enum NfsError {
    #[error("invalid export rule: {0}")]
    InvalidRule(String),
    #[error("invalid export {0:?}: {1}")]
    InvalidExport(String, String),
    #[error("unknown export {0:?}")]
    UnknownExport(String),
    #[error("nfs server is down: {0}")]
    Down(String),
    /// A port the NFS server (or the rpcbind started with it) must serve is taken by
    /// another process, so the server cannot be started as configured.
    #[error("nfs server cannot start: {0}")]
    PortInUse(String),
    #[error("{0}")]
    Backend(String),
}

impl NfsError {
    pub(crate) fn backend(e: impl fmt::Display) -> Self {
        NfsError::Backend(e.to_string())
    }
}

/// Access granted by a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    #[default]
    Ro,
    Rw,
    /// Explicit deny (useful before a broader allow rule).
    None,
}

/// NFS protocol version a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "nfs3", alias = "NFSv3", alias = "v3", alias = "3")]
    Nfs3,
    #[serde(rename = "nfs4", alias = "NFSv4", alias = "v4", alias = "4")]
    Nfs4,
}

/// A client address or CIDR network (IPv4 or IPv6). Host names and netgroups are
/// deliberately not accepted: the rule must match the address the server sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientMatch {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl ClientMatch {
    pub fn host(addr: IpAddr) -> Self {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        ClientMatch { addr, prefix }
    }

    pub(crate) fn is_host(&self) -> bool {
        self.prefix == if self.addr.is_ipv4() { 32 } else { 128 }
    }

    /// Whether `ip` falls inside this match.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.addr.is_ipv4() == ip.is_ipv4()
            && network_of(self.addr, self.prefix) == network_of(ip, self.prefix)
    }
}

impl FromStr for ClientMatch {
    type Err = NfsError;
    fn from_str(s: &str) -> Result<Self, NfsError> {
        let bad = || NfsError::InvalidRule(format!("client {s:?} is not an IP address or CIDR"));
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(bad)?,
            None => max,
        };
        let m = ClientMatch { addr, prefix };
        // Normalise a CIDR to its network address so equal networks compare equal.
        Ok(if m.is_host() {
            m
        } else {
            ClientMatch {
                addr: network_of(addr, prefix),
                prefix,
            }
        })
    }
}

fn network_of(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix as u32)
            };
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix as u32)
            };
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

impl fmt::Display for ClientMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_host() {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

impl Serialize for ClientMatch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ClientMatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One export-policy rule (the backend-neutral shape of an `ExportPolicyRule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExportRule {
    /// Evaluation order: lower first; the first matching rule decides.
    pub index: u32,
    pub client: ClientMatch,
    #[serde(default)]
    pub access: Access,
    /// Empty = all protocols.
    #[serde(default)]
    pub protocols: Vec<Protocol>,
    /// `true` = root keeps uid 0 (no_root_squash); `false` = root is squashed.
    #[serde(default)]
    pub superuser: bool,
}

impl ExportRule {
    /// A read-only, root-squashed rule for one host.
    pub fn read_only(index: u32, client: ClientMatch) -> Self {
        ExportRule {
            index,
            client,
            access: Access::Ro,
            protocols: Vec::new(),
            superuser: false,
        }
    }

    pub fn applies_to(&self, p: Protocol) -> bool {
        self.protocols.is_empty() || self.protocols.contains(&p)
    }
}

/// Sort by index and reject duplicate indexes (two rules at one position would make
/// the evaluation order ambiguous).
pub(crate) fn normalize_rules(mut rules: Vec<ExportRule>) -> Result<Vec<ExportRule>, NfsError> {
    rules.sort_by_key(|r| r.index);
    for w in rules.windows(2) {
        if w[0].index == w[1].index {
            return Err(NfsError::InvalidRule(format!(
                "two rules with index {}",
                w[0].index
            )));
        }
    }
    for r in &mut rules {
        r.protocols.sort();
        r.protocols.dedup();
    }
    Ok(rules)
}

/// The decision a rule list makes for one client (first match wins, default deny).
/// Every backend renders rules so that the server reaches this same decision.
pub fn decide(rules: &[ExportRule], client: IpAddr, proto: Protocol) -> Access {
    let mut sorted: Vec<&ExportRule> = rules.iter().collect();
    sorted.sort_by_key(|r| r.index);
    sorted
        .into_iter()
        .find(|r| r.client.contains(client) && r.applies_to(proto))
        .map(|r| r.access)
        .unwrap_or(Access::None)
}

/// Export names are absolute, normalised paths (`/images/ubuntu`): they become the
/// NFSv4 pseudo path and appear in configuration files, so quoting characters and
/// `..` are refused.
pub(crate) fn validate_export_name(export: &str) -> Result<(), NfsError> {
    let bad = |why: &str| NfsError::InvalidExport(export.to_string(), why.to_string());
    if !export.starts_with('/') || export == "/" {
        return Err(bad("must be an absolute path other than /"));
    }
    if export.len() > 1024 {
        return Err(bad("too long"));
    }
    if export.ends_with('/') || export.contains("//") {
        return Err(bad("must not end with / or contain //"));
    }
    validate_path_chars(export).map_err(|why| bad(&why))?;
    if export.split('/').any(|c| c == ".." || c == ".") {
        return Err(bad("must not contain . or .. components"));
    }
    Ok(())
}

/// Characters that would break out of a quoted value in ganesha.conf or /etc/exports.
pub(crate) fn validate_path_chars(p: &str) -> Result<(), String> {
    if let Some(c) = p.chars().find(|c| {
        c.is_control()
            || matches!(
                c,
                '"' | '\\' | '{' | '}' | ';' | '#' | ' ' | '\'' | '(' | ')' | ','
            )
    }) {
        return Err(format!("contains {c:?}"));
    }
    Ok(())
}

pub(crate) fn validate_fs_path(export: &str, fs_path: &Path) -> Result<(), NfsError> {
    let s = fs_path
        .to_str()
        .ok_or_else(|| NfsError::InvalidExport(export.into(), "fs path is not UTF-8".into()))?;
    if !fs_path.is_absolute() {
        return Err(NfsError::InvalidExport(
            export.into(),
            format!("fs path {s:?} is not absolute"),
        ));
    }
    validate_path_chars(s)
        .map_err(|why| NfsError::InvalidExport(export.into(), format!("fs path {why}")))
}

/// Writes `data` to `path` through `<path>.tmp` and a rename, so readers (ganesha, mountd)
/// never see half a file.
pub(crate) fn write_atomic(path: &Path, data: &[u8]) -> Result<(), NfsError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)
        .map_err(|e| NfsError::Backend(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| NfsError::Backend(format!("renaming {}: {e}", path.display())))
}

/// Health as reported by a backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    pub backend: &'static str,
    /// Human-readable detail (server version, pid, ...).
    pub detail: String,
}

/// An NFS server that exports directories and enforces per-client rules.
///
/// All methods are idempotent: calling them again with the same arguments changes
/// nothing, so a reconciler can call them on every pass.
pub trait ExportBackend: Send + Sync {
    fn name(&self) -> &'static str;

    /// Create the export `export` (an absolute path-like name; the NFSv4 pseudo path)
    /// serving `fs_path`, with no rules yet (nobody has access), or update its path.
    fn ensure_export<'a>(
        &'a self,
        export: &'a str,
        fs_path: &'a Path,
    ) -> BoxFuture<'a, Result<(), NfsError>>;

    /// Replace the export's rules. Takes effect before the future resolves.
    fn set_rules<'a>(
        &'a self,
        export: &'a str,
        rules: Vec<ExportRule>,
    ) -> BoxFuture<'a, Result<(), NfsError>>;

    /// Stop exporting. Removing an export that does not exist is not an error.
    fn remove_export<'a>(&'a self, export: &'a str) -> BoxFuture<'a, Result<(), NfsError>>;

    /// Whether the server is serving; `Err(NfsError::Down(reason))` when not.
    fn health(&self) -> BoxFuture<'_, Result<Health, NfsError>>;

    /// Long-running part of the backend, for `serve` to spawn: the ganesha backend starts
    /// and supervises its server and stops it on shutdown; the others have nothing to
    /// run and just wait.
    fn run(&self, mut shutdown: crate::shutdown::Shutdown) -> BoxFuture<'_, ()> {
        Box::pin(async move { shutdown.recv().await })
    }
}

/// Stands in for the backend when `nfs.enabled` is false: every call reports that.
pub struct Disabled;

impl ExportBackend for Disabled {
    fn name(&self) -> &'static str {
        "disabled"
    }

    fn ensure_export<'a>(
        &'a self,
        _export: &'a str,
        _fs_path: &'a Path,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        Box::pin(async { Err(disabled()) })
    }

    fn set_rules<'a>(
        &'a self,
        _export: &'a str,
        _rules: Vec<ExportRule>,
    ) -> BoxFuture<'a, Result<(), NfsError>> {
        Box::pin(async { Err(disabled()) })
    }

    fn remove_export<'a>(&'a self, _export: &'a str) -> BoxFuture<'a, Result<(), NfsError>> {
        Box::pin(async { Ok(()) })
    }

    fn health(&self) -> BoxFuture<'_, Result<Health, NfsError>> {
        Box::pin(async { Err(disabled()) })
    }
}

fn disabled() -> NfsError {
    NfsError::Down("the nfs export backend is disabled (set nfs.enabled = true)".into())
}

/// `[nfs]` section of the config file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NfsConfig {
    /// Start the export backend with `serve` (the s390x provisioning flow needs it).
    /// Off by default: the ganesha backend runs an NFS server on port 2049.
    pub enabled: bool,
    /// `ganesha` (default), `knfsd` or `ontap`.
    pub backend: String,
    pub ganesha: ganesha::GaneshaConfig,
    pub knfsd: knfsd::KnfsdConfig,
    pub ontap: ontap::OntapConfig,
}

impl Default for NfsConfig {
    fn default() -> Self {
        NfsConfig {
            enabled: false,
            backend: "ganesha".into(),
            ganesha: ganesha::GaneshaConfig::default(),
            knfsd: knfsd::KnfsdConfig::default(),
            ontap: ontap::OntapConfig::default(),
        }
    }
}

impl NfsConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        match self.backend.as_str() {
            "ganesha" | "knfsd" => Ok(()),
            "ontap" => self.ontap.validate(),
            other => {
                anyhow::bail!("unknown nfs.backend {other:?} (expected ganesha, knfsd or ontap)")
            }
        }
    }
}

/// Build the configured backend. `state_dir` is bootplane's state directory (the
/// ganesha backend keeps its config, log and export table under `<state_dir>/ganesha`
/// unless configured otherwise). The ganesha server is started by
/// [`ganesha::Ganesha::start`], which callers run once at startup.
pub fn from_config(cfg: &NfsConfig, state_dir: &Path) -> anyhow::Result<Arc<dyn ExportBackend>> {
    cfg.validate()?;
    Ok(match cfg.backend.as_str() {
        "knfsd" => Arc::new(knfsd::Knfsd::new(cfg.knfsd.clone())),
        "ontap" => Arc::new(ontap::Ontap::new(cfg.ontap.clone())?),
        _ => Arc::new(ganesha::Ganesha::new(cfg.ganesha.clone(), state_dir)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_match_parses_hosts_and_cidrs() {
        let h: ClientMatch = "10.1.2.3".parse().unwrap();
        assert!(h.is_host());
        assert_eq!(h.to_string(), "10.1.2.3");
        let n: ClientMatch = "10.1.2.3/24".parse().unwrap();
        assert_eq!(n.to_string(), "10.1.2.0/24");
        assert!(n.contains("10.1.2.200".parse().unwrap()));
        assert!(!n.contains("10.1.3.1".parse().unwrap()));
        let all: ClientMatch = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let v6: ClientMatch = "fd00::1/64".parse().unwrap();
        assert_eq!(v6.to_string(), "fd00::/64");
        assert!(v6.contains("fd00::abcd".parse().unwrap()));
        for bad in [
            "",
            "host.example",
            "10.0.0.1/33",
            "10.0.0.1/x",
            "::1/129",
            "10.0.0.0/8/1",
        ] {
            assert!(bad.parse::<ClientMatch>().is_err(), "{bad}");
        }
    }

    #[test]
    fn first_match_wins_and_default_is_deny() {
        let rules = vec![
            ExportRule {
                index: 2,
                client: "10.0.0.0/8".parse().unwrap(),
                access: Access::Ro,
                protocols: vec![],
                superuser: false,
            },
            ExportRule {
                index: 1,
                client: "10.0.0.5".parse().unwrap(),
                access: Access::None,
                protocols: vec![],
                superuser: false,
            },
            ExportRule {
                index: 3,
                client: "192.0.2.0/24".parse().unwrap(),
                access: Access::Rw,
                protocols: vec![Protocol::Nfs4],
                superuser: true,
            },
        ];
        assert_eq!(
            decide(&rules, "10.0.0.5".parse().unwrap(), Protocol::Nfs3),
            Access::None
        );
        assert_eq!(
            decide(&rules, "10.0.0.6".parse().unwrap(), Protocol::Nfs3),
            Access::Ro
        );
        assert_eq!(
            decide(&rules, "192.0.2.9".parse().unwrap(), Protocol::Nfs4),
            Access::Rw
        );
        assert_eq!(
            decide(&rules, "192.0.2.9".parse().unwrap(), Protocol::Nfs3),
            Access::None
        );
        assert_eq!(
            decide(&rules, "172.16.0.1".parse().unwrap(), Protocol::Nfs3),
            Access::None
        );
        assert_eq!(
            decide(&[], "10.0.0.5".parse().unwrap(), Protocol::Nfs3),
            Access::None
        );
    }

    #[test]
    fn duplicate_index_rejected() {
        let r = ExportRule::read_only(1, "10.0.0.1".parse().unwrap());
        assert!(matches!(
            normalize_rules(vec![r.clone(), r]),
            Err(NfsError::InvalidRule(_))
        ));
    }

    #[test]
    fn rule_json_shape() {
        let r: ExportRule = serde_json::from_str(r#"{"index":1,"client":"10.0.0.0/8","access":"rw","protocols":["nfs3"],"superuser":true}"#).unwrap();
        assert_eq!(r.access, Access::Rw);
        assert_eq!(r.protocols, vec![Protocol::Nfs3]);
        let r: ExportRule = serde_json::from_str(r#"{"index":1,"client":"10.0.0.1"}"#).unwrap();
        assert_eq!(r, ExportRule::read_only(1, "10.0.0.1".parse().unwrap()));
        assert!(serde_json::from_str::<ExportRule>(r#"{"index":1,"client":"nope"}"#).is_err());
    }

    #[test]
    fn export_names_validated() {
        validate_export_name("/images/ubuntu-22.04").unwrap();
        for bad in [
            "images", "/", "/a/../b", "/a b", "/a\"b", "/a;b", "/a/", "/a//b", "/a{b", "/a\nb",
        ] {
            assert!(validate_export_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn config_backend_checked() {
        let mut c = NfsConfig::default();
        c.validate().unwrap();
        c.backend = "samba".into();
        assert!(c.validate().unwrap_err().to_string().contains("samba"));
    }
}
