//! The `[store]` config section: which engine keeps the objects (`embedded`: redb in
//! the state directory, the default; `etcd`: a cluster shared by several appliances)
//! and how to reach etcd (`[store.etcd]`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The store's engine.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// redb in `<state_dir>/store.redb`: one appliance.
    #[default]
    Embedded,
    /// An etcd v3 cluster (`[store.etcd]`): several appliances, one leader per
    /// controller group.
    Etcd,
}

/// `[store]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    pub backend: BackendKind,
    /// The keys Secrets and BMCSecrets are encrypted with at rest (default
    /// `<state_dir>/secrets.key`, created on first start); see [`super::seal`].
    /// With etcd: once the cluster has a keyring (`bootplane store keygen`), the keys
    /// come from it instead (`etcd::keyring`); before, every appliance needs
    /// the same file.
    pub encryption_key_file: Option<PathBuf>,
    pub etcd: EtcdConfig,
}

/// The key file's name in the state directory when `encryption_key_file` is unset.
pub(crate) const DEFAULT_KEY_FILE: &str = "secrets.key";

/// `[store.etcd]`: the cluster, this appliance's name in it, and the timings of the
/// leader elections and requests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the members, any order: all `https://`, or all `http://` on a
    /// loopback address (or anywhere with `allow_plaintext`).
    pub endpoints: Vec<String>,
    /// Accept `http://` endpoints that are not on a loopback address. Whoever can read
    /// or write the path to etcd then reads every object and can write any (see
    /// docs/cluster.md): for a lab or a network namespace, not for production.
    pub allow_plaintext: bool,
    /// Every key bootplane writes starts with this (several installations may share
    /// one cluster under different prefixes). Starts and ends with `/`.
    pub prefix: String,
    /// CA bundle (PEM) that signed the members' certificates (https endpoints).
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) when the members require one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// This appliance's name in leader elections and lease records (default: the
    /// host name).
    pub name: Option<String>,
    /// Connecting to a member gives up after this long.
    pub dial_timeout_ms: u64,
    /// A request (a transaction, a range) gives up after this long: the API answers 503.
    pub request_timeout_ms: u64,
    /// The election lease: a leader that cannot renew it for this long loses
    /// leadership and stops its controllers (its writes are fenced on the lease).
    pub lease_ttl_secs: u64,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            allow_plaintext: false,
            prefix: "/bootplane/".into(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            name: None,
            dial_timeout_ms: 2_000,
            request_timeout_ms: 5_000,
            lease_ttl_secs: 10,
        }
    }
}

/// The error of `backend = "etcd"` in a build without the `etcd` cargo feature.
pub(crate) fn without_etcd() -> anyhow::Error {
    anyhow::anyhow!(
        "store.backend = \"etcd\": this bootplane was built without the etcd feature (cargo build --features etcd)"
    )
}

impl StoreConfig {
    /// The encryption key file: configured, else `<state_dir>/secrets.key`.
    pub fn key_file(&self, state_dir: &std::path::Path) -> PathBuf {
        self.encryption_key_file
            .clone()
            .unwrap_or_else(|| state_dir.join(DEFAULT_KEY_FILE))
    }

    /// Semantic checks that TOML typing cannot express.
    pub fn validate(&self) -> Result<()> {
        if self.backend == BackendKind::Etcd {
            if !cfg!(feature = "etcd") {
                return Err(without_etcd());
            }
            self.etcd.validate()?;
        }
        Ok(())
    }
}

impl EtcdConfig {
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            bail!("store.etcd.endpoints must name at least one member");
        }
        let (mut tls, mut plain) = (false, false);
        for e in &self.endpoints {
            match e.split_once("://") {
                Some(("http", rest)) if !rest.is_empty() => {
                    plain = true;
                    if !self.allow_plaintext && !loopback_host(rest) {
                        bail!(
                            "store.etcd.endpoints: {e:?} is plain http:// on an address that is not loopback: whoever is on the path reads every object and can write an admin token; use https:// (with ca_file and a client certificate), or set store.etcd.allow_plaintext = true for a lab"
                        );
                    }
                }
                Some(("https", rest)) if !rest.is_empty() => tls = true,
                _ => bail!("store.etcd.endpoints: {e:?} is not an http:// or https:// URL"),
            }
        }
        if tls && plain {
            bail!(
                "store.etcd.endpoints mixes http:// and https:// members: a request may go to either, so the cluster is only as private as its plaintext member; use one scheme"
            );
        }
        if tls && self.ca_file.is_none() {
            bail!("store.etcd.ca_file is required for https:// endpoints");
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            bail!("store.etcd.cert_file and store.etcd.key_file go together");
        }
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') || self.prefix.len() < 2 {
            bail!(
                "store.etcd.prefix {:?} must start and end with '/' and name something",
                self.prefix
            );
        }
        if self.request_timeout_ms == 0 || self.dial_timeout_ms == 0 {
            bail!("store.etcd.request_timeout_ms and dial_timeout_ms must be at least 1");
        }
        if !(2..=300).contains(&self.lease_ttl_secs) {
            bail!("store.etcd.lease_ttl_secs must be between 2 and 300");
        }
        if let Some(n) = &self.name {
            if n.is_empty()
                || n.len() > 63
                || !n
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
            {
                bail!("store.etcd.name {n:?} must be 1-63 characters of [A-Za-z0-9-._]");
            }
        }
        Ok(())
    }

    /// This appliance's name: configured, else the host name.
    pub fn member_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "bootplane".into())
        })
    }
}

/// Whether an endpoint's `host[:port][/path]` names a loopback address (`127.0.0.0/8`,
/// `[::1]` or `localhost`).
fn loopback_host(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        let mut c = StoreConfig::default();
        c.validate().unwrap();
        c.backend = BackendKind::Etcd;
        if cfg!(feature = "etcd") {
            c.validate().unwrap();
        } else {
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("without the etcd feature"), "{err}");
        }
        let bad = |f: fn(&mut EtcdConfig), says: &str| {
            let mut e = EtcdConfig::default();
            f(&mut e);
            let err = e.validate().unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        };
        bad(|e| e.endpoints.clear(), "endpoints");
        bad(
            |e| e.endpoints = vec!["127.0.0.1:2379".into()],
            "not an http",
        );
        bad(|e| e.endpoints = vec!["https://a:2379".into()], "ca_file");
        bad(|e| e.cert_file = Some("c".into()), "key_file");
        bad(|e| e.prefix = "bootplane".into(), "prefix");
        bad(|e| e.lease_ttl_secs = 1, "lease_ttl_secs");
        bad(|e| e.name = Some("a b".into()), "name");
        // Plain http only on loopback, unless allowed; never mixed with https.
        bad(
            |e| e.endpoints = vec!["http://10.0.0.11:2379".into()],
            "allow_plaintext",
        );
        bad(
            |e| e.endpoints = vec!["http://etcd.example:2379".into()],
            "not loopback",
        );
        bad(
            |e| {
                e.ca_file = Some("ca.pem".into());
                e.endpoints = vec![
                    "https://10.0.0.11:2379".into(),
                    "http://127.0.0.1:2379".into(),
                ];
            },
            "mixes http:// and https://",
        );
        bad(
            |e| {
                e.allow_plaintext = true;
                e.ca_file = Some("ca.pem".into());
                e.endpoints = vec![
                    "http://10.0.0.12:2379".into(),
                    "https://10.0.0.11:2379".into(),
                ];
            },
            "mixes",
        );
        for ok in [
            "http://127.0.0.1:2379",
            "http://127.0.0.2",
            "http://[::1]:2379",
            "http://localhost:2379/",
        ] {
            let e = EtcdConfig {
                endpoints: vec![ok.into()],
                ..EtcdConfig::default()
            };
            e.validate().unwrap_or_else(|err| panic!("{ok}: {err}"));
        }
        let e = EtcdConfig {
            endpoints: vec![
                "http://10.0.0.11:2379".into(),
                "http://10.0.0.12:2379".into(),
            ],
            allow_plaintext: true,
            ..EtcdConfig::default()
        };
        e.validate().unwrap();
    }
}
